"""What the trainer calls on an engine (DDP or DeepSpeed), and ``build_engine``, which picks one by its name
(``dist.engine``) from the engines of this package: each module registers its own (``register_engine``), so a
new engine is one new module here.

Both engines *average* gradients over ranks. The loss returns the global loss and makes each rank's
local gradient P x its share of the global gradient (docs/design.md §3), so after averaging every rank holds the
gradient a single process would compute on the concatenated batch. Nothing here rescales gradients.

Interface (:class:`Engine`): ``forward(views) -> feats (B, V, D) float32`` (float64 for a float64 model) under
``autocast()``, ``backward(loss)``, ``step() -> grad norm or None`` (clips when asked, steps, zeroes the
gradients; the norm is a 0-dim tensor: read it only when logging, on CUDA a read waits for the GPU),
``param_groups`` (for the step-indexed lr / wd schedules), ``model`` (the unwrapped ``BackboneWithProjector``),
``train(mode)``, ``load_model_state(state_dict)`` (resume weights; under DeepSpeed it also refreshes the fp32
master copy), ``optimizer_state()`` / ``load_optimizer_state(state)`` (the whole state, gathered on rank 0: the
single-file checkpoint) and ``optimizer_pieces()`` / ``needed_ranges()`` / ``load_optimizer_pieces(...)`` (this
rank's part of it, per parameter by name: the sharded checkpoint, docs/design.md §5).
Parameters are fp32 under every engine (fp64 when the trainer converted the model, ``dist.precision=fp64``);
bf16 means autocast in ``forward``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from hypersolid_scale.config.registry import DEFAULT_ORDER, Registry
from hypersolid_scale.distributed.batchnorm import convert_batchnorm

OptimizerFn = Callable[[Any], torch.optim.Optimizer]


@dataclass(frozen=True)
class EngineOptions:
    """What ``build_engine`` is told; each engine's ``__init__(model, optimizer_fn, options)`` takes what it uses."""

    device: torch.device
    bf16: bool
    grad_clip: float
    compile: bool = False
    compile_mode: str | None = None  # torch.compile's mode (None: its default)
    zero_stage: int = 0
    batch_size_per_gpu: int = 1
    accumulate_steps: int = 1


class Engine(Protocol):
    """One training engine. The two implementations subclass it and share the methods written here.

    Attributes:
        model: the unwrapped module (its ``state_dict`` is the checkpoint's model state).
        wrapped: what the training step calls under :meth:`autocast` (the DDP wrapper, DeepSpeed's engine, or
            ``model`` itself).
        optimizer: the torch optimizer the engine was built with; its param_groups drive the schedules.
    """

    kind: ClassVar[str]  # its dist.engine name
    order: ClassVar[int] = DEFAULT_ORDER  # its place in engine_names() (the default first)
    model: nn.Module
    wrapped: nn.Module
    optimizer: torch.optim.Optimizer
    device: torch.device
    bf16: bool

    def __init__(self, model: nn.Module, optimizer_fn: OptimizerFn, options: EngineOptions) -> None:
        """The engine around ``model`` (its BatchNorms already converted), with the options it uses."""

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        # Under ZeRO these are still the client optimizer's groups, so lr / wd set here take effect.
        return self.optimizer.param_groups

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the engine's device when enabled; the parameters stay fp32 under every engine."""
        if not self.bf16:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def train(self, mode: bool = True) -> None:
        self.wrapped.train(mode)

    def backward(self, loss: torch.Tensor) -> None: ...

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        """Around the forward AND backward of one micro-batch of an accumulated step (docs/design.md §3d): the
        gradients are only averaged over ranks in the ``last`` one's backward. Default (one process): nothing."""
        return contextlib.nullcontext()

    def step(self) -> torch.Tensor | None: ...

    def optimizer_state(self) -> dict[str, Any] | None: ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None: ...

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None: ...

    # The optimizer state by parameter name, flattened: what a sharded checkpoint stores, whatever the engine, the
    # world size or a ZeRO partition's layout. Written here for an optimizer that every rank holds whole (DDP,
    # ZeRO 0); DeepSpeed's ZeRO 1/2 hold a slice of each parameter's state and say which.
    @property
    def replicated_optimizer(self) -> bool:
        """Whether every rank holds the whole optimizer state (else a slice of it, ZeRO 1/2)."""
        return True

    def _named_optimizer_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The optimizer's parameters in its index order (the param_groups' order), each with its model name."""
        names = {id(p): n for n, p in self.model.named_parameters()}
        return [(names[id(p)], p) for g in self.optimizer.param_groups for p in g["params"]]

    def optimizer_pieces(self) -> tuple[Pieces, dict[str, Any]]:
        """``(pieces, plain)``: ``pieces[name][key] = (first, flat)``, the elements ``first .. first + len(flat)``
        of parameter ``name``'s optimizer tensor ``key`` (flattened) that this rank holds; ``plain``: what every
        rank holds alike (``param_groups`` with parameter names, each parameter's non-tensor and 0-dim state)."""
        named = self._named_optimizer_params()
        sd = self.optimizer.state_dict()
        pieces: Pieces = {}
        scalars: dict[str, dict[str, Any]] = {}
        for index, state in sd["state"].items():
            name, param = named[index]
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == param.numel():
                    pieces.setdefault(name, {})[key] = (0, value.detach().reshape(-1))
                else:
                    scalars.setdefault(name, {})[key] = value
        groups = [{**g, "params": [named[i][0] for i in g["params"]]} for g in sd["param_groups"]]
        return pieces, {"param_groups": groups, "scalars": scalars}

    def needed_ranges(self) -> dict[str, tuple[int, int]]:
        """The elements of each parameter's optimizer state this rank loads: all of them here."""
        return {name: (0, p.numel()) for name, p in self._named_optimizer_params()}

    def load_optimizer_pieces(self, pieces: dict[str, dict[str, tuple[int, torch.Tensor]]], plain: dict) -> None:
        """Put back what :meth:`optimizer_pieces` saved (on any world size): ``pieces[name][key] = (first,
        flat)`` must cover :meth:`needed_ranges`."""
        named = self._named_optimizer_params()
        state: dict[int, dict[str, Any]] = {}
        for index, (name, param) in enumerate(named):
            entry = dict(plain["scalars"].get(name, {}))
            for key, (first, flat) in pieces.get(name, {}).items():
                if key == "master":  # a ZeRO run's fp32 master weights: here the parameters themselves
                    continue
                entry[key] = covering_slice(flat, first, 0, param.numel(), name, key).reshape(param.shape).clone()
            if entry:
                state[index] = entry
        position = {name: i for i, (name, _) in enumerate(named)}
        groups = [{**g, "params": [position[n] for n in g["params"]]} for g in plain["param_groups"]]
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})


