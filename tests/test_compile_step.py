"""``dist.compile=true``: what it compiles for each method and Hypersolid backend (the whole step's module or the
backbone alone, and why: training/compile_scope.py), and that the compiled step gives eager's loss and gradients.

The step runs in float64 (``dist.precision=fp64``) so that "equal" can be tight: a compiler reorders sums, and in
float64 that moves a value by ~1e-15, far below any real difference. The Inductor test compiles a C++ kernel set
on the CPU (about a minute here: ``slow``); the others trace with torch's ``aot_eager`` backend, which captures
the same graphs (Dynamo, then AOTAutograd's forward and backward) and runs them without a C++ build: whether
a method's forward can be captured whole is decided there, not in Inductor's code generation.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from test_hot_path import TINY as HOT_PATH_TINY

import hypersolid_scale.training.trainer as train_mod
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.distributed import WorldInfo
from hypersolid_scale.losses.backends import backend_names
from hypersolid_scale.methods import method_names
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.training.compile_scope import compile_scope

TINY = [
    *HOT_PATH_TINY,
    "data.batch_size_per_gpu=8",
    "data.max_pretrain_samples=32",
    "dist.device=cpu",
    "dist.precision=fp64",
    "optim.name=sgd",
    "optim.lr=0.1",
]  # the hot-path tests' tiny run, smaller
# SGD: its update is the gradient times lr, so the parameters after two steps differ by what the gradients differ;
# Adam would scale a gradient that is 0 in exact arithmetic (float noise) up to a step of lr.
WHOLE = {"hypersolid", "simclr", "byol", "barlowtwins", "vicreg"}  # compiled whole: no host read, no changing state
EXACT = {"dense", "tiled"}  # the backends compiled with the loss


def _cfg(tmp_path: Path, *extra: str):
    return load_config(None, [*TINY, f"run_dir={tmp_path / 'run'}", *extra])


def test_the_scope_per_method_and_backend(tmp_path: Path) -> None:
    assert compile_scope(_cfg(tmp_path)).scope == "off"  # dist.compile=false: nothing compiled
    off = {"dist.compile_scope": "off", "dist.compile_reason": "-", "dist.compile_mode_run": "default"}
    assert compile_scope(_cfg(tmp_path)).params() == off
    for name in method_names():
        scope = compile_scope(_cfg(tmp_path, f"method.name={name}", "dist.compile=true"))
        assert scope.scope == ("step" if name in WHOLE else "backbone"), name
        assert (scope.reason == "") == (name in WHOLE), scope
        if name not in WHOLE:  # the reason names the key that decided it
            assert scope.reason.startswith(f"method.name={name}: ") and scope.line() is not None
    for backend in backend_names():
        scope = compile_scope(_cfg(tmp_path, f"method.hypersolid.backend={backend}", "dist.compile=true"))
        assert scope.scope == ("step" if backend in EXACT else "backbone"), backend
        if backend not in EXACT:
            assert scope.reason.startswith(f"method.hypersolid.backend={backend}: "), scope.reason
            assert scope.params()["dist.compile_reason"] == scope.reason


def _steps(tmp_path: Path, extra: list[str], steps: int = 2, device: str = "cpu") -> tuple:
    """Losses, the gradients the optimizer saw (per step, every parameter), and the final parameters."""
    cfg = _cfg(tmp_path, *extra)
    torch.manual_seed(0)
    run = train_mod.build(cfg, WorldInfo(0, 1, 0, "single"), torch.device(device))
    run.loader.set_epoch(0)
    batches = [views for views, _ in run.loader][:steps]
    assert len(batches) == steps
    seen: list[list[torch.Tensor]] = []
    params = [p for p in run.engine.model.parameters() if p.requires_grad]
    run.engine.optimizer.register_step_pre_hook(
        lambda *_: seen.append([torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params])
    )
    losses = []
    for i, views in enumerate(batches):
        views = [v.to(device, run.dtype, memory_format=run.memory_format) for v in views]
        losses.append(float(train_mod.train_step(run, views, i)["loss"]))
    return losses, [[g.cpu() for g in step] for step in seen], [p.detach().cpu() for p in params], run


def _assert_same(eager: tuple, compiled: tuple) -> None:
    (l0, g0, p0, _), (l1, g1, p1, _) = eager, compiled
    assert l1 == pytest.approx(l0, rel=1e-12, abs=1e-12)
    assert len(g0) == len(g1) == len(l0)
    for step0, step1 in zip(g0, g1):
        # float64 reordering moves a value by ~1e-15 of the step's largest gradient (some are 0 in exact
        # arithmetic, e.g. a bias before a BatchNorm, and ~1e-17 in floats): tolerances on that scale.
        scale = max(float(g.abs().max()) for g in step0)
        assert scale > 0  # the gradients compared are real ones
        for a, b in zip(step0, step1):
            torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-11 * scale)
    for a, b in zip(p0, p1):
        torch.testing.assert_close(b, a, rtol=1e-9, atol=1e-12)


def test_the_cuda_graph_mode_runs_where_it_is_checked(tmp_path: Path) -> None:
    graphs = ["dist.compile=true", "dist.compile_mode=reduce-overhead"]
    scope = compile_scope(_cfg(tmp_path, *graphs))
    assert (scope.scope, scope.mode, scope.torch_mode, scope.reason) == (
        "step",
        "reduce-overhead",
        "reduce-overhead",
        "",
    )
    assert compile_scope(_cfg(tmp_path, "dist.compile=true")).torch_mode is None  # torch.compile's own default
    for scope, where in (
        (compile_scope(_cfg(tmp_path, *graphs), world_size=2), "2 processes"),
        (
            compile_scope(_cfg(tmp_path, *graphs, "dist.engine=deepspeed", "dist.precision=fp32")),
            "dist.engine=deepspeed",
        ),
    ):
        assert (scope.scope, scope.mode) == ("step", "default")
        assert scope.reason.startswith(f"dist.compile_mode=reduce-overhead runs as default with {where}: ")
        assert scope.params()["dist.compile_mode_run"] == "default" and where in (scope.line() or "")
    dino = compile_scope(_cfg(tmp_path, *graphs, "method.name=dino"), world_size=2)
    assert dino.scope == "backbone" and dino.reason.startswith("method.name=dino: ") and "2 processes" in dino.reason
    with pytest.raises(ConfigError, match=r"dist.compile_mode.*needs dist.compile=true"):
        compile_scope(_cfg(tmp_path, "dist.compile_mode=reduce-overhead"))


@pytest.mark.slow
def test_the_inductor_compiled_step_gives_eager_loss_and_gradients(tmp_path: Path) -> None:
    """Hypersolid's default (dense backend), the whole step's module compiled by Inductor (C++ on the CPU)."""
    torch._dynamo.reset()
    eager = _steps(tmp_path / "eager", ["method.hypersolid.backend=dense"])
    compiled = _steps(tmp_path / "compiled", ["method.hypersolid.backend=dense", "dist.compile=true"])
    assert compiled[3].compile_scope.scope == "step"
    assert type(compiled[3].engine.wrapped).__name__ == "OptimizedModule"
    _assert_same(eager, compiled)


def _small(name: str, **dims: int) -> list[str]:
    """``method.name=name`` with heads a few units wide (the papers' 8192-unit heads take a minute in float64)."""
    return [f"method.name={name}", *(f"method.{name}.{k}={v}" for k, v in dims.items())]


CAPTURED = [
    ["method.hypersolid.backend=tiled", "method.hypersolid.tile_size=16"],
    _small("simclr", hidden_dim=32, out_dim=16),
    _small("byol", hidden_dim=32, out_dim=16),
    _small("vicreg", hidden_dim=32, out_dim=32),
    _small("barlowtwins", hidden_dim=32, out_dim=32),
    _small("dino", hidden_dim=32, bottleneck_dim=16, out_dim=64),
]


@pytest.mark.parametrize("extra", CAPTURED, ids=lambda e: e[0].split("=")[1])
def test_each_scope_captures_eager_loss_and_gradients(tmp_path: Path, monkeypatch, extra: list[str]) -> None:
    """The whole step (the methods compiled whole) or the backbone alone (dino, neighbors), traced by Dynamo and
    AOTAutograd (backend aot_eager: the graphs without Inductor's C++ build), over two steps: eager's values."""
    torch._dynamo.reset()
    eager = _steps(tmp_path / "eager", extra)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    compiled = _steps(tmp_path / "compiled", [*extra, "dist.compile=true"])
    run = compiled[3]
    expected = compile_scope(run.cfg).scope
    assert expected in ("step", "backbone")
    if expected == "step":
        assert type(run.engine.wrapped).__name__ == "OptimizedModule"
    else:  # the backbone compiled in place (its state dict's keys unchanged), the engine's module eager
        assert run.trained.backbone._compiled_call_impl is not None
        assert type(run.engine.wrapped).__name__ != "OptimizedModule"
        assert set(run.trained.state_dict()) == set(eager[3].trained.state_dict())
    _assert_same(eager, compiled)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_the_compiled_step_and_its_cuda_graphs_give_eager_loss_and_gradients(tmp_path: Path, mode: str) -> None:
    """On the GPU (Triton kernels, and with reduce-overhead the forward and backward replayed as CUDA graphs from
    static input buffers), three steps in float64: eager's losses, gradients and weights."""
    torch._dynamo.reset()
    cuda = ["dist.device=cuda", "method.hypersolid.backend=tiled"]
    eager = _steps(tmp_path / "eager", cuda, steps=3, device="cuda")
    compiled = _steps(tmp_path / "graphs", [*cuda, "dist.compile=true", f"dist.compile_mode={mode}"], 3, "cuda")
    assert compiled[3].compile_scope.mode == mode
    _assert_same(eager, compiled)
