"""What ``dist.compile=true`` compiles: the whole step's module, the backbone alone, or nothing, and why.

The engine's wrapped module (:class:`~hypersolid_scale.methods.MethodModel`) is the backbone, the
method's heads and its loss in one forward, so compiling it lets Inductor fuse the loss with the heads, and
the backbone's BatchNorm, ReLU and residual add (their share of a ResNet step: issue 41) in forward and
backward. That is safe where the forward's graph is the same at every step: no host read that decides a
shape or a branch, no Python state that changes between steps. Where it is not, Dynamo recompiles (every
epoch, every step) or breaks the graph at each host read, and after ``torch._dynamo.config.recompile_limit``
recompilations it silently runs the frame eagerly. There the backbone alone is compiled (the fusions that
matter most in a ResNet step) and the method runs eagerly.

Each method says why its forward must not be compiled whole (:meth:`Method.compile_refusal`, from its
section; Hypersolid asks its repulsion backend's ``compile_refusal``; empty: safe). The
scope chosen and the reason go into the run's parameters (``dist.compile_scope``, ``dist.compile_reason``).

``dist.compile_mode`` is torch.compile's mode. ``reduce-overhead`` (and ``max-autotune``) replay the compiled
forward and backward as CUDA graphs (torch's cudagraph trees, which copy the views into static input buffers);
the optimizer step, the non-finite guard and a teacher's EMA stay eager around them. One process only: with
several, DDP's bucketed all-reduce runs between the graphs, which is not checked with them here, so the mode
falls back to default, and the reason says so. Issue 41; docs/benchmarks.md, "CUDA graphs".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypersolid_scale.methods import get_method
from hypersolid_scale.safety.errors import ConfigError

SCOPES = ("off", "step", "backbone")


@dataclass(frozen=True)
class CompileScope:
    """``scope``: off (eager) | step (the engine's wrapped module: backbone, heads and loss) | backbone (the
    backbone alone; the method eager). ``reason``: why, in one line (empty when compiled as asked)."""

    scope: str
    reason: str = ""
    mode: str = "default"  # torch.compile's mode as run (dist.compile_mode, or default where it cannot be)

    @property
    def torch_mode(self) -> str | None:
        """The ``mode`` argument for torch.compile (None: its default)."""
        return None if self.mode == "default" else self.mode

    def params(self) -> dict[str, str]:
        """The run's parameters that record it."""
        return {
            "dist.compile_scope": self.scope,
            "dist.compile_reason": self.reason or "-",
            "dist.compile_mode_run": self.mode,
        }

    def line(self) -> str | None:
        """Rank 0's start-up line when the step is compiled less than asked, else None."""
        if not self.reason:
            return None
        what = "the backbone only" if self.scope == "backbone" else "the whole step"
        return f"[hypersolid] dist.compile=true compiles {what} (mode {self.mode}): {self.reason}"


def compile_scope(cfg: Any, world_size: int = 1) -> CompileScope:
    """The scope ``dist.compile`` gets in the run ``cfg`` (a ``Config``) over ``world_size`` processes: see the
    module docstring."""
    mode = cfg.dist.compile_mode
    if not cfg.dist.compile:
        if mode != "default":
            raise ConfigError(
                f"config key 'dist.compile_mode' = {mode!r} needs dist.compile=true (it is torch.compile's mode); "
                "set dist.compile=true or dist.compile_mode=default"
            )
        return CompileScope("off")
    reasons = []
    if mode != "default" and (world_size > 1 or cfg.dist.engine != "ddp"):
        where = f"{world_size} processes" if world_size > 1 else f"dist.engine={cfg.dist.engine}"
        reasons.append(
            f"dist.compile_mode={mode} runs as default with {where}: CUDA graphs are checked in one ddp process "
            "only (an all-reduce between the graphs is not)"
        )
        mode = "default"
    refusal = get_method(cfg.method.name).compile_refusal(cfg.method.section())
    if refusal:
        reasons.insert(0, refusal)
    return CompileScope("backbone" if refusal else "step", "; ".join(reasons), mode)
