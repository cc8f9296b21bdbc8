"""What the study engine needs of a planned run, and one evaluation of a checkpoint.

A study's plan is its own data (the comparison's ``Training``, the replication study's ``Run``): any frozen
dataclass with a unique ``name``, the ``epochs`` it trains (0 when its budget is a step count: the engine's time
estimate then counts its start-up only) and the epochs at which it pauses (``pause_epochs``: every run of the
plan reaches a stage before any goes on).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


class PlannedRun(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def epochs(self) -> int: ...

    @property
    def pause_epochs(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class Evaluation:
    """One evaluation of one checkpoint of a run: ``cmd`` writes ``out/report.json`` (``launch/eval.py
    --output-dir out``). ``key`` names it among the run's evaluations (the state file records it as done);
    ``protocol`` is what it measures (a suite, a protocol, a diagnosis), ``epoch`` where the checkpoint sits
    (fractional for a step inside an epoch)."""

    key: str
    cmd: tuple[str, ...]
    out: Path
    step: int
    epoch: float = 0
    protocol: str = ""

    @property
    def report(self) -> Path:
        return self.out / "report.json"
