"""One settings system for bench, predict and decide: the layered resolver over any model, one
spec-file reader, --set and --print-spec on each command, flags and their help from the model,
and one-line errors that name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest
import yaml
from pydantic import model_validator

from conftest import cli_stdout, refused
from throughputlab.errors import UserError
from throughputlab.records.base import Record
from throughputlab.settings import Layer, Settings, as_layer, parse_set, read_spec_file

OLD = Path(__file__).resolve().parent.parent / "reports" / "cpu-amd-epyc-2026-11-29" / "demo-profile.json"
ANALYTIC = ("predict", "--model", "tiny", "--gpu", "h200", "-c", "1,8", "-b", "1,2")


invoke = cli_stdout


# ---------------------------------------------------------------- the resolver, on any model


class Part(Record):
    path: str  # required: another layer may give it
    size: int = 1


class Section(Record):
    lo: int = 0
    hi: int = 10

    @model_validator(mode="after")
    def _ordered(self):
        if self.lo > self.hi:
            raise ValueError("lo must not exceed hi")
        return self


class Toy(Record):
    name: str = "a"
    part: Optional[Part] = None
    span: Section = Section()


TOY = Settings(Toy, "toy")


def test_later_layers_win_and_a_layer_may_replace_a_section():
    spec = TOY.resolve([Layer("--spec f", {"part": {"path": "x", "size": 3}, "span": {"lo": 2}}),
                        as_layer("options", {"name": "b"}), parse_set("span.hi=5")])
    assert (spec.name, spec.part.size, spec.span.lo, spec.span.hi) == ("b", 3, 2, 5)
    dropped = TOY.resolve([Layer("--spec f", {"part": {"path": "x", "size": 3}}),
                           as_layer("options", {"part.path": "y"}, drops=("part",))])
    assert dropped.part == Part(path="y")  # the file's size went with its section


def test_a_key_or_check_that_needs_another_layer_waits_for_the_merge():
    # the flag gives a key of a section whose required path is in the file; the check across keys sees both
    spec = TOY.resolve([Layer("--spec f", {"part": {"path": "x"}, "span": {"hi": 1}}),
                        as_layer("options", {"part.size": 4, "span.lo": 1}, {"part.size": "--size", "span.lo": "--lo"})])
    assert spec.part.size == 4 and spec.span.lo == 1
    with pytest.raises(UserError) as e:  # the check fails in the merge: named after the layer that set it
        TOY.resolve([Layer("--spec f", {"span": {"hi": 1}}), as_layer("options", {"span.lo": 3}, {"span.lo": "--lo"})])
    assert str(e.value) == "--lo: span: lo must not exceed hi"
    with pytest.raises(UserError, match="^--spec f: part.path: field required"):
        TOY.resolve([Layer("--spec f", {"part": {"size": 2}})])


def test_unknown_keys_suggest_the_close_ones_and_bad_values_name_key_and_type():
    with pytest.raises(UserError, match=r"^--set span.high=3: unknown key span.high; did you mean span.hi\?$"):
        TOY.resolve([parse_set("span.high=3")])
    with pytest.raises(UserError, match="`throughputlab toy --print-spec` shows every key"):
        TOY.resolve([parse_set("zzz=3")])
    with pytest.raises(UserError) as e:
        TOY.resolve([as_layer("options", {"span.lo": "low"}, {"span.lo": "--lo"})])
    assert str(e.value) == ("--lo: span.lo: input should be a valid integer, unable to parse string as an "
                            "integer (got 'low')")


@pytest.mark.parametrize("name,text", [("s.json", '{"span": {"lo": 2}}'), ("s.yaml", "span:\n  lo: 2\n"),
                                       ("s.yml", "span: {lo: 2}\n"), ("spec", "span:\n  lo: 2\n")])
def test_one_reader_the_suffix_decides(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert TOY.resolve([read_spec_file(tmp_path / name, "toy")]).span.lo == 2


def test_a_file_without_suffix_is_yaml_for_every_command(tmp_path, predicted):
    spec = tmp_path / "spec"
    spec.write_text("# no suffix: YAML\nmodel: tiny\n")
    assert "model: tiny" in invoke("bench", "--spec", str(spec), "--print-spec")
    spec.write_text("model: tiny\ngpu: h200\n")
    assert "gpu: h200" in invoke("predict", "--spec", str(spec), "--print-spec")
    spec.write_text(f"profile: {predicted}\nprompts: [8]\n")
    assert "prompts: [8]" in invoke("decide", "--spec", str(spec), "--print-spec")
    spec.write_text('{"model": "tiny", "gpu": "h200"}')  # JSON is YAML too
    assert "gpu: h200" in invoke("predict", "--spec", str(spec), "--print-spec")


# ---------------------------------------------------------------- predict


def test_predict_print_spec_fed_back_gives_the_same_prediction(tmp_path):
    printed = invoke(*ANALYTIC, "--tp", "1", "--set", "generation.prompt_len=256", "--print-spec")
    data = yaml.safe_load(printed)
    assert data["model"] == "tiny" and data["generation"]["concurrency"] == [1, 8]
    assert data["generation"]["prompt_len"] == 256 and data["layout"]["tp"] == 1
    (tmp_path / "p.yaml").write_text(printed)
    direct = invoke(*ANALYTIC, "--prompt-len", "256")
    assert "generation, prompt 256" in direct
    assert invoke("predict", "--spec", str(tmp_path / "p.yaml")) == direct
    assert invoke("predict", "--spec", str(tmp_path / "p.yaml"), "--print-spec") == printed


def test_predict_layers_flags_over_file_and_set_over_flags(tmp_path):
    (tmp_path / "p.yaml").write_text("model: tiny\ngpu: h200\ngeneration:\n  prompt_len: 64\n  output_len: 32\n")
    out = yaml.safe_load(invoke("predict", "--spec", str(tmp_path / "p.yaml"), "--prompt-len", "128",
                                "--set", "generation.prompt_len=512", "--engine", "sglang", "--print-spec"))
    assert out["generation"] == {"concurrency": [1, 2, 4, 8, 16, 32, 64, 128, 256, 512], "prompt_len": 512,
                                 "output_len": 32}
    assert out["engine"]["engine"] == "sglang"


@pytest.mark.parametrize("args,fragments", [
    (("--set", "layout.tpp=2"), ["--set layout.tpp=2: unknown key layout.tpp; did you mean layout.tp?"]),
    (("--set", "layout.tp=two"), ["--set layout.tp=two:", "valid integer", "'two'"]),
    (("--tp", "0"), ["--tp: layout.tp: input should be greater than 0 (got 0)"]),
    (("--set", "generation"), ["--set expects KEY=VALUE"]),
    (("--set", "generation.concurrency=[]"), ["generation.concurrency", "at least 1 item"]),
])
def test_predict_bad_settings_are_one_line_errors(args, fragments):
    refused(*ANALYTIC, *args, fragments=fragments)


# ---------------------------------------------------------------- decide


@pytest.fixture(scope="module")
def predicted(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("decide") / "tiny-h200.json"
    invoke("predict", "--model", "tiny", "--gpu", "h200", "-o", str(path))
    return str(path)


DECIDE = ("--prompts", "8,16", "--response-dist", "fixed:len=64", "--max-num-seqs", "64")


def test_decide_print_spec_fed_back_gives_the_same_decision(tmp_path, predicted):
    printed = invoke("decide", "--profile", predicted, *DECIDE, "--set", "group=4", "--print-spec")
    data = yaml.safe_load(printed)
    assert data["group"] == 4 and data["prompts"] == [8, 16] and data["shape"]["engine"]["max_num_seqs"] == 64
    assert data["shape"]["response"]["dist"] == "fixed:len=64"
    (tmp_path / "d.yaml").write_text(printed)
    direct = invoke("decide", "--profile", predicted, *DECIDE, "--group", "4")
    assert "batch" in direct
    assert invoke("decide", "--spec", str(tmp_path / "d.yaml")) == direct


def test_decide_section_flags_replace_what_the_file_gave(tmp_path, predicted):
    (tmp_path / "d.yaml").write_text("shape:\n  response:\n    dist: fixed:len=64\n    max_tokens: 100\n"
                                     "samples:\n  nstar: flat\n")
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("10\n20\n")
    out = yaml.safe_load(invoke("decide", "--spec", str(tmp_path / "d.yaml"), "--profile", predicted,
                                "--response-lengths", str(lengths), "--curves", "c.csv", "--column", "metric=reward",
                                "--print-spec"))
    assert out["shape"]["response"] == {"dist": None, "file": str(lengths), "max_tokens": None}
    assert out["samples"]["nstar"] is None and out["samples"]["curves"]["path"] == "c.csv"
    assert out["samples"]["curves"]["columns"]["metric"] == "reward"


@pytest.mark.parametrize("args,fragments", [
    (("--set", "shape.engine.max_num_seq=3"), ["unknown key shape.engine.max_num_seq",
                                                "did you mean shape.engine.max_num_seqs?"]),
    (("--set", "group=many"), ["--set group=many:", "valid integer", "'many'"]),
    (("--max-num-seqs", "0"), ["--max-num-seqs: shape.engine.max_num_seqs: input should be greater than 0"]),
    (("--set", "cluster.gen_gpus=2"), ["--set cluster.gen_gpus=2: cluster: gen_gpus (--gen-gpus) goes with "
                                       "--placement split"]),
])
def test_decide_bad_settings_are_one_line_errors(predicted, args, fragments):
    refused("decide", "--profile", predicted, "--prompts", "8", *args, fragments=fragments)


# ---------------------------------------------------------------- flags from the model


def test_flags_show_their_key_and_the_models_default():
    def shown(*args):
        return " ".join(invoke(*args, "--help").split())

    assert "[layout.tp; default: 1]" in shown("predict")
    assert "Concurrencies to predict. [generation.concurrency; default: 1,2,4,8,16,32,64,128,256,512]" in shown("predict")
    assert "[group; default: 8]" in shown("decide") and "[cluster.nodes; default: 1]" in shown("decide")
    assert "[shape.prompt_len; default: 512]" in shown("decide")
    text = shown("bench")
    assert "[distributed.nproc_per_node; default: 1]" in text and "[measurement.rounds; default: 3]" in text
    for command in ("bench", "predict", "decide"):
        assert "--print-spec" in shown(command) and "--set KEY=VALUE" in shown(command)


# ---------------------------------------------------------------- bench: the ranks in the tree


def test_bench_resume_takes_the_ranks_from_the_stored_spec(tmp_path):
    from throughputlab.records.profile import Profile
    from throughputlab.spec import resolve

    p = Profile.load(OLD)
    p.spec = resolve([parse_set("only=train"), parse_set("distributed.nproc_per_node=2"),
                      parse_set("distributed.activation_checkpointing=true")])
    p.save(tmp_path / "p.json")
    out = yaml.safe_load(invoke("bench", "--resume", "-o", str(tmp_path / "p.json"), "--print-spec"))
    assert out["distributed"]["nproc_per_node"] == 2 and out["distributed"]["activation_checkpointing"] is True
    assert out["only"] == "train"
    again = yaml.safe_load(invoke("bench", "-m", "tiny", "--only", "train", "--nproc-per-node", "4",
                                  "--no-collectives", "--print-spec"))
    assert again["distributed"]["nproc_per_node"] == 4 and again["distributed"]["collectives"] is False
