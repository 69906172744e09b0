"""Every file a command reads, given empty, binary, cut short or of the wrong shape: exit code 2,
one line on stderr that names the file, and nothing printed before it (validation first).

The matrix runs in-process (click's CliRunner isolation around the real entry point, so the
one-line printing and the exit code are the CLI's own); a few cases run as a user would, in a
fresh process. A case that got past validation would start a benchmark: that is stubbed out.
"""

from __future__ import annotations

import logging
import signal
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import assert_user_error, run_cli
from throughputlab.cli import main

DATA = Path(__file__).parent / "data" / "imports"
BINARY = b"\xff\xfe\x00{\x89PNG"
HIDDEN_BY_DEFAULT = (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning)


def invoke(*args: str) -> tuple[int, str, str]:
    """``main(args)`` with stdout and stderr captured: (exit code, stdout, stderr). Log records and
    warnings a user would see are written to stderr, as in the real CLI."""
    runner = CliRunner()
    old_term = signal.getsignal(signal.SIGTERM)
    root = logging.getLogger()
    with runner.isolation() as (out, err, _), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handler = logging.StreamHandler(sys.stderr)
        handler.setLevel(logging.WARNING)
        root.addHandler(handler)
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        finally:
            root.removeHandler(handler)
            signal.signal(signal.SIGTERM, old_term)
        shown = [w for w in caught if not issubclass(w.category, HIDDEN_BY_DEFAULT)]
        sys.stderr.write("".join(f"warning: {w.message}\n" for w in shown))
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


def check_one_line(code: int, out: str, err: str, name: str) -> None:
    lines = err.strip().splitlines()
    assert code == 2, (code, out, err)
    assert out == "", f"printed before the error: {out!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert name in lines[0], (name, lines[0])


@pytest.fixture(autouse=True)
def no_benchmark(monkeypatch):
    """A bad file that got through would start a sweep: fail at once instead."""
    import throughputlab.bench as bench

    def refuse(*a, **k):
        raise AssertionError("the command got past validation and started a benchmark")

    monkeypatch.setattr(bench, "run_bench", refuse)


@pytest.fixture(scope="module")
def good_profile(tmp_path_factory) -> str:
    """A predicted profile (no fit to run): the decide cases read it before their bad file."""
    from throughputlab.models import resolve_model
    from throughputlab.predict import predict_analytic

    path = tmp_path_factory.mktemp("good") / "good.json"
    predict_analytic(resolve_model("tiny").spec, "h200").save(path)
    return str(path)


