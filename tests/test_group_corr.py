"""Response lengths correlated within a prompt's group (``group_corr``): the marginal law is kept,
the groups' correlation is what was asked, the busiest engine slows the step, observed lengths with
their prompts give it, and bad values are one-line errors."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import assert_user_error, run_cli
from throughputlab.decide.calculator import DecideSpec, decide_from_spec
from throughputlab.decide.lengths import group_corr_of, parse_length_dist, read_lengths_file
from throughputlab.errors import UserError

FORMS = ["lognormal:mean=800,sigma=0.6,max=4000", "capped:mean=3000,clip=0.3,max=4000",
         "capped:mean=1000,max=4000", "uniform:min=16,max=512"]


@pytest.mark.parametrize("form", FORMS)
def test_the_marginal_law_is_kept_and_the_groups_share_what_was_asked(form):
    independent = parse_length_dist(form)
    grouped = parse_length_dist(form + ",group_corr=0.6")
    a, b = independent.sample(64_000, 3), grouped.sample(64_000, 3, group=16)
    assert b.mean() == pytest.approx(a.mean(), rel=0.02)
    assert np.quantile(b, [0.1, 0.5, 0.9]) == pytest.approx(np.quantile(a, [0.1, 0.5, 0.9]), rel=0.05)
    assert (b == grouped.max_tokens).mean() == pytest.approx((a == independent.max_tokens).mean(), abs=0.01)
    prompts = np.repeat(np.arange(4_000), 16)
    assert group_corr_of(b, prompts) == pytest.approx(0.6, abs=0.04)
    assert group_corr_of(a, prompts) < 0.02


def test_no_correlation_or_one_response_per_prompt_draws_as_before():
    d = parse_length_dist("capped:mean=700,max=2048,group_corr=0.5")
    plain = parse_length_dist("capped:mean=700,max=2048")
    assert np.array_equal(plain.sample(5_000, 7, group=16), plain.sample(5_000, 7))
    assert np.array_equal(d.sample(5_000, 7, group=1), plain.sample(5_000, 7))
    assert not np.array_equal(d.sample(5_000, 7, group=16), plain.sample(5_000, 7))
    assert "share 50% of the log-length spread" in d.describe()


def _step(profile, dist):
    spec = DecideSpec.model_validate({"profile": profile, "prompts": [16], "group": 64,
                                      "shape": {"prompt_len": 256, "response": {"dist": dist}}})
    return decide_from_spec(spec)[0].rows[0].step


def test_correlated_groups_load_the_engines_unevenly_and_the_step_waits_for_the_busiest(q7_8xh100):
    base = "lognormal:mean=1500,sigma=0.5,max=4000"  # two prompts of 64 responses per engine
    free, tied = _step(q7_8xh100, base), _step(q7_8xh100, base + ",group_corr=0.6")
    assert free.engines == tied.engines == 8
    spread = lambda st: st.gen_s / st.gen_engine_mean_s  # noqa: E731
    assert spread(tied) > spread(free) + 0.05  # the busiest engine stands further above the mean
    assert tied.idle_share["all devices"] > free.idle_share["all devices"] + 0.05
    assert tied.gen_s > free.gen_s


def test_observed_lengths_with_their_prompts_give_the_correlation(tmp_path):
    rng = np.random.default_rng(0)
    prompt_scale = np.repeat(rng.normal(0, 0.5, 300), 8)
    lengths = np.rint(np.exp(6.5 + prompt_scale + rng.normal(0, 0.5, 2400))).astype(int) + 1
    path = tmp_path / "lengths.csv"
    path.write_text("uid,response_len\n" + "".join(f"p{i // 8},{n}\n" for i, n in enumerate(lengths)))
    d = read_lengths_file(path)
    assert d.group_corr == pytest.approx(0.5, abs=0.08)  # half the log variance is the prompt's
    assert "group_corr" in d.describe()
    single = tmp_path / "plain.csv"
    single.write_text("response_len\n" + "".join(f"{n}\n" for n in lengths))
    assert read_lengths_file(single).group_corr == 0.0


@pytest.mark.parametrize("value", ["-0.1", "1", "1.5", "nan", "x"])
def test_a_group_corr_outside_zero_to_one_is_refused(value):
    with pytest.raises(UserError, match="from 0 \\(independent\\) up to but not including 1"):
        parse_length_dist(f"lognormal:mean=800,sigma=0.6,group_corr={value}")


def test_fixed_lengths_take_no_group_corr():
    with pytest.raises(UserError, match="unknown key"):
        parse_length_dist("fixed:len=100,group_corr=0.5")


def test_the_cli_refuses_a_bad_group_corr_in_one_line(q7_8xh100):
    r = run_cli("decide", "--profile", q7_8xh100, "--prompts", "64", "--response-dist",
                "lognormal:mean=800,sigma=0.6,group_corr=2")
    assert_user_error(r, "group_corr", "up to but not including 1")
