"""The baseline configs (configs/baselines/<method>_<setting>.yaml): each loads, names its method, differs from
its setting's Hypersolid config (configs/<setting>.yaml) only in the objective and in the keys its header
documents, sees the views its method is defined on, and can take a training step. A method without such a
file trains in every setting on the setting's config with its own defaults (compare.plan.setting_config).

A fair comparison needs the same data, backbone, seed, global batch, training length and optimizer; what a
baseline changes beyond its ``method`` section is listed in ``DOCUMENTED`` (and named in the file's header).
The large-batch recipes (``<method>_cifar10_lars.yaml``: SimCLR and BYOL with LARS at batch 1024) differ from
their method's CIFAR-10 config in the batch and the optimizer only.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from hypersolid_scale.compare.plan import setting_config
from hypersolid_scale.config.nested import flatten
from hypersolid_scale.config.schema import Config, load_config, to_dict
from hypersolid_scale.data.augment.presets import resolve_preset
from hypersolid_scale.methods import Method, build_method_model, count_global_views, get_method, method_names
from hypersolid_scale.methods.dino import DINO
from hypersolid_scale.methods.swav import SwaV
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.training.optim import lr_schedule, optimizer_factory, scaled_lr
from hypersolid_scale.training.run_builder import _trainable_only

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
METHODS = method_names()
BASELINES = [m for m in METHODS if m != "hypersolid"]
SETTINGS = ("quickstart", "cifar10", "cifar100")
LARS_PATHS = sorted((CONFIGS / "baselines").glob("*_lars.yaml"))
PATHS = sorted(set((CONFIGS / "baselines").glob("*.yaml")) - set(LARS_PATHS))
CIFAR_PATHS = [p for p in PATHS if not p.stem.endswith("_quickstart")]
TWO_VIEW = tuple(m for m in BASELINES if not get_method(m).uses_local_views)  # the others are multi-crop methods
# Keys that do not take part in the comparison: the run's name, the objective (its section holds its heads).
NOT_COMPARED = ("run_dir", "method.")
# What each baseline changes beyond the objective, by (setting, method); its header names every key.
_CIFAR_TWO_VIEW = {"data.num_local_views", "data.global_crop_scale"}
_CIFAR_MULTI_CROP = {"data.global_crop_scale", "data.local_crop_size", "data.local_crop_scale"}
DOCUMENTED: dict[tuple[str, str], set[str]] = {
    **{("quickstart", m): ({"data.num_local_views"} if m in TWO_VIEW else set()) for m in BASELINES},
    **{(s, m): (_CIFAR_TWO_VIEW if m in TWO_VIEW else _CIFAR_MULTI_CROP) for s in ("cifar10", "cifar100")
       for m in BASELINES},
}
CIFAR10_TRAIN_IMAGES = 50_000


def _ids(path: Path) -> str:
    return path.stem


def _method_and_setting(path: Path) -> tuple[str, str]:
    method, _, setting = path.stem.rpartition("_")
    return method, setting


def _header(path: Path) -> str:
    lines = path.read_text().splitlines()
    return "\n".join(lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))])


def _compared(cfg: Config) -> dict[str, Any]:
    return {k: v for k, v in flatten(to_dict(cfg)).items() if not k.startswith(NOT_COMPARED)}


def _raw_diff(a: Path, b: Path) -> dict[str, tuple[Any, Any]]:
    x, y = flatten(yaml.safe_load(a.read_text())), flatten(yaml.safe_load(b.read_text()))
    return {k: (x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)}


def test_every_file_is_a_method_s_setting_and_every_method_has_every_setting() -> None:
    """The globs below see every file, and no file outside the naming scheme escapes the checks: each is
    ``<registered baseline>_<setting>``; a method without one gets the setting's config with its defaults."""
    assert {_method_and_setting(p) for p in PATHS} <= {(m, s) for m in BASELINES for s in SETTINGS}
    assert all(p.stem.removesuffix("_cifar10_lars") in BASELINES for p in LARS_PATHS) and LARS_PATHS
    for method in METHODS:
        for setting in SETTINGS:
            path, overrides = setting_config(CONFIGS, setting, method)
            assert load_config(path, overrides).method.name == method
            assert (path == CONFIGS / "baselines" / f"{method}_{setting}.yaml") == (path in PATHS)


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_the_config_loads_and_names_its_method(path: Path) -> None:
    method, _ = _method_and_setting(path)
    cfg = load_config(path)
    assert cfg.method.name == method
    assert cfg.run_dir == f"runs/{path.stem}"
    assert cfg.eval.features == "backbone"  # the paper's features, every method's


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_only_the_objective_and_the_documented_keys_differ_from_hypersolid(path: Path) -> None:
    """Data, backbone, seed, batch, epochs/max_steps, optimizer, engine, evaluation and checkpoints are the
    Hypersolid config's; every difference is allow-listed in DOCUMENTED and named in the file's header."""
    method, setting = _method_and_setting(path)
    base, ours = _compared(load_config(CONFIGS / f"{setting}.yaml")), _compared(load_config(path))
    assert ours.keys() == base.keys()
    differ = {k for k in base if ours[k] != base[k]}
    assert differ == DOCUMENTED[(setting, method)], {k: (base[k], ours[k]) for k in differ}
    header = _header(path)
    assert all(key in header for key in differ), f"{path.name}: the header must explain {sorted(differ)}"
    for key in ("data.dataset", "data.format", "model.arch", "data.global_batch_size", "epochs", "max_steps",
                "seed", "optim.name", "optim.lr", "optim.weight_decay", "optim.reference_batch_size"):
        assert key not in differ  # what a fair comparison cannot give up, whatever DOCUMENTED says


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_the_launch_command_runs_this_file_on_as_many_processes_as_hypersolid(path: Path) -> None:
    """The global batch (data.global_batch_size) is the same on any launch width; the header's command uses
    Hypersolid's width, so that the images per GPU (memory, local BatchNorm statistics) are the same too."""
    _, setting = _method_and_setting(path)
    launch = re.compile(r"--nproc_per_node=(\d+) launch/train.py --config (\S+)")
    ours = launch.search(_header(path))
    theirs = launch.search((CONFIGS / f"{setting}.yaml").read_text())
    assert ours is not None and theirs is not None
    assert ours.group(2) == f"configs/baselines/{path.name}"
    assert ours.group(1) == theirs.group(1)


