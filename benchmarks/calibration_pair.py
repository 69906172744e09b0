"""A calibration taken at one batch size, checked on the same run at another: real TRL GRPO runs on this
host at several batch sizes, each calibrated on and checked against every other with `decide`.

    python -m pip install trl accelerate datasets     # not dependencies of throughputlab
    python benchmarks/calibration_pair.py [--batches 16,32,64] [--steps 6] [--vocab 8192] [--work DIR]

What it does, all on this machine:

1. writes a model folder: the `demo` preset's config (a 100M-parameter Llama shape; ``--vocab`` changes its
   vocabulary, a quarter of its parameters at the preset's 32,000), random weights, a word-level tokenizer;
2. `throughputlab bench` on that folder (prompt 16, output 32, training sequences of 48 tokens, micro-batches
   up to the largest batch: TRL trains each step's completions as one micro-batch here): the profile;
3. TRL's GRPOTrainer on that folder, once per batch (completions per step, 4 per prompt, `--steps` steps,
   responses capped at 32 tokens; TRL's own defaults otherwise: gradient checkpointing on, no reference
   model), each in its own process, writing its trainer_state.json (``step_time`` per step);
4. for every ordered pair (A, B): ``decide --profile P --config A.yaml --calibrate-from A/trainer_state.json
   --against B/trainer_state.json``, and prints B's logged median step beside the step the calibrated model
   gives at B's batch (the first step of each run, which holds the warm-up, is left out of the logs decide
   reads: steady_state.json beside each trainer_state.json).

The target: within 15%. TRL logs only the whole step, so one factor scales every phase; the check is
whether the model's phases scale with the batch as the run's do. Run it alone: the runs are timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

GROUP = 4
PROMPT_TOKENS = 16
RESPONSE_CAP = 32

TRAIN = textwrap.dedent('''
    import dataclasses, sys, yaml, torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    cfg, out, steps, prompt_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    conf = yaml.safe_load(open(cfg))
    model_dir = conf.pop("model_name_or_path")
    known = {f.name for f in dataclasses.fields(GRPOConfig)}
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.pad_token = "<unk>"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = [{"prompt": " ".join(f"w{3 + (i * 7 + j) % 500}" for j in range(prompt_tokens))} for i in range(4096)]
    args = GRPOConfig(output_dir=out, use_cpu=True, logging_steps=1, report_to=[], save_strategy="no",
                      max_steps=steps, seed=0, **{k: v for k, v in conf.items() if k in known})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.01 * len(c) for c in completions],
                          args=args, train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    trainer.state.save_to_json(out + "/trainer_state.json")
''')


def write_model(folder: Path, vocab: int | None = None) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM

    from throughputlab.models import resolve_model

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in resolve_model("demo").config.items() if not k.startswith("_")}
    cfg["vocab_size"] = vocab or cfg["vocab_size"]
    (folder / "config.json").write_text(json.dumps(cfg))
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, cfg["vocab_size"])}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": cfg["max_position_embeddings"]}))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder)).save_pretrained(folder)


def run(cmd: list[str], log: Path) -> float:
    t = time.perf_counter()
    with open(log, "w") as f:
        code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    if code:
        sys.exit(f"failed ({code}): {' '.join(cmd)}; see {log}")
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="16,32,64", help="completions per step, each a multiple of 4")
    ap.add_argument("--steps", type=int, default=6, help="TRL steps per run (the first is left out)")
    ap.add_argument("--work", type=Path, default=None, help="folder for the model, profile, configs and logs")
    ap.add_argument("--vocab", type=int, default=None, help="the model's vocabulary (default the demo preset's 32,000: "
                    "a quarter of its 100M parameters; 8192 gives the 5-10%% share of 7B-70B models)")
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        print(f"--batches: expected whole numbers separated by commas, got {args.batches!r}", file=sys.stderr)
        return 2
    if len(batches) < 2 or any(b < GROUP or b % GROUP for b in batches) or args.steps < 2:
        print(f"--batches: at least two, each a multiple of {GROUP}; --steps at least 2", file=sys.stderr)
        return 2
    try:
        import trl
    except ImportError:
        print("TRL is not installed: python -m pip install trl accelerate datasets", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="calibration-pair-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    if args.vocab is not None and args.vocab < 1024:
        print("--vocab: at least 1024 (the prompts use words 3-502)", file=sys.stderr)
        return 2
    write_model(model, args.vocab)
    import torch

    print(f"TRL {trl.__version__}, torch {torch.__version__}, {os.cpu_count()} CPUs; the demo preset's shape with a "
          f"vocabulary of {args.vocab or 32000}; work folder {work}")
    tl = [sys.executable, "-m", "throughputlab"]
    secs = run([*tl, "bench", "-m", str(model), "--prompt-len", str(PROMPT_TOKENS), "--output-len", str(RESPONSE_CAP),
                "--seq-len", str(PROMPT_TOKENS + RESPONSE_CAP), "-c", "1,2,4,8,16,32,64", "-b", ",".join(str(b) for b in sorted({1, 2, 4, 8, *batches})),
                "-o", str(work / "profile.json")], work / "bench.log")
    print(f"profile: throughputlab bench on the model folder, {secs:.0f} s")
    (work / "train.py").write_text(TRAIN)
    logged = {}
    for b in batches:
        cfg = work / f"grpo_{b}.yaml"
        cfg.write_text(f"model_name_or_path: {model}\nper_device_train_batch_size: {b}\ngradient_accumulation_steps: 1\n"
                       f"num_processes: 1\nnum_generations: {GROUP}\nmax_completion_length: {RESPONSE_CAP}\n"
                       "use_vllm: false\nbf16: false\n")
        secs = run([sys.executable, str(work / "train.py"), str(cfg), str(work / f"run{b}"), str(args.steps),
                    str(PROMPT_TOKENS)], work / f"run{b}.log")
        state = json.loads((work / f"run{b}" / "trainer_state.json").read_text())
        times = [h["step_time"] for h in state["log_history"] if "step_time" in h]
        logged[b] = statistics.median(times[1:])
        first = next(i for i, h in enumerate(state["log_history"]) if "step_time" in h)
        del state["log_history"][first]  # the warm-up step, out of the logs decide reads
        (work / f"run{b}" / "steady_state.json").write_text(json.dumps(state))
        print(f"TRL GRPO, {b} completions a step ({b // GROUP} prompts x {GROUP}): {secs:.0f} s; step_time "
              f"{', '.join(f'{t:.2f}' for t in times)} s; median of steps 2-{len(times)} {logged[b]:.2f} s")
    print("\ncalibrated on   checked on   factor   logged s   calibrated s   logged/calibrated")
    ratios = []
    for a in batches:
        for b in batches:
            if a == b:
                continue
            out = work / f"decide_{a}_{b}.json"
            run([*tl, "decide", "--profile", str(work / "profile.json"), "--config", str(work / f"grpo_{a}.yaml"),
                 "--prompt-len", str(PROMPT_TOKENS), "--calibrate-from", str(work / f"run{a}" / "steady_state.json"),
                 "--log-prompts", str(a // GROUP), "--against", str(work / f"run{b}" / "steady_state.json"),
                 "--against-prompts", str(b // GROUP), "--json", str(out)], work / f"decide_{a}_{b}.log")
            logs = json.loads(out.read_text())["run_logs"]
            fit = next(p for p in logs[0]["phases"] if p["phase"] == "step")
            check = next(p for p in logs[1]["phases"] if p["phase"] == "step")
            r = check["calibrated_ratio"]
            ratios.append(r)
            print(f"{a:>13}   {b:>10}   {fit['ratio']:>6.2f}   {check['logged']['median']:>8.2f}   "
                  f"{check['calibrated_s']:>12.2f}   {r:>17.3f}")
    inside = sum(abs(r - 1) <= 0.15 for r in ratios)
    print(f"\nwithin 15%: {inside} of {len(ratios)} pairs; logged/calibrated {min(ratios):.3f} to {max(ratios):.3f}, "
          f"median {statistics.median(ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