Pieces = dict[str, dict[str, tuple[int, torch.Tensor]]]


def covering_slice(flat: torch.Tensor, first: int, lo: int, hi: int, name: str, key: str) -> torch.Tensor:
    """Elements ``lo .. hi`` of a parameter's flattened state, from a piece holding ``first ..``."""
    if first > lo or first + flat.numel() < hi:
        raise ValueError(
            f"the checkpoint holds elements {first}..{first + flat.numel()} of {name}'s optimizer state {key!r}, "
            f"this rank needs {lo}..{hi}"
        )
    return flat[lo - first : hi - first]


_ENGINES: Registry[type[Engine]] = Registry("engine", "dist.engine", __name__)
E = TypeVar("E", bound=type[Engine])


def register_engine(cls: E) -> E:
    """Class decorator: make ``cls`` the engine named ``cls.kind``."""
    _ENGINES.register(cls.kind, cls)
    return cls


def unregister_engine(name: str) -> type[Engine] | None:
    """Remove the engine ``name`` (one registered at run time, by a test or a script); returns it."""
    return _ENGINES.unregister(name)


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, the default (ddp) first."""
    return _ENGINES.names()


def grad_norm_tensor(norm: Any, device: torch.device) -> torch.Tensor | None:
    """The grad norm as a 0-dim tensor on ``device``, without a host sync (DeepSpeed reports a tensor, a float
    or None; a float is written straight into a device tensor, not copied from a host one)."""
    if norm is None:
        return None
    if isinstance(norm, torch.Tensor):
        return norm.detach().reshape(())
    return torch.full((), float(norm), device=device)


def build_engine(
    model: nn.Module,
    optimizer_fn: OptimizerFn,
    *,
    engine: str,
    device: torch.device,
    bf16: bool,
    grad_clip: float,
    sync_bn: str | bool = "auto",
    compile: bool = False,
    compile_mode: str | None = None,
    zero_stage: int = 0,
    batch_size_per_gpu: int = 1,
    accumulate_steps: int = 1,
) -> Engine:
    """``optimizer_fn(params) -> torch.optim.Optimizer`` is called once the model sits on its device.

    ``sync_bn`` (auto | true | false, see :func:`convert_batchnorm`) converts the BatchNorms here, once,
    before either engine wraps the model or builds its optimizer over the parameters. ``compile_mode``:
    torch.compile's mode under the ddp engine (None: its default; DeepSpeed compiles in its own default).
    """
    chosen = _ENGINES.get(engine)  # a ConfigError naming the registered engines
    model = convert_batchnorm(model, sync_bn, device)
    options = EngineOptions(
        device, bf16, grad_clip, compile, compile_mode, zero_stage, batch_size_per_gpu, accumulate_steps
    )
    return chosen(model, optimizer_fn, options)  # each engine's __init__(model, optimizer_fn, options)
