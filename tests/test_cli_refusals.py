"""One-line refusals (exit 2, no traceback) for inputs that used to pass silently or end in a traceback."""

from __future__ import annotations

import pytest

from conftest import refused, run_main
from throughputlab.models import resolve_model
from throughputlab.predict import predict_analytic


def test_hardware_output_that_cannot_be_written_is_refused_before_probing():
    refused("hardware", "--no-bench", "-o", "/proc/throughputlab-x.json", fragments=("--output", "not writable"))


def test_decide_lists_with_an_empty_item(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64,,128", fragments=("--prompts", "comma-separated"))


def test_decide_log_flags_without_a_log_name_the_flag(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--against-prompts", "64",
            fragments=("--against-prompts", "only with a run log"))


def test_more_gpus_on_a_node_than_the_part_has(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--gpus", "16", "--nodes", "1",
            fragments=("H100 SXM node holds at most 8", "--nodes 2"))


def test_a_kv_cache_larger_than_the_device(q7_8xh100):
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--kv-cache-gib", "10000",
            fragments=("--kv-cache-gib 10000", "besides its weights"))
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--kv-cache-gib", "10000", fragments=("--kv-cache-gib",))


def test_a_response_dist_key_given_twice(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--response-dist", "fixed:len=5,len=6",
            fragments=("len given twice",))


def test_megatron_sizes_that_do_not_divide_the_training_gpus(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--train-backend", "megatron", "--train-tp", "3",
            fragments=("--train-tp 3 x --train-pp 1 does not divide the 8 training GPU(s)",))


def test_requests_longer_than_the_engines_context(q7_8xh100):
    refused("decide", "--profile", q7_8xh100, "--prompts", "64", "--max-model-len", "1000",
            fragments=("--max-model-len 1000 is below the prompt (512) plus the longest response (2048)",))
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--prompt-len", "200000",
            fragments=("exceed llama3.1-8b's max_position_embeddings (131072)",))


def test_a_model_whose_weights_leave_no_kv_cache_says_so_instead_of_a_table():
    from conftest import run_main

    r = run_main("predict", "--model", "llama3.1-70b", "--gpu", "l4", "-c", "1,8")
    assert r.exit_code == 0, r.output
    assert "generation: none; the weights leave no KV cache" in r.output and "knee at" not in r.output


def test_the_bare_command_prints_its_help():
    from conftest import run_main

    r = run_main()
    assert r.exit_code == 0 and r.output.startswith("Usage: throughputlab") and "Commands:" in r.output


def test_a_profile_with_a_non_positive_concurrency_is_malformed(tmp_path, q7_8xh100):
    import json

    d = json.loads(open(q7_8xh100).read())
    d["generation"][0]["concurrency"] = -3
    bad = tmp_path / "neg.json"
    bad.write_text(json.dumps(d))
    refused("fit", str(bad), fragments=("malformed at generation.0.concurrency",))


def test_a_rendezvous_endpoint_without_a_port_and_conflicting_fit_flags(q7_8xh100, tmp_path):
    refused("bench", "-m", "tiny", "--only", "train", "--nnodes", "2", "--rdzv-endpoint", "notahostport",
            fragments=("--rdzv-endpoint", "HOST:PORT"))
    refused("fit", q7_8xh100, "--no-save", "-o", str(tmp_path / "f.json"), fragments=("--no-save", "--output"))
    assert not (tmp_path / "f.json").exists()


def test_endpoint_flags_without_the_openai_backend():
    refused("bench", "-m", "tiny", "--url", "http://localhost:1", fragments=("--url goes with --backend openai",))
    refused("bench", "-m", "tiny", "--only", "gen", "--served-model", "foo",
            fragments=("--served-model goes with --backend openai",))


def test_an_import_at_a_tensor_parallel_size_the_heads_do_not_allow(tmp_path):
    from pathlib import Path

    data = Path(__file__).parent / "data" / "imports" / "guidellm_benchmarks.json"
    refused("import", "guidellm", str(data), "--model", "llama3.1-8b", "--gpu", "h100", "--tp", "3",
            "-o", str(tmp_path / "g.json"), fragments=("--tp 3 does not divide llama3.1-8b's 32 attention heads",))


@pytest.mark.parametrize("flag, value", [("--kv-cache-gib", "1e999"), ("--kv-cache-gib", "nan"),
                                         ("--gpu-memory-utilization", "nan"), ("--target", "inf")])
def test_decide_refuses_infinite_and_nan_settings_in_one_line(tmp_path, flag, value):
    prof = tmp_path / "p.json"
    predict_analytic(resolve_model("qwen2.5-0.5b").spec, "h100").save(prof)
    r = run_main("decide", "--profile", str(prof), "--prompts", "64,128", flag, value)
    out = r.output.strip()
    assert r.exit_code == 2 and len(out.splitlines()) == 1 and "Traceback" not in out, out
