"""What a user sees around a run: a one-line error for a profile that is not text, and no library
deprecation notices in the bench output."""

import warnings

import pytest

from conftest import assert_user_error, run_cli

FAST_GEN = ["--model", "tiny", "--only", "gen", "--prompt-len", "8", "--output-len", "4", "--repeats", "2",
            "--rounds", "1", "--warmup", "1", "--no-telemetry", "-c", "1,2"]
# The notice transformers 5.24+ gives at every forward that passes the cache as `past_key_values`.
RENAME_NOTICE = ("`past_key_values` is deprecated and will be removed in version 5.40.0 for "
                 "`LlamaForCausalLM.forward`. Use `cache` instead.")


@pytest.mark.slow
def test_export_of_a_binary_file_is_a_user_error(tmp_path):
    bad = tmp_path / "not-text.json"
    bad.write_bytes(b"\xff\xfe\x00{\x89PNG")
    r = run_cli("export", str(bad))
    assert_user_error(r, str(bad), "utf-8")
    assert not list(tmp_path.glob("*.csv"))


@pytest.mark.slow
def test_bench_output_has_no_transformers_deprecations(tmp_path):
    r = run_cli("bench", *FAST_GEN, "-o", str(tmp_path / "p.json"))
    assert r.returncode == 0, r.stderr
    assert "FutureWarning" not in r.stderr and "past_key_values" not in r.stderr, r.stderr
    assert "generation" in r.stdout


@pytest.fixture(scope="module")
def hf_backend():
    pytest.importorskip("transformers")
    from throughputlab.backends.hf_gen import HFGenerationBackend
    from throughputlab.models import resolve_model

    b = HFGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu", max_concurrency=2, max_len=12,
                            engine_args={"overhead_probe": False})
    b.start()
    yield b
    b.close()


def _warn_on_forward(model, message):
    return model.register_forward_pre_hook(lambda module, args: warnings.warn(message, FutureWarning, stacklevel=2))


@pytest.mark.slow
def test_decode_silences_only_the_cache_rename_notice(hf_backend):
    # Whatever transformers is installed, the model's forward gives the 5.24 notice here.
    handle = _warn_on_forward(hf_backend.model, RENAME_NOTICE)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning that gets through fails the run
            sample = hf_backend.run(2, 8, 4)
        assert sample.output_tokens == 8
    finally:
        handle.remove()

    handle = _warn_on_forward(hf_backend.model, "`use_cache` is deprecated")
    try:
        with pytest.warns(FutureWarning, match="use_cache"):  # other notices still reach the user
            hf_backend.run(1, 8, 4)
    finally:
        handle.remove()