@pytest.mark.parametrize("method", [m for m in BASELINES if (CONFIGS / "baselines" / f"{m}_cifar10.yaml").is_file()])
def test_cifar100_differs_from_cifar10_as_the_hypersolid_configs_do(method: str) -> None:
    """The CIFAR-100 baseline is the CIFAR-10 one with the dataset swapped, as for Hypersolid."""
    ours = _raw_diff(*(CONFIGS / "baselines" / f"{method}_{s}.yaml" for s in ("cifar10", "cifar100")))
    base = _raw_diff(CONFIGS / "cifar10.yaml", CONFIGS / "cifar100.yaml")
    assert ours.pop("run_dir") == (f"runs/{method}_cifar10", f"runs/{method}_cifar100")
    base.pop("run_dir")
    assert ours == base


@pytest.mark.parametrize("path", PATHS, ids=_ids)
def test_the_views_are_those_the_method_is_defined_on(path: Path) -> None:
    """Two global views for the two-view methods; DINO and SwaV get multi-crop, with local views smaller than
    the global ones (a view of the global size counts as global: it would reach DINO's teacher and SwaV's
    assignments)."""
    method, _ = _method_and_setting(path)
    preset = resolve_preset(load_config(path).data)
    views = [torch.zeros(1, preset.channels, s, s) for s in preset.view_sizes()]
    assert count_global_views(views) == 2
    assert (len(views) == 2) == (method in TWO_VIEW)


