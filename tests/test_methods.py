"""The baseline methods on a tiny CPU backbone: losses, gradients, teachers, schedules, state, config errors."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from lightly.utils.scheduler import cosine_schedule

from hypersolid_scale.methods import (
    MethodConfig,
    build_method,
    build_method_model,
    count_global_views,
    get_method,
    method_names,
    projection_head,
)
from hypersolid_scale.models import ModelConfig, SmallCNNOptions, build_backbone
from hypersolid_scale.safety.errors import ConfigError

pytestmark = pytest.mark.filterwarnings("ignore:.*weight_norm.*:FutureWarning")  # lightly's DINO head

METHODS = method_names()

B = 8
MODEL_CFG = ModelConfig(arch="small_cnn", small_cnn=SmallCNNOptions(width=4))


# Sizes and schedules small and short enough for a test, by field name: every method's section starts from its
# own defaults, and a new method's fields of these names shrink too.
SMALL = {"hidden_dim": 16, "out_dim": 8, "bottleneck_dim": 8, "n_prototypes": 10, "queue_length": 16,
         "momentum_base": 0.9, "warmup_teacher_temp_epochs": 3, "teacher_temp": 0.07, "freeze_prototypes_steps": 2,
         "queue_start_epoch": 1}


def small_cfg(name: str, **over) -> MethodConfig:
    """The method's own section with tiny heads and short schedules (``over``: its keys set after)."""
    section = get_method(name).Config()
    for f in dataclasses.fields(section):
        if f.name in SMALL:
            setattr(section, f.name, SMALL[f.name])
    for key, value in over.items():
        setattr(section, key, value)
    return MethodConfig(name=name, **{name: section})


def build(name: str, seed: int = 0, **over):
    torch.manual_seed(seed)
    backbone, feature_dim = build_backbone(MODEL_CFG)
    method = build_method(small_cfg(name, **over), backbone, feature_dim, steps_per_epoch=2)
    return backbone, method


def make_views(seed: int, local: bool = True) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    views = [torch.randn(B, 3, 16, 16, generator=g) for _ in range(2)]
    return views + ([torch.randn(B, 3, 8, 8, generator=g) for _ in range(2)] if local else [])


def trainable(backbone, method) -> list[torch.nn.Parameter]:
    return [p for p in [*backbone.parameters(), *method.parameters()] if p.requires_grad]


def train_steps(backbone, method, opt, steps: range, total: int = 10) -> list[float]:
    losses = []
    for step in steps:
        loss, _ = method(make_views(step), backbone)
        opt.zero_grad()
        loss.backward()
        method.before_optimizer_step()
        opt.step()
        method.after_step(step, total, backbone)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", METHODS)
