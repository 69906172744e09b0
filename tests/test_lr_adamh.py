"""AdamH and the effective learning-rate tracker, with real torch on the CPU."""


import pytest
import torch
from torch import nn

from throughputlab.lr.adamh import AdamH, adamh_param_groups, expected_relative_step
from throughputlab.lr.effective import EffectiveLRTracker


@pytest.fixture(autouse=True)
def one_thread():
    # the test machine is shared: one thread is also faster for models this small
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(40, 8), nn.Flatten(), nn.Linear(8 * 4, 32), nn.LayerNorm(32), nn.GELU(),
                         nn.Linear(32, 40))


def batch():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 40, (64, 4), generator=g)
    return x, (x[:, 0] * 3 + x[:, 1]) % 40


def test_adamh_keeps_norms_steps_lr_and_trains():
    model = tiny_model()
    lr = 1e-2
    opt = AdamH(adamh_param_groups(model, lr=lr, other_lr=3e-3))
    mats = opt.param_groups[0]["params"]
    assert [p.shape for p in mats] == [(32, 32), (40, 32)]  # Linear weights only, not the embedding
    init = [float(torch.linalg.vector_norm(p.detach().double())) for p in mats]
    x, y = batch()
    loss_fn = nn.CrossEntropyLoss()
    first = None
    for _ in range(150):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        first = float(loss.detach()) if first is None else first
        loss.backward()
        before = [p.detach().clone().double() for p in mats]
        opt.step()
        for p, b, r in zip(mats, before, init):
            now = p.detach().double()
            assert abs(float(torch.linalg.vector_norm(now)) / r - 1) < 1e-6
            rel = float(torch.linalg.vector_norm(now - b) / torch.linalg.vector_norm(b))
            assert rel == pytest.approx(expected_relative_step(lr), rel=1e-3)
    with torch.no_grad():
        final = float(loss_fn(model(x), y))
    assert final < 0.5 * first


def test_expected_relative_step_is_lr_to_first_order():
    assert expected_relative_step(1e-3) == pytest.approx(1e-3, rel=1e-6)
    assert expected_relative_step(0.1) < 0.1


def test_untangent_mode_is_the_literal_formula():
    torch.manual_seed(0)
    w = torch.randn(6, 5)
    p = nn.Parameter(w.clone())
    opt = AdamH([p], lr=0.05, tangent=False)
    p.grad = torch.randn(6, 5)
    opt.step()
    u = p.grad / (p.grad.abs() + 1e-8)  # first Adam step: m_hat / sqrt(v_hat) = sign-like
    r = w.norm()
    step = w - 0.05 * r * u / u.norm()
    assert torch.allclose(p.detach(), r * step / step.norm(), atol=1e-6)


def test_other_parameters_follow_adamw():
    torch.manual_seed(0)
    a = nn.Parameter(torch.randn(7))
    b = nn.Parameter(a.detach().clone())
    ours = AdamH([dict(params=[a], adamh=False)], lr=1e-2, weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(7)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.allclose(a, b, atol=1e-6)


def test_tracker_matches_manual_norms_for_sgd():
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 3))
    bias = nn.Parameter(torch.randn(3))
    opt = torch.optim.SGD([dict(params=[w], name="w"), dict(params=[bias])], lr=0.1)
    tracker = EffectiveLRTracker(opt)
    w.grad, bias.grad = torch.randn(4, 3), torch.randn(3)
    expected_w = 0.1 * float(w.grad.norm()) / float(w.detach().norm())
    expected_b = 0.1 * float(bias.grad.norm()) / float(bias.detach().norm())
    with tracker.step():
        opt.step()
    assert set(tracker.last) == {"w", "group1"}
    assert tracker.last["w"] == pytest.approx(expected_w, rel=1e-5)
    assert tracker.last["group1"] == pytest.approx(expected_b, rel=1e-5)
    wn, un = tracker.last_norms["w"]
    assert un / wn == pytest.approx(expected_w, rel=1e-5)


def test_tracker_sees_adamh_relative_step():
    model = tiny_model()
    opt = AdamH(adamh_param_groups(model, lr=2e-3))
    tracker = EffectiveLRTracker(opt, per_param=True,
                                 param_names={id(p): n for n, p in model.named_parameters()})
    x, y = batch()
    for _ in range(3):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        tracker.before_step()
        opt.step()
        tracker.after_step()
    assert len(tracker.history) == 3
    assert tracker.mean()["matrices"] == pytest.approx(expected_relative_step(2e-3), rel=1e-3)
    assert tracker.last["2.weight"] == pytest.approx(expected_relative_step(2e-3), rel=1e-3)


def test_tracker_errors():
    opt = torch.optim.SGD([nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(ValueError, match="unknown parameter group"):
        EffectiveLRTracker(opt, groups=["nope"])
    with pytest.raises(RuntimeError, match="before_step"):
        EffectiveLRTracker(opt).after_step()
