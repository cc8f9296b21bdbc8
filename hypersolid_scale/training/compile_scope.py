"""What ``dist.compile=true`` compiles: the whole step's module, the backbone alone, or nothing, and why.

The engine's wrapped module (:class:`~hypersolid_scale.training.run_builder.MethodModel`) is the backbone, the
method's heads and its loss in one forward, so compiling it lets Inductor fuse the loss with the heads, and
the backbone's BatchNorm, ReLU and residual add (their share of a ResNet step: issue 41) in forward and
backward. That is safe where the forward's graph is the same at every step: no host read that decides a
shape or a branch, no Python state that changes between steps. Where it is not, Dynamo recompiles (every
epoch, every step) or breaks the graph at each host read, and after ``torch._dynamo.config.recompile_limit``
recompilations it silently runs the frame eagerly. There the backbone alone is compiled (the fusions that
matter most in a ResNet step) and the method runs eagerly.

Each method says why its forward must not be compiled whole (:meth:`Method.whole_step_compile_refusal`, from
its ``compile_refusal``; Hypersolid asks its repulsion backend's ``compile_refusal``; empty: safe). The
scope chosen and the reason go into the run's parameters (``dist.compile_scope``, ``dist.compile_reason``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypersolid_scale.methods import get_method

SCOPES = ("off", "step", "backbone")


@dataclass(frozen=True)
class CompileScope:
    """``scope``: off (eager) | step (the engine's wrapped module: backbone, heads and loss) | backbone (the
    backbone alone; the method eager). ``reason``: why, in one line (empty when compiled as asked)."""

    scope: str
    reason: str = ""

    def params(self) -> dict[str, str]:
        """The run's parameters that record it."""
        return {"dist.compile_scope": self.scope, "dist.compile_reason": self.reason or "-"}

    def line(self) -> str | None:
        """Rank 0's start-up line when the step is compiled less than asked, else None."""
        if self.scope != "backbone":
            return None
        return f"[hypersolid] dist.compile=true compiles the backbone only: {self.reason}"


def compile_scope(cfg: Any) -> CompileScope:
    """The scope ``dist.compile`` gets in the run ``cfg`` (a ``Config``): see the module docstring."""
    if not cfg.dist.compile:
        return CompileScope("off")
    refusal = get_method(cfg.method.name).whole_step_compile_refusal(cfg.method.section())
    return CompileScope("backbone", refusal) if refusal else CompileScope("step")