def test_loss_is_finite_and_its_gradient_reaches_the_backbone(name):
    backbone, method = build(name)
    loss, stats = method(make_views(0), backbone)
    assert loss.dim() == 0 and torch.isfinite(loss)
    torch.testing.assert_close(stats["loss"].to(loss.dtype), loss.detach())
    assert not stats["loss"].requires_grad and stats["loss"].dim() == 0
    loss.backward()
    grads = [p.grad for p in backbone.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(g.abs().sum() for g in grads) > 0


@pytest.mark.parametrize("name", METHODS)
def test_a_few_sgd_steps_on_a_fixed_batch_lower_the_loss(name):
    backbone, method = build(name, freeze_prototypes_steps=0) if name == "swav" else build(name)
    opt = torch.optim.SGD(trainable(backbone, method), lr=0.05, momentum=0.9)
    views = make_views(0)
    losses = []
    for step in range(8):
        loss, _ = method(views, backbone)
        opt.zero_grad()
        loss.backward()
        method.before_optimizer_step()
        opt.step()
        method.after_step(step, 100, backbone)
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("name", ["byol", "dino"])
def test_the_teacher_gets_no_gradient_and_follows_the_student_by_ema(name):
    backbone, method = build(name)
    teacher = [p for n, p in method.named_parameters() if n.startswith("teacher_")]
    assert teacher and not any(p.requires_grad for p in teacher)
    opt = torch.optim.SGD(trainable(backbone, method), lr=0.1)
    loss, _ = method(make_views(0), backbone)
    loss.backward()
    assert all(p.grad is None for p in teacher)
    opt.step()
    pairs = [(s, t) for student, tm in method.student_teacher_pairs(backbone)
             for s, t in zip(student.parameters(), tm.parameters())]
    before = [t.detach().clone() for _, t in pairs]
    moved = [not torch.equal(s, t) for s, t in pairs]
    assert any(moved)  # the optimizer moved the student away from its copy
    method.after_step(3, 10, backbone)
    m = cosine_schedule(3, 10, 0.9, 1.0)
    assert 0.9 < m < 1.0
    for (s, t), old in zip(pairs, before):
        torch.testing.assert_close(t, m * old + (1 - m) * s.detach(), rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(t, old) for (_, t), old in zip(pairs, before))


@pytest.mark.parametrize("name", METHODS)
def test_state_dict_round_trip_resumes_bitwise(name):
    backbone, method = build(name)
    opt = torch.optim.SGD(trainable(backbone, method), lr=0.05, momentum=0.9)
    train_steps(backbone, method, opt, range(3))
    saved = copy.deepcopy((backbone.state_dict(), method.state_dict(), opt.state_dict()))
    train_steps(backbone, method, opt, range(3, 5))

    backbone2, method2 = build(name, seed=1)  # different initial weights and queues: the load must replace all
    backbone2.load_state_dict(saved[0])
    method2.load_state_dict(saved[1])
    opt2 = torch.optim.SGD(trainable(backbone2, method2), lr=0.05, momentum=0.9)
    opt2.load_state_dict(saved[2])
    assert method2.step == 3
    train_steps(backbone2, method2, opt2, range(3, 5))
    for (k, a), b in zip({**backbone.state_dict(), **method.state_dict()}.items(),
                         {**backbone2.state_dict(), **method2.state_dict()}.values()):
        if isinstance(a, torch.Tensor):
            assert torch.equal(a, b), k
    extra = method.get_extra_state()
    for q1, q2 in zip(extra.get("queues", []), method2.get_extra_state().get("queues", [])):
        assert torch.equal(q1[0], q2[0]) and torch.equal(q1[1], q2[1])


def test_the_swav_queue_and_step_count_are_in_the_state():
    backbone, method = build("swav")
    opt = torch.optim.SGD(trainable(backbone, method), lr=0.05)
    train_steps(backbone, method, opt, range(3))
    state = method.state_dict()["_extra_state"]
    assert state["step"] == 3 and len(state["queues"]) == 2
    assert int(state["queues"][0][1]) == (3 * B) % 16  # the ring buffer's write position after 3 batches


def test_dino_freezes_its_last_layer_during_the_first_epoch():
    backbone, method = build("dino")  # steps_per_epoch=2, freeze_last_layer_epochs=1
    last = list(method.head.last_layer.parameters())
    for step in range(3):
        loss, _ = method(make_views(step), backbone)
        loss.backward()
        method.before_optimizer_step()
        trained = [p.grad is not None for p in last if p.requires_grad]
        assert trained and all(trained) == (step >= 2), step
        method.zero_grad()
        method.after_step(step, 10, backbone)


def test_swav_freezes_its_prototypes_for_the_first_steps():
    backbone, method = build("swav")  # freeze_prototypes_steps=2
    for step in range(3):
        loss, _ = method(make_views(step), backbone)
        loss.backward()
        method.before_optimizer_step()
        assert (method.prototypes.heads[0].weight.grad is not None) == (step >= 2), step
        assert method.projector.layers[0].weight.grad is not None
        method.zero_grad()
        method.after_step(step, 10, backbone)


def test_dino_teacher_temperature_follows_the_epoch():
    backbone, method = build("dino")
    teacher_out = [torch.randn(B, SMALL["out_dim"]) for _ in range(2)]
    student_out = [t.clone() for t in teacher_out]
    criterion = method.criterion
    temps = criterion.teacher_temp_schedule
    assert temps[0] == pytest.approx(0.04) and temps[-1] == pytest.approx(0.07)
    method.after_step(3, 10, backbone)  # 4 steps done, 2 per epoch: epoch 2
    assert method.epoch == 2
    center = criterion.center.clone()
    expected = criterion(teacher_out, student_out, teacher_temp=float(temps[2]))
    criterion.center.copy_(center)
    assert criterion(teacher_out, student_out, epoch=method.epoch) == pytest.approx(float(expected))


def test_ntxent_matches_a_float64_reference_on_two_pairs():
    _, method = build("simclr")
    g = torch.Generator().manual_seed(3)
    z0, z1 = torch.randn(2, 5, generator=g), torch.randn(2, 5, generator=g)
    got = method.criterion(z0, z1)
    tau = 0.5
    z = torch.nn.functional.normalize(torch.cat([z0, z1]).double(), dim=1)  # rows 0,1 | 2,3; pairs (i, i+2)
    sim = z @ z.T / tau
    total = 0.0
    for i in range(4):  # -log softmax of the positive among every other row
        others = torch.tensor([k for k in range(4) if k != i])
        total += float(torch.logsumexp(sim[i, others], dim=0) - sim[i, (i + 2) % 4])
    assert float(got) == pytest.approx(total / 4, rel=1e-6)


def test_barlow_twins_matches_a_float64_reference():
    _, method = build("barlowtwins")
    g = torch.Generator().manual_seed(4)
    za, zb = torch.randn(6, 3, generator=g), torch.randn(6, 3, generator=g)
    got = method.criterion(za, zb)
    a, b = za.double(), zb.double()
    a = (a - a.mean(0)) / torch.sqrt(a.var(0, unbiased=False) + 1e-5)
    b = (b - b.mean(0)) / torch.sqrt(b.var(0, unbiased=False) + 1e-5)
    c = a.T @ b / 6
    eye = torch.eye(3, dtype=torch.bool)
    expected = ((c[eye] - 1) ** 2).sum() + 0.005 * (c[~eye] ** 2).sum()
    assert float(got) == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("name", METHODS)
def test_one_seed_draws_the_backbone_then_the_methods_heads(name):
    """The run's initial weights (``build_method_model``, what the trainer and the random-init checkpoint build):
    the backbone's, then the method's own heads, nothing drawn between them; the backbone is every method's."""
    def tensors(module):
        return {k: v for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}

    torch.manual_seed(0)
    got = build_method_model(MODEL_CFG, small_cfg(name), steps_per_epoch=2)
    backbone, method = build(name)  # seed 0: the backbone, then build_method
    for model, expected in ((got.backbone, backbone), (got.method, method)):
        have, want = tensors(model), tensors(expected)
        assert have.keys() == want.keys() and all(torch.equal(have[k], want[k]) for k in want)
    torch.manual_seed(0)
    other = tensors(build_method_model(MODEL_CFG, small_cfg("simclr")).backbone)
    assert all(torch.equal(v, other[k]) for k, v in tensors(got.backbone).items())


@pytest.mark.parametrize("name", METHODS)
def test_the_projection_head_maps_backbone_features(name):
    """What projector features and export read: the head takes the backbone's (N, F) features to (N, D)."""
    model = build_method_model(MODEL_CFG, small_cfg(name), steps_per_epoch=2).eval()
    head = projection_head(model.method)
    assert head is model.projector is getattr(model.method, type(model.method).projection_head)
    with torch.no_grad():
        out = head(model.backbone(torch.randn(B, 3, 16, 16)))
    assert out.ndim == 2 and out.shape[0] == B and torch.isfinite(out).all()


@pytest.mark.parametrize("name, uses_local", [("simclr", False), ("byol", False), ("dino", True), ("swav", True)])
def test_view_selection(name, uses_local):
    _, method = build(name)
    views = make_views(0)
    assert method.select_views(views) == ((views, 2) if uses_local else (views[:2], 2))
    assert count_global_views(views[:2]) == 2 and count_global_views(views[:3]) == 2


def test_views_out_of_order_or_too_few_globals_are_refused():
    _, method = build("dino")
    views = make_views(0)
    with pytest.raises(ValueError, match="global views"):
        method.select_views([views[0], views[2], views[1]])
    with pytest.raises(ValueError, match="at least 2 global views"):
        method.select_views([views[0], views[2]])


@pytest.mark.parametrize("name, key, value, match", [
    ("simclr", "temperature", 0.0, "method.simclr.temperature=0.0 .* > 0"),
    ("vicreg", "num_layers", 1, "method.vicreg.num_layers=1 .* >= 2"),
    ("barlowtwins", "hidden_dim", True, "method.barlowtwins.hidden_dim=True .* positive integer"),
    ("byol", "momentum_base", 1.5, r"method.byol.momentum_base=1.5 .* \[0, 1\]"),
    ("dino", "batch_norm", "yes", "method.dino.batch_norm='yes' .* true or false"),
    ("dino", "student_temp", float("nan"), "method.dino.student_temp=nan"),
    ("swav", "queue_length", -1, "method.swav.queue_length=-1 .* >= 0"),
])
def test_bad_config_values_raise_config_error_naming_the_key(name, key, value, match):
    cfg = small_cfg(name, **{key: value})
    with pytest.raises(ConfigError, match=match):
        cfg.validate()
    backbone, feature_dim = build_backbone(MODEL_CFG)
    with pytest.raises(ConfigError):
        build_method(cfg, backbone, feature_dim, steps_per_epoch=1)


def test_unknown_method_and_inverted_momentum_raise_config_error():
    with pytest.raises(ConfigError, match="method.name='moco' .*simclr .* swav"):
        MethodConfig(name="moco").validate()
    with pytest.raises(ConfigError, match="momentum_base=0.99 must be <= method.dino.momentum_end=0.9"):
        small_cfg("dino", momentum_base=0.99, momentum_end=0.9).validate()
    small_cfg("byol", momentum_base=1.0).validate()  # the bounds themselves are allowed
