"""One study engine: a plan of train-then-evaluate runs (methods x seeds x overrides x budgets, as data), run as
child processes in N slots, resumably, with one state file (``hypersolid_scale.study.engine``).

- ``plan``: what a planned run is to the engine (:class:`PlannedRun`) and one evaluation of a checkpoint.
- ``protocol``: what a study tells the engine (:class:`Study`) and the engine tells it of a run (``RunProgress``).
- ``state``: the one state file (seconds over attempts, the stage reached, what is trained and evaluated).
- ``engine``: the slots, the budget, staged trainings, the evaluations of each checkpoint, stopping and resuming;
  ``files``: what it reads of a run's files (checkpoints, the line that says why a child failed).

Two studies run on it: ``launch/compare.py`` (``hypersolid_scale.compare``: every method at a matched budget) and
the replication study (``benchmarks/replication``: its plan, claims, judging and report). A study says what to
run and what a finished run's result is (:class:`~hypersolid_scale.study.engine.Study`); the engine runs it.
"""

from hypersolid_scale.study.engine import Engine
from hypersolid_scale.study.plan import Evaluation, PlannedRun
from hypersolid_scale.study.protocol import RunProgress, Study
from hypersolid_scale.study.state import StudyState

__all__ = ["Engine", "Evaluation", "PlannedRun", "RunProgress", "Study", "StudyState"]