def test_cifar_hyperparameters_follow_solo_learn() -> None:
    """The values the headers cite from solo-learn's CIFAR configs (scripts/pretrain/cifar/<method>.yaml and
    cifar-multicrop/swav.yaml), read back through the loader."""
    expected = {
        "simclr": {"hidden_dim": 2048, "out_dim": 256, "temperature": 0.2},
        "vicreg": {"hidden_dim": 2048, "out_dim": 2048, "sim_coeff": 25.0, "std_coeff": 25.0, "cov_coeff": 1.0},
        "barlowtwins": {"hidden_dim": 2048, "out_dim": 2048, "lambda_param": 0.0051},
        "byol": {"hidden_dim": 4096, "out_dim": 256, "momentum_base": 0.99, "momentum_end": 1.0},
        "dino": {"hidden_dim": 2048, "bottleneck_dim": 256, "out_dim": 4096, "teacher_temp": 0.07,
                 "student_temp": 0.1, "momentum_base": 0.9995, "freeze_last_layer_epochs": 1},
        "swav": {"hidden_dim": 2048, "out_dim": 128, "n_prototypes": 3000, "temperature": 0.1,
                 "queue_length": 3840, "queue_start_epoch": 50},
    }
    for path in CIFAR_PATHS:
        method, _ = _method_and_setting(path)
        section = getattr(load_config(path).method, method)
        assert {k: getattr(section, k) for k in expected[method]} == expected[method], path.name
    # SwaV freezes its prototypes for solo-learn's 2 epochs, in steps of the CIFAR global batch.
    cfg = load_config(CONFIGS / "baselines" / "swav_cifar10.yaml")
    assert cfg.method.swav.freeze_prototypes_steps == 2 * (CIFAR10_TRAIN_IMAGES // cfg.data.global_batch_size)


# ----------------------------------------------------------------------------------------------------------
# One training step of each CIFAR baseline, built as the trainer builds it
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _frozen_at_step_0(cfg: Config, method: Method) -> set[str]:
    """Parameters the config's schedules keep frozen during the first step (their gradients are dropped):
    DINO's last layer during the first method.dino.freeze_last_layer_epochs, SwaV's prototypes during the
    first method.swav.freeze_prototypes_steps."""
    if isinstance(method, DINO) and cfg.method.dino.freeze_last_layer_epochs > 0:
        return {f"method.head.last_layer.{n}" for n, p in method.head.last_layer.named_parameters()
                if p.requires_grad}
    if isinstance(method, SwaV) and cfg.method.swav.freeze_prototypes_steps > 0:
        return {f"method.prototypes.{n}" for n, _ in method.prototypes.named_parameters()}
    return set()


def _student_of(teacher_key: str) -> str:
    """method.teacher_backbone.* -> backbone.*; method.teacher_<head>.* -> method.<head>.*"""
    rest = teacher_key.removeprefix("method.teacher_")
    return rest if rest.startswith("backbone.") else f"method.{rest}"


def _assert_the_teacher_followed(teacher: dict[str, torch.Tensor], before: dict[str, torch.Tensor],
                                 after: dict[str, torch.Tensor], name: str) -> None:
    """Started as a copy of the student, and after one EMA step with 0 < momentum < 1 it has left
    its initial weights without reaching the student's new ones."""
    for k in teacher:
        assert torch.equal(before[k], before[_student_of(k)]), f"{name}: {k} did not start as the student"
    assert any(not torch.equal(v, before[k]) for k, v in teacher.items()), f"{name}: the teacher did not move"
    assert any(not torch.equal(v, after[_student_of(k)]) for k, v in teacher.items())


@pytest.mark.parametrize("path", CIFAR_PATHS + LARS_PATHS, ids=_ids)
def test_the_cifar_baseline_takes_a_training_step(path: Path, one_thread: None) -> None:
    """Backbone and method as the trainer builds them (``methods.build_method_model``), the config's optimizer
    over the trainable parameters (LARS: given the model), and one step on random 32 px views of the config's
    sizes: a finite loss, every trainable parameter updated except what a schedule freezes, and the momentum
    teacher (BYOL, DINO) moved towards the student."""
    cfg = load_config(path)
    torch.manual_seed(0)
    spe = CIFAR10_TRAIN_IMAGES // cfg.data.global_batch_size
    model = build_method_model(cfg.model, cfg.method, steps_per_epoch=spe)
    optimizer = _trainable_only(optimizer_factory(cfg.optim, model=model))(model.parameters())
    before = {k: v.detach().clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    preset = resolve_preset(cfg.data)
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(4, preset.channels, s, s, generator=g) for s in preset.view_sizes()]

    loss, _ = model(views)
    assert loss.dim() == 0 and torch.isfinite(loss), f"{path.name}: loss {loss}"
    loss.backward()
    model.method.before_optimizer_step()
    frozen = _frozen_at_step_0(cfg, model.method)
    params = dict(model.named_parameters())
    trainable = {k for k, p in params.items() if p.requires_grad}
    assert frozen <= trainable
    dropped = {k for k in trainable if params[k].grad is None}
    assert dropped == frozen, f"{path.name}: no gradient: {sorted(dropped - frozen)[:5]}, " \
                              f"not frozen: {sorted(frozen - dropped)[:5]}"
    assert all(torch.isfinite(params[k].grad).all() for k in trainable - frozen)
    optimizer.step()
    model.method.after_step(0, 1000, model.backbone)

    after = {k: p.detach() for k, p in model.named_parameters()}
    unchanged = {k for k in trainable if torch.equal(after[k], before[k])}
    assert not unchanged - frozen, f"{path.name}: not updated: {sorted(unchanged - frozen)[:5]}"
    assert all(torch.isfinite(p).all() for p in after.values())
    teacher = {k: v for k, v in after.items() if k.startswith("method.teacher_")}
    assert bool(teacher) == (cfg.method.name in ("byol", "dino"))
    assert not any(params[k].requires_grad for k in teacher)
    if teacher:
        _assert_the_teacher_followed(teacher, before, after, path.name)
    assert model.method.step == 1


@pytest.mark.parametrize("method", ["dino", "swav"])
def test_multi_crop_methods_refuse_local_views_as_large_as_the_global_ones(method):
    """DINO and SwaV tell the views apart by size: equal sizes would silently make every view global."""
    path = CONFIGS / "baselines" / f"{method}_cifar10.yaml"
    with pytest.raises(ConfigError, match=r"local crops \(32 px\) are not smaller than the global ones \(32 px\)"):
        load_config(path, ["data.local_crop_size=32"])
    assert load_config(path, ["data.local_crop_size=32", "data.num_local_views=0"]).data.num_local_views == 0


# ----------------------------------------------------------------------------------------------------------
# The large-batch LARS recipes
# ----------------------------------------------------------------------------------------------------------

# (base lr at batch 256, weight decay): SimCLR (Chen et al., 2020, appendix B.1), BYOL (Grill et al., 2020, 3.2).
LARS_RECIPES = {"simclr": (0.3, 1.0e-6), "byol": (0.2, 1.5e-6)}
LARS_KEYS = {"data.global_batch_size", "optim.name", "optim.lr", "optim.reference_batch_size", "optim.lr_scaling",
             "optim.weight_decay", "optim.schedule", "optim.warmup_epochs"}  # those that may differ


@pytest.mark.parametrize("path", LARS_PATHS, ids=_ids)
def test_the_lars_recipe_differs_from_its_adamw_config_in_batch_and_optimizer_only(path: Path) -> None:
    """The method's CIFAR-10 config with the recipe's global batch and LARS; every difference in the header."""
    method = path.stem.removesuffix("_cifar10_lars")
    base, ours = to_dict(load_config(CONFIGS / "baselines" / f"{method}_cifar10.yaml")), to_dict(load_config(path))
    base, ours = flatten(base), flatten(ours)
    assert ours.pop("run_dir") == f"runs/{path.stem}"
    differ = {k for k in ours if ours[k] != base[k]}
    assert differ <= LARS_KEYS, sorted(differ - LARS_KEYS)
    assert {"data.global_batch_size", "optim.name", "optim.lr_scaling", "optim.reference_batch_size"} <= differ
    header = _header(path)
    assert all(key in header for key in differ), sorted(k for k in differ if k not in header)
    assert f"configs/baselines/{path.name}" in header and "et al., 2020" in header


@pytest.mark.parametrize("path", LARS_PATHS, ids=_ids)
def test_the_lars_recipe_scales_warms_up_and_excludes_batchnorm_and_biases(path: Path, one_thread: None) -> None:
    """lr = base x B / 256 reached after 10 warm-up epochs, cosine to 0; LARS over the model as the trainer
    builds it, its BatchNorm parameters and biases in the group without weight decay (no trust ratio)."""
    method = path.stem.removesuffix("_cifar10_lars")
    cfg = load_config(path)
    o, batch = cfg.optim, cfg.data.global_batch_size
    assert (o.name, o.lr_scaling, o.reference_batch_size, o.schedule) == ("lars", "linear", 256, "cosine")
    assert batch >= 1024 and (o.lr, o.weight_decay) == LARS_RECIPES[method] and o.momentum == 0.9
    peak = LARS_RECIPES[method][0] * batch / 256
    lr, said = scaled_lr(o, batch)
    assert lr == pytest.approx(peak) and said is not None and f"x {batch}/256" in said
    spe = CIFAR10_TRAIN_IMAGES // batch
    lrs = lr_schedule(o, epochs=cfg.epochs, max_steps=0, steps_per_epoch=spe, global_batch=batch)
    warm = int(o.warmup_epochs * spe)
    assert o.warmup_epochs == 10 and lrs[warm] == pytest.approx(peak) and lrs[:warm].max() < peak
    assert lrs[-1] < 1e-3 * peak
    torch.manual_seed(0)
    model = build_method_model(cfg.model, cfg.method, steps_per_epoch=spe)
    optimizer = _trainable_only(optimizer_factory(o, model=model))(model.parameters())
    names = {id(p): n for n, p in model.named_parameters()}
    adapted, plain = optimizer.param_groups
    norms = {f"{n}." for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)}
    assert norms and {names[id(p)] for p in plain["params"]} == {
        n for n, p in model.named_parameters()
        if p.requires_grad and (n.endswith(".bias") or any(n.startswith(b) for b in norms))}
    assert (adapted["weight_decay"], plain["weight_decay"]) == (o.weight_decay, 0.0)
    assert not any(names[id(p)].startswith("method.teacher_") for p in adapted["params"] + plain["params"])
