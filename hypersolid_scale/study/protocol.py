"""What a study tells the engine (:class:`Study`), and what the engine tells it back of a run (:class:`RunProgress`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hypersolid_scale.study.plan import Evaluation


class Study(Protocol):
    """What a study tells the engine about its runs (the engine asks nothing else)."""

    def run_dir(self, run: Any) -> Path:
        """The trainer's ``run_dir`` (its checkpoints)."""
        ...

    def train_log(self, run: Any) -> Path: ...

    def train_command(self, run: Any) -> list[str]: ...

    def processes(self, run: Any) -> int:
        """Processes per training (the cores are shared among them)."""
        ...

    def evaluations(self, run: Any, final_step: int, upto: int | None) -> tuple[list[Evaluation], list[str]]:
        """The evaluations of a training that reached ``final_step``, or of a staged one paused at epoch ``upto``,
        and why any planned one cannot run (a missing checkpoint)."""
        ...

    def eval_log(self, run: Any, ev: Evaluation) -> Path: ...

    def is_trained(self, run: Any, record: dict[str, Any]) -> bool:
        """True: the run's training is not run again (``record``: its entry in the state file)."""
        ...

    def is_finished(self, run: Any) -> bool:
        """True: nothing of the run is looked at again (its result exists)."""
        ...

    def trained_error(self, run: Any, final_step: int) -> str | None:
        """Why a training that exited 0 at ``final_step`` is not what was planned (None: it is)."""
        ...

    def keep_checkpoints(self, run: Any, steps_per_epoch: int) -> set[int] | None:
        """The checkpoints of a running training that will be read (the others are deleted; None: keep all)."""
        ...

    def finished(self, progress: RunProgress) -> None:
        """Every evaluation of the run (or of its stage) is done: write its result."""
        ...


@dataclass
class RunProgress:
    """One run in this invocation: its record in the state file, this invocation's seconds, its evaluations."""

    run: Any
    record: dict[str, Any]
    train_cmd: list[str]
    train_s: float = 0.0  # this invocation's training seconds (its last attempt)
    eval_s: float = 0.0
    pending: int = 0
    evaluated: dict[str, tuple[Evaluation, dict[str, Any], float]] = field(default_factory=dict)  # key -> report
    stage_epoch: int = 0  # paused after this epoch (its result so far); 0: trained to the end
    failed: str = ""
