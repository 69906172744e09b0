"""Batch-size lr rules: the pure functions and `throughputlab lr scale`."""

import math

import pytest

from throughputlab.cli import main
from throughputlab.errors import UserError
from throughputlab.lr.rules import scale_adam_sde, scale_lr


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    out = capsys.readouterr()
    return e.value.code, out.out, out.err


@pytest.mark.parametrize("lr,b0,b1", [(1e-6, 1024, 8192), (3e-4, 256, 64), (0.1, 7, 7)])
def test_rules_match_formulas(lr, b0, b1):
    assert scale_lr(lr, b0, b1, "sqrt") == pytest.approx(lr * math.sqrt(b1 / b0), rel=1e-12)
    assert scale_lr(lr, b0, b1, "linear") == pytest.approx(lr * b1 / b0, rel=1e-12)
    assert scale_lr(lr, b0, b1, "none") == lr


def test_sqrt_rule_hand_computed():
    # 1024 -> 8192 is k = 8, sqrt(8) = 2.8284271...
    assert scale_lr(1e-6, 1024, 8192, "sqrt") == pytest.approx(2.8284271247e-6, rel=1e-9)


def test_adam_sde_rule():
    s = scale_adam_sde(1e-4, 100, 200, beta1=0.9, beta2=0.99, eps=1e-8)
    assert s.k == 2
    assert s.lr == pytest.approx(1e-4 * math.sqrt(2))
    assert 1 - s.beta1 == pytest.approx(0.2)
    assert 1 - s.beta2 == pytest.approx(0.02)
    assert s.eps == pytest.approx(1e-8 / math.sqrt(2))
    # shrinking the batch moves beta toward 1
    assert scale_adam_sde(1e-4, 200, 100).beta2 > 0.999


@pytest.mark.parametrize("args,needle", [
    ((1e-3, -1, 10, "sqrt"), "--from-batch"),
    ((1e-3, 10, 0, "sqrt"), "--to-batch"),
    ((-1e-3, 10, 10, "sqrt"), "--lr"),
    ((1e-3, 10, 20, "cubic"), "unknown lr rule"),
])
def test_bad_input_raises_user_error(args, needle):
    with pytest.raises(UserError, match=needle):
        scale_lr(*args)


@pytest.mark.slow
def test_cli_scale(capsys):
    code, out, _ = run_cli(["lr", "scale", "--lr", "1e-6", "--from-batch", "1024", "--to-batch", "8192",
                            "--rule", "sqrt"], capsys)
    assert code == 0
    assert f"{1e-6 * math.sqrt(8):.6g}" in out
    assert "SDE" in out and "beta1 0.2" in out


@pytest.mark.slow
@pytest.mark.parametrize("args,needle", [
    (["--lr", "1e-6", "--from-batch", "-1024", "--to-batch", "8192"], "--from-batch"),
    (["--lr", "1e-6", "--from-batch", "1024", "--to-batch", "8192", "--rule", "sqr"], "did you mean 'sqrt'"),
    (["--lr", "abc", "--from-batch", "1024", "--to-batch", "8192"], "--lr"),
    (["--from-batch", "1024", "--to-batch", "8192"], "--lr is required"),
])
def test_cli_scale_bad_input_one_line_exit_2(capsys, args, needle):
    code, out, err = run_cli(["lr", "scale", *args], capsys)
    assert code == 2
    assert needle in err
    assert len(err.strip().splitlines()) == 1
