"""Large-batch rules of hypersolid_scale/training/optim.py: the learning rate scaled from optim.reference_batch_size
to the run's global batch (optim.lr_scaling), the one line that reports it, the warm-up to the scaled value,
and lightly's LARS with BatchNorm parameters and biases excluded from the trust ratio and the weight decay."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from lightly.models.modules import SimCLRProjectionHead
from torch import nn

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed.batchnorm import GlobalBatchNorm, convert_global_batchnorm
from hypersolid_scale.models import ModelConfig, SmallCNNOptions, build_backbone
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.training.optim import OptimConfig, lr_schedule, optimizer_factory, scaled_lr

# ------------------------------------------------------------------------------------------ lr scaling


@pytest.mark.parametrize("scaling, expected", [("none", 1e-3), ("linear", 4e-3), ("sqrt", 2e-3)])
def test_scaled_lr_values(scaling: str, expected: float) -> None:
    o = OptimConfig(lr=1e-3, reference_batch_size=256, lr_scaling=scaling)
    lr, _ = scaled_lr(o, 1024)
    assert lr == pytest.approx(expected)
    assert scaled_lr(o, 256)[0] == pytest.approx(1e-3)  # at the reference batch every rule keeps optim.lr
    assert scaled_lr(o, None) == (1e-3, None)  # no global batch given: nothing scaled, nothing said
    assert scaled_lr(OptimConfig(lr=0.3, reference_batch_size=256, lr_scaling=scaling), 64)[0] == pytest.approx(
        {"none": 0.3, "linear": 0.075, "sqrt": 0.15}[scaling]
    )


def test_the_warning_appears_exactly_when_the_batch_differs_and_nothing_rescales() -> None:
    o = OptimConfig(lr=1e-3, reference_batch_size=256, lr_scaling="none")
    lr, msg = scaled_lr(o, 1024)
    assert lr == 1e-3
    assert msg == (
        "global batch 1024 differs from optim.reference_batch_size=256 that optim.lr=0.001 was tuned for; "
        "the learning rate is not rescaled (optim.lr_scaling=none); set optim.lr_scaling=linear|sqrt to "
        "rescale it"
    )
    assert "\n" not in msg
    assert scaled_lr(o, 256) == (1e-3, None)  # the reference batch itself
    assert scaled_lr(OptimConfig(lr=1e-3), 1024) == (1e-3, None)  # no reference batch stated
    for scaling, rule in (("linear", "x 1024/256"), ("sqrt", "x sqrt(1024/256)")):
        lr, msg = scaled_lr(OptimConfig(lr=1e-3, reference_batch_size=256, lr_scaling=scaling), 1024)
        assert msg is not None and "differs" not in msg and "\n" not in msg
        assert f"learning rate {lr:.4g}" in msg and rule in msg and f"optim.lr_scaling={scaling}" in msg


def test_scaling_needs_a_reference_batch() -> None:
    o = OptimConfig(lr_scaling="linear")
    with pytest.raises(ConfigError, match=r"optim.lr_scaling.*optim.reference_batch_size"):
        scaled_lr(o, 512)
    with pytest.raises(ConfigError, match=r"optim.lr_scaling.*optim.reference_batch_size"):
        lr_schedule(o, epochs=1, max_steps=0, steps_per_epoch=4, global_batch=512)


def test_warmup_reaches_the_scaled_lr_and_the_cosine_ends_at_the_scaled_min_lr() -> None:
    o = OptimConfig(
        lr=0.3, min_lr=0.03, reference_batch_size=256, lr_scaling="linear", schedule="cosine", warmup_epochs=2
    )
    lrs = lr_schedule(o, epochs=10, max_steps=0, steps_per_epoch=5, global_batch=1024)
    peak, floor = 1.2, 0.12  # 0.3 and 0.03 x 1024/256
    assert len(lrs) == 50
    np.testing.assert_allclose(lrs[:10], np.linspace(0.0, peak, 10, endpoint=False))
    assert lrs[10] == pytest.approx(peak) and lrs.max() == pytest.approx(peak)
    assert lrs[-1] == pytest.approx(floor, rel=0.02) and lrs[10:].min() >= floor
    constant = lr_schedule(
        OptimConfig(lr=1e-3, reference_batch_size=512, lr_scaling="sqrt", warmup_epochs=1),
        epochs=3,
        max_steps=0,
        steps_per_epoch=4,
        global_batch=4096,
    )
    np.testing.assert_allclose(constant[4:], 1e-3 * math.sqrt(8))
    # Old callers (no global batch) and lr_scaling=none keep optim.lr.
    plain = OptimConfig(lr=1e-3, reference_batch_size=128, warmup_epochs=1)
    for lrs in (
        lr_schedule(plain, epochs=2, max_steps=0, steps_per_epoch=4),
        lr_schedule(plain, epochs=2, max_steps=0, steps_per_epoch=4, global_batch=1024),
        lr_schedule(
            OptimConfig(lr=1e-3, lr_scaling="linear", reference_batch_size=128, warmup_epochs=1),
            epochs=2,
            max_steps=0,
            steps_per_epoch=4,
        ),
    ):
        np.testing.assert_allclose(lrs[4:], 1e-3)
    # The config accepts any case for the choices (its check lowercases them): so does the schedule.
    upper = lr_schedule(
        OptimConfig(schedule="Constant", lr_scaling="Linear", reference_batch_size=128),
        epochs=1,
        max_steps=0,
        steps_per_epoch=4,
        global_batch=256,
    )
    np.testing.assert_allclose(upper, 2e-3)


# --------------------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "override, must_mention",
    [
        (["optim.lr_scaling=cubic"], ["optim.lr_scaling", "none | linear | sqrt"]),
        (["optim.reference_batch_size=0"], ["optim.reference_batch_size", ">= 1"]),
        (["optim.lr_scaling=linear"], ["optim.lr_scaling", "optim.reference_batch_size"]),
        (
            ["optim.lr_scaling=sqrt", "optim.reference_batch_size=null"],
            ["optim.lr_scaling", "optim.reference_batch_size"],
        ),
        (["optim.name=lamb"], ["optim.name", "adamw | sgd | lars"]),
        (["optim.name=lars", "optim.lars_trust_coefficient=0"], ["optim.lars_trust_coefficient", "positive"]),
        (["optim.name=lars", "optim.weight_decay=0"], ["optim.weight_decay", "lars", "trust ratio"]),
        (["optim.name=lars", "dist.engine=deepspeed", "dist.zero_stage=1"], ["optim.name=lars", "dist.zero_stage=0"]),
    ],
)
def test_bad_large_batch_keys_fail_naming_them(override: list[str], must_mention: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, override)
    for word in must_mention:
        assert word in str(err.value), str(err.value)


def test_good_large_batch_keys_load() -> None:
    cfg = load_config(
        None,
        [
            "optim.name=lars",
            "optim.lr=0.3",
            "optim.lr_scaling=linear",
            "optim.reference_batch_size=256",
            "optim.lars_trust_coefficient=0.02",
        ],
    )
    o = cfg.optim
    assert (o.name, o.lr_scaling, o.reference_batch_size, o.lars_trust_coefficient) == ("lars", "linear", 256, 0.02)
    assert load_config(None, []).optim.lr_scaling == "none"  # the default rescales nothing
    assert load_config(None, ["optim.name=lars", "dist.engine=deepspeed"]).dist.zero_stage == 0  # ZeRO 0 is fine


# --------------------------------------------------------------------------------------------- LARS


def _small_model() -> nn.Module:
    """The shape of the trainer's model: a small_cnn backbone (BatchNorm2d, convolutions) + lightly's SimCLR
    projection head (Linear with bias, BatchNorm1d, Linear)."""
    torch.manual_seed(0)
    backbone, dim = build_backbone(ModelConfig(arch="small_cnn", in_channels=1, small_cnn=SmallCNNOptions(width=4)))
    return nn.Sequential(backbone, SimCLRProjectionHead(dim, 16, 8, num_layers=2))


def _expected_excluded(model: nn.Module) -> set[str]:
    norms = {f"{m}." for m, mod in model.named_modules() if "BatchNorm" in type(mod).__name__}
    return {n for n, _ in model.named_parameters() if n.endswith(".bias") or any(n.startswith(m) for m in norms)}


LARS = OptimConfig(name="lars", lr=0.3, weight_decay=1e-6, momentum=0.9)


def test_lars_groups_exclude_batchnorm_and_biases_from_adaptation_and_decay() -> None:
    model = _small_model()
    names = {id(p): n for n, p in model.named_parameters()}
    excluded = _expected_excluded(model)
    assert any("bias" in n for n in excluded) and len(excluded) < len(names)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert any(isinstance(m, nn.BatchNorm1d) for m in model.modules())
    opt = optimizer_factory(LARS, model=model)(model.parameters())
    adapted, plain = opt.param_groups
    assert {names[id(p)] for p in plain["params"]} == excluded
    assert {names[id(p)] for p in adapted["params"]} == set(names.values()) - excluded
    # lightly's LARS adapts (trust ratio) and decays exactly the groups whose weight decay is not 0.
    assert (adapted["weight_decay"], plain["weight_decay"]) == (1e-6, 0.0)
    assert all(g["trust_coefficient"] == 1e-3 and g["momentum"] == 0.9 for g in opt.param_groups)
    for group in opt.param_groups:  # what the trainer does every step: the lr only, weight decay untouched
        group["lr"] = 0.05
    assert (adapted["weight_decay"], plain["weight_decay"]) == (1e-6, 0.0)


@pytest.mark.parametrize("convert", ["global_batchnorm", "sync_batchnorm"])
def test_lars_groups_survive_the_batchnorm_conversion_and_to_device(convert: str) -> None:
    """The run builder hands the factory the model before the engine converts its BatchNorms and moves it:
    the parameters (their ids) are the same objects afterwards."""
    model = _small_model()
    excluded = _expected_excluded(model)
    make = optimizer_factory(LARS, model=model)
    if convert == "global_batchnorm":
        converted = convert_global_batchnorm(model)
        assert any(isinstance(m, GlobalBatchNorm) for m in converted.modules())
    else:
        converted = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        assert any(isinstance(m, nn.SyncBatchNorm) for m in converted.modules())
    converted = converted.to("cpu").to(torch.float64)
    names = {id(p): n for n, p in converted.named_parameters()}
    trainable = [p for p in converted.parameters() if p.requires_grad]  # as run_builder._trainable_only
    _, plain = make(trainable).param_groups
    assert {names[id(p)] for p in plain["params"]} == excluded
    # A factory built from the converted model (GlobalBatchNorm: found by its class name) agrees.
    _, again = optimizer_factory(LARS, model=converted)(converted.parameters()).param_groups
    assert {names[id(p)] for p in again["params"]} == excluded


def test_lars_needs_the_model_and_the_other_optimizers_ignore_it() -> None:
    model = _small_model()
    with pytest.raises(ValueError, match="model"):
        optimizer_factory(LARS)
    for name, cls in (("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)):
        opt = optimizer_factory(OptimConfig(name=name), model=model)(model.parameters())
        assert isinstance(opt, cls) and len(opt.param_groups) == 1


def test_a_lars_step_adapts_the_weights_and_leaves_batchnorm_and_biases_to_sgd_momentum() -> None:
    """One step by hand (lightly's LARS, first momentum step: the buffer is the update itself):
    adapted  p <- p - lr * eta * |p| / (|g| + wd |p| + eps) * (g + wd p)
    excluded p <- p - lr * g, as torch's SGD with momentum; a second step checks the momentum too."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 2, bias=False))
    model(torch.randn(8, 3)).pow(2).mean().backward()
    o = OptimConfig(name="lars", lr=0.5, weight_decay=0.1, momentum=0.9, lars_trust_coefficient=0.02)
    excluded = {"0.bias", "1.weight", "1.bias"}
    assert _expected_excluded(model) == excluded
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    grads = {n: p.grad.clone() for n, p in params.items()}
    reference = {n: nn.Parameter(before[n].clone()) for n in excluded}  # the excluded ones under torch's SGD
    for n, p in reference.items():
        p.grad = grads[n].clone()
    sgd = torch.optim.SGD(list(reference.values()), lr=o.lr, momentum=o.momentum)

    lars = optimizer_factory(o, model=model)(model.parameters())
    lars.step()
    sgd.step()
    for n, p in params.items():
        w, g = before[n], grads[n]
        if n in excluded:
            expected = w - o.lr * g
        else:
            ratio = o.lars_trust_coefficient * w.norm() / (g.norm() + o.weight_decay * w.norm() + 1e-8)
            expected = w - o.lr * ratio * (g + o.weight_decay * w)
            assert not torch.allclose(p, w - o.lr * g)  # the trust ratio made a difference
        torch.testing.assert_close(p.detach(), expected, rtol=1e-5, atol=1e-7, msg=n)
    for _ in range(3):  # the first step, then the same gradients twice more: momentum buffers as torch's SGD's
        for n in excluded:
            torch.testing.assert_close(params[n].detach(), reference[n].detach(), msg=n)
        lars.step()
        sgd.step()
    assert not torch.allclose(params["1.weight"], before["1.weight"] - 3 * o.lr * grads["1.weight"])  # momentum


def test_lars_refuses_parameters_of_another_model() -> None:
    """The groups key on the parameters of the model the factory was given: parameters it does not know
    (an engine that copied the model) fail instead of being LARS-adapted, BatchNorm and biases included."""
    model = _small_model()
    twin = copy.deepcopy(model)
    with pytest.raises(ValueError, match="not those of the model"):
        optimizer_factory(LARS, model=model)(twin.parameters())
    assert len(optimizer_factory(LARS, model=twin)(twin.parameters()).param_groups) == 2


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_fused_optimizer_gives_the_same_update(name: str) -> None:
    """optim.fused=true (torch's fused kernels) and false (multi-tensor) make the same update within float rounding;
    auto is multi-tensor on the CPU (fused only where every parameter is on CUDA)."""
    from hypersolid_scale.training.optim import OptimConfig, optimizer_factory

    updates = {}
    for fused in ("true", "false", "auto"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        start = [p.detach().clone() for p in model.parameters()]
        opt = optimizer_factory(OptimConfig(name=name, lr=0.05, fused=fused, momentum=0.9))(model.parameters())
        assert bool(opt.defaults.get("fused")) == (fused == "true")
        for step in range(3):
            x = torch.randn(32, 8, generator=torch.Generator().manual_seed(step))
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()
        updates[fused] = torch.cat([(p.detach() - s).flatten() for p, s in zip(model.parameters(), start)])
    scale = float(updates["false"].norm())
    assert scale > 0 and float((updates["true"] - updates["false"]).norm()) <= 1e-5 * scale
    assert torch.equal(updates["auto"], updates["false"])


def test_optim_fused_is_checked() -> None:
    from hypersolid_scale.safety.errors import ConfigError
    from hypersolid_scale.training.optim import OptimConfig, check

    with pytest.raises(ConfigError, match="optim.fused"):
        check(OptimConfig(fused="fast"))
