"""`decide --config` over a tree of the frameworks' own launch configs, as a new user would feed them.

Runs ``throughputlab decide --config FILE --profile PROFILE`` on every launch script (``*.sh``) and every
recipe (``*.yaml`` with a ``grpo:`` or ``ppo:`` section or a ``defaults:`` line) under the folders given, one
process each, and tallies the outcomes: read and decided (exit 0), refused in one line (exit 2: the message is
grouped, so a refusal that is wrong shows up as a group), or anything else (a traceback, a timeout: a bug).
Point it at a checkout of veRL (``examples/``), verl-recipe, NeMo-RL (``examples/configs/``) or OpenRLHF
(``examples/scripts/``). The profile's model need not be the config's: decide warns and goes on.

    python benchmarks/config_sweep.py DIR [DIR ...] --profile PROFILE.json [--timeout 120] [--show 40]
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

_RECIPE = re.compile(r"^(grpo|ppo|defaults):", re.M)


def configs(root: Path) -> list[Path]:
    """The launch scripts and RL recipes under ``root``, sorted."""
    out = sorted(root.rglob("*.sh"))
    for p in sorted(root.rglob("*.yaml")):
        try:
            if _RECIPE.search(p.read_text(errors="replace")):
                out.append(p)
        except OSError:
            continue
    return out


def run_one(path: Path, profile: str, timeout: float) -> tuple[str, str]:
    """(outcome, message): 'decided', 'refused' (exit 2, its last line) or 'bug' (anything else)."""
    cmd = [sys.executable, "-m", "throughputlab", "decide", "--config", str(path), "--profile", profile]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "bug", f"timed out after {timeout:g} s"
    last = (r.stderr.strip().splitlines() or [""])[-1]
    if r.returncode == 0:
        return "decided", ""
    if r.returncode == 2 and last.startswith("error:") and "Traceback" not in r.stderr:
        return "refused", last
    return "bug", f"exit {r.returncode}: {last}"


def _group(message: str, path: Path) -> str:
    """A refusal with the file and its numbers taken out, so alike refusals fall together."""
    text = message.replace(str(path), "FILE")
    text = re.sub(r"'[^']*'", "'…'", text)
    return re.sub(r"\d+(\.\d+)?", "N", text)[:160]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path, help="folders to search for launch scripts and recipes")
    ap.add_argument("--profile", required=True, help="a profile JSON (throughputlab predict -o)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per config [120]")
    ap.add_argument("--show", type=int, default=40, help="refusal groups to list [40]")
    a = ap.parse_args(argv)
    for d in a.dirs:
        if not d.is_dir():
            print(f"error: {d} is not a folder", file=sys.stderr)
            return 2
    if not Path(a.profile).is_file():
        print(f"error: no profile at {a.profile}: write one with `throughputlab predict ... -o FILE`", file=sys.stderr)
        return 2
    paths = [p for d in a.dirs for p in configs(d)]
    if not paths:
        print("error: no launch scripts or RL recipes under " + ", ".join(map(str, a.dirs)), file=sys.stderr)
        return 2
    tally: collections.Counter = collections.Counter()
    groups: dict[str, list[str]] = collections.defaultdict(list)
    bugs = []
    for i, p in enumerate(paths, 1):
        outcome, msg = run_one(p, a.profile, a.timeout)
        tally[outcome] += 1
        if outcome == "refused":
            groups[_group(msg, p)].append(p.name)
        elif outcome == "bug":
            bugs.append(f"{p}: {msg}")
        print(f"\r{i}/{len(paths)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{len(paths)} configs under {', '.join(map(str, a.dirs))} (profile {a.profile})")
    print(f"  decided: {tally['decided']}, refused in one line (exit 2): {tally['refused']}, "
          f"other failures: {tally['bug']}")
    if groups:
        print("refusals, grouped (count, message with file and numbers taken out, first files):")
        for msg, names in sorted(groups.items(), key=lambda kv: -len(kv[1]))[: a.show]:
            print(f"  {len(names):4d}  {msg}\n        {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")
    for b in bugs:
        print(f"  FAILURE {b}")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