def _half(path: Path) -> bytes:
    data = path.read_bytes()
    return data[: len(data) // 2]


# reader -> (file suffix, {kind: content}); a callable content gets the good profile's path
KINDS = {
    "spec-yaml": (".yaml", {"truncated": b"generation:\n  concurrency: [1, 2\n", "shape": b"- model\n- tiny\n",
                            "scalar": b"just a sentence\n"}),
    "spec-json": (".json", {"truncated": b'{"model": "tiny", "generation": {"prompt_len"', "shape": b"[1, 2]"}),
    "profile": (".json", {"truncated": lambda good: Path(good).read_bytes()[:3000], "shape": b"[1, 2]",
                          "other tool": (DATA / "guidellm_benchmarks.json").read_bytes()}),
    "lengths": (".txt", {"truncated": b"[120, 340, ", "shape": b'{"lengths": [1, 2]}'}),
    "curves": (".csv", {"truncated": b"run,batch_size,sam", "shape": b"foo,bar\n1,2\n"}),
    "runlog": (".jsonl", {"truncated": _half(DATA / "verl_metrics.jsonl"), "shape": b"[1, 2]"}),
    "vllm-bench": (".json", {"truncated": _half(DATA / "vllm_serve_c8.json"), "shape": b"[1, 2]"}),
    "guidellm": (".json", {"truncated": _half(DATA / "guidellm_benchmarks.json"), "shape": b'"benchmarks"'}),
    "sweep": (".csv", {"truncated": b"params,tok", "shape": b"foo,bar\n1,2\n"}),
    "config": ("", {"truncated": b'{"model_type": "llama", "hidden_size": 64,', "shape": b"[1]"}),
}
DECIDE = ["decide", "--profile", "{good}", "--prompts", "8"]
# command -> (reader, argv with {f} for the bad file)
COMMANDS = {
    "bench --spec yaml": ("spec-yaml", ["bench", "--spec", "{f}"]),
    "bench --spec json": ("spec-json", ["bench", "--spec", "{f}"]),
    "bench --resume": ("profile", ["bench", "--resume", "-o", "{f}"]),
    "bench --model": ("config", ["bench", "--model", "{f}", "-o", "{tmp}/out.json"]),
    "fit": ("profile", ["fit", "{f}"]),
    "report": ("profile", ["report", "{f}", "-o", "{tmp}/r.html"]),
    "export": ("profile", ["export", "{f}", "-o", "{tmp}/x.csv", "--what", "generation"]),
    "predict --profile": ("profile", ["predict", "--profile", "{f}"]),
    "predict --calibrate": ("profile", ["predict", "--model", "tiny", "--gpu", "h200", "--calibrate", "{f}"]),
    "predict --model": ("config", ["predict", "--model", "{f}", "--gpu", "h200"]),
    "decide --spec json": ("spec-json", ["decide", "--spec", "{f}"]),
    "decide --spec yaml": ("spec-yaml", ["decide", "--spec", "{f}"]),
    "decide --profile": ("profile", ["decide", "--profile", "{f}", "--prompts", "8,16"]),
    "decide --response-lengths": ("lengths", [*DECIDE, "--response-lengths", "{f}"]),
    "decide --curves": ("curves", ["decide", "--profile", "{good}", "--curves", "{f}", "--target", "0.5"]),
    "decide --against": ("runlog", [*DECIDE, "--against", "{f}"]),
    "decide --calibrate-from": ("runlog", [*DECIDE, "--calibrate-from", "{f}"]),
    "decide --against, bad --curves": ("curves", [*DECIDE, "--against", str(DATA / "verl_metrics.jsonl"),
                                                  "--curves", "{f}", "--target", "0.5"]),
    "import vllm-bench": ("vllm-bench", ["import", "vllm-bench", "{f}", "-m", "tiny", "--gpu", "h200",
                                         "-o", "{tmp}/i.json"]),
    "import guidellm": ("guidellm", ["import", "guidellm", "{f}", "-m", "tiny", "--gpu", "h200", "-o", "{tmp}/i.json"]),
    "import runlog": ("runlog", ["import", "runlog", "{f}"]),
    "lr fit": ("sweep", ["lr", "fit", "{f}"]),
}
def _cases():
    for command, (reader, _) in COMMANDS.items():
        for kind in ["empty", "binary", *KINDS[reader][1]]:
            yield pytest.param(command, kind, id=f"{command}-{kind}")


def _write(tmp_path: Path, reader: str, kind: str, good: str) -> tuple[Path, str]:
    """The bad file (for a model config: the folder holding it) and the name its error must show."""
    suffix, kinds = KINDS[reader]
    content = {"empty": b"", "binary": BINARY}.get(kind, kinds.get(kind))
    content = content(good) if callable(content) else content
    if reader == "config":
        folder = tmp_path / f"model-{kind.replace(' ', '-')}"
        folder.mkdir()
        (folder / "config.json").write_bytes(content)
        return folder, folder.name
    path = tmp_path / f"bad-{kind.replace(' ', '-')}{suffix}"
    path.write_bytes(content)
    return path, path.name


@pytest.mark.parametrize("command,kind", list(_cases()))
def test_bad_file_is_one_line_before_any_output(tmp_path, good_profile, command, kind):
    reader, argv = COMMANDS[command]
    path, name = _write(tmp_path, reader, kind, good_profile)
    args = [a.format(f=path, good=good_profile, tmp=tmp_path) for a in argv]
    check_one_line(*invoke(*args), name)


def test_comments_only_spec_is_no_setting_but_whitespace_is_an_empty_file(tmp_path):
    from throughputlab.errors import UserError
    from throughputlab.files import read_settings

    (tmp_path / "c.yaml").write_text("# nothing set yet\n")
    assert read_settings(tmp_path / "c.yaml", "a spec", yaml=True) == {}
    (tmp_path / "w.yaml").write_text("  \n\n")
    with pytest.raises(UserError, match="empty file"):
        read_settings(tmp_path / "w.yaml", "a spec", yaml=True)


def test_good_files_read_as_before(tmp_path):
    """A byte-order mark and CRLF line ends are read as Path.read_text read them."""
    from throughputlab.files import read_csv, read_json, read_text

    (tmp_path / "a.json").write_bytes(b'\xef\xbb\xbf{"a": [1, 2]}\r\n')
    assert read_json(tmp_path / "a.json", "x") == {"a": [1, 2]}
    (tmp_path / "b.txt").write_bytes(b"1\r\n2\r\n")
    assert read_text(tmp_path / "b.txt", "x") == "1\n2\n"
    (tmp_path / "c.csv").write_bytes(b"\xef\xbb\xbfrun,batch\r\na,8\r\n")
    assert list(read_csv(tmp_path / "c.csv", "x").columns) == ["run", "batch"]


# ---------------------------------------------------------------- as a user runs it


@pytest.mark.slow
def test_bench_spec_binary_in_a_fresh_process(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(BINARY)
    r = run_cli("bench", "--spec", str(spec), "-o", str(tmp_path / "o.json"))
    assert_user_error(r, str(spec), "not utf-8")
    assert r.stdout == "" and not (tmp_path / "o.json").exists()


@pytest.mark.slow
def test_empty_run_log_in_a_fresh_process(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n")
    r = run_cli("import", "runlog", str(log))
    assert_user_error(r, str(log), "empty file")
    assert r.stdout == ""


@pytest.mark.slow
def test_bad_model_config_before_the_bench_header_in_a_fresh_process(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("")
    r = run_cli("bench", "--model", str(tmp_path / "m"), "-o", str(tmp_path / "o.json"))
    assert_user_error(r, "config.json", "empty file")
    assert r.stdout == "", r.stdout
