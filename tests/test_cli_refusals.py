"""One-line refusals (exit 2, no traceback) for inputs that used to pass silently or end in a traceback."""

from __future__ import annotations

import pytest

from conftest import refused
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, predict_analytic


@pytest.fixture(scope="module")
def q7(tmp_path_factory):
    path = tmp_path_factory.mktemp("refusals") / "q7.json"
    predict_analytic(resolve_model("qwen2.5-7b").spec, "h100", layout=Layout(gpus=8)).save(path)
    return str(path)


def test_hardware_output_that_cannot_be_written_is_refused_before_probing():
    refused("hardware", "--no-bench", "-o", "/proc/throughputlab-x.json", fragments=("--output", "not writable"))


def test_decide_lists_with_an_empty_item(q7):
    refused("decide", "--profile", q7, "--prompts", "64,,128", fragments=("--prompts", "comma-separated"))


def test_decide_log_flags_without_a_log_name_the_flag(q7):
    refused("decide", "--profile", q7, "--prompts", "64", "--against-prompts", "64",
            fragments=("--against-prompts", "only with a run log"))


def test_more_gpus_on_a_node_than_the_part_has(q7):
    refused("decide", "--profile", q7, "--prompts", "64", "--gpus", "16", "--nodes", "1",
            fragments=("H100 SXM node holds at most 8", "--nodes 2"))


def test_a_kv_cache_larger_than_the_device(q7):
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--kv-cache-gib", "10000",
            fragments=("--kv-cache-gib 10000", "besides its weights"))
    refused("decide", "--profile", q7, "--prompts", "64", "--kv-cache-gib", "10000", fragments=("--kv-cache-gib",))


def test_a_response_dist_key_given_twice(q7):
    refused("decide", "--profile", q7, "--prompts", "64", "--response-dist", "fixed:len=5,len=6",
            fragments=("len given twice",))


def test_megatron_sizes_that_do_not_divide_the_training_gpus(q7):
    refused("decide", "--profile", q7, "--prompts", "64", "--train-backend", "megatron", "--train-tp", "3",
            fragments=("--train-tp 3 x --train-pp 1 does not divide the 8 training GPU(s)",))
