"""Shared test setup: the quick tier; helpers to run the CLI as a user would."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Two cores: keep torch from oversubscribing when pytest runs beside an engine.
os.environ.setdefault("OMP_NUM_THREADS", "2")


TIERS_BEYOND_QUICK = ("slow", "vllm", "browser")


@pytest.fixture(scope="session")
def q7_8xh100(tmp_path_factory):
    """An analytic profile every decide test may read: Qwen2.5-7B on one node of 8 H100s, predict's defaults."""
    from throughputlab.models import resolve_model
    from throughputlab.predict import Layout, predict_analytic

    path = tmp_path_factory.mktemp("profiles") / "q7_8xh100.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=8)).save(path)
    return str(path)


def pytest_collection_modifyitems(config, items):
    # The quick tier (`pytest -m quick`): every test that no heavier tier claims.
    for item in items:
        if not any(name in item.keywords for name in TIERS_BEYOND_QUICK):
            item.add_marker(pytest.mark.quick)


def run_cli(*args: str, cwd=None, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """Run `python -m throughputlab ARGS` in a fresh process, exactly as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "throughputlab", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env=full_env)


def assert_user_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Exit code 2, one line on stderr naming the problem, no traceback."""
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert len(err.splitlines()) == 1, err
    for f in fragments:
        assert f.lower() in err.lower(), (f, err)


def run_main(*args: str):
    """``throughputlab ARGS`` in-process through the real entry point (CliRunner's isolation), so a
    user error is one line and exit code 2 as a user sees it: ``.exit_code`` and ``.output`` (stdout,
    then stderr)."""
    import signal
    from types import SimpleNamespace

    from click.testing import CliRunner

    from throughputlab.cli import main

    old_term, old_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with CliRunner().isolation() as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            signal.signal(signal.SIGTERM, old_term)
            signal.signal(signal.SIGINT, old_int)
        sys.stdout.flush()
        sys.stderr.flush()
        return SimpleNamespace(exit_code=code, output=out.getvalue().decode() + err.getvalue().decode())


def cli_stdout(*args: str) -> str:
    """stdout of a command that must succeed (CliRunner on the click group)."""
    from click.testing import CliRunner

    from throughputlab.cli import cli

    r = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert r.exit_code == 0, r.output
    return r.stdout


def refused(*args: str, fragments=()) -> str:
    """A user error: exit 2, one line, no traceback, naming each fragment; the line."""
    r = run_main(*args)
    line = r.output.strip()
    assert r.exit_code == 2 and "Traceback" not in r.output and len(line.splitlines()) == 1, r.output
    for f in fragments:
        assert f in line, (f, line)
    return line


def config_leaves(tree: dict, path: str = ""):
    """The dotted paths of a config tree's leaves (an empty section is a leaf)."""
    for k, v in tree.items():
        p = f"{path}.{k}" if path else str(k)
        if isinstance(v, dict) and v:
            yield from config_leaves(v, p)
        else:
            yield p
