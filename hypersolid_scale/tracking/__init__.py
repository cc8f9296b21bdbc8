"""MLflow tracking for a training run: one MLflow run per training run, logged by rank 0 only.

Every record (metrics of one step, params, tags, an artifact, a status change) is first appended to a
JSONL spool in ``<run_dir>/tracking/`` (a write-ahead log, ``spool.py``) and then sent to MLflow, in order,
with ``MlflowClient.log_batch`` (``outbox.py``). A watermark file remembers how far MLflow has the spool. So:

- a tracking server that goes away never stops training: sends fail fast (no client-side retries,
  short HTTP timeout), one warning is printed, and later calls retry with exponential backoff;
- when the server is back, the backlog is sent in order; nothing is lost or sent twice in effect
  (records carry their own timestamps, and MLflow drops exact duplicate metrics);
- a killed process loses nothing it logged: the next tracker on the same run (``resume_run_id``)
  sends what the dead one had not, and does not log again the (metric, step) pairs it had logged (the
  steps redone after the checkpoint). ``python -m hypersolid_scale.tracking sync RUN_DIR`` sends by hand;
- a run whose process was killed before any checkpoint named it is ended (sent, marked KILLED) by the
  next tracker started in the same directory (``recovery.py``), never left RUNNING;
- a store that cannot be used when a run starts (a server that is down, a SQLite store that is locked or
  being created by another process) does not stop training either: one line says so, the records wait in
  the spool under a local run id, and the run is created, and sent everything, when the store answers
  (``runs.py``). Only a tracking URI that cannot work (an unknown scheme, a host name that does not resolve,
  refused credentials) is a TrackingError (a UserError), raised before anything is written;
- a new SQLite store's schema is created by one process at a time (``<db>.lock``), so trainings that start
  together on a new store do not race to create it.

The spool is append-only; a record torn by a kill is cut off when the spool is reopened.

Use (rank 0 gets an MLflow tracker, every other rank a no-op one with the same methods)::

    tracker = make_tracker(cfg.tracking, run_dir, rank=rank, resume_run_id=ckpt_run_id, tags={...})
    tracker.log_params(config_dict)              # nested dicts are flattened to "a.b.c"
    tracker.log_metrics({"loss": 0.5}, step)     # cheap: a spool append; sends every sync_every_s
    tracker.flush()                              # before a checkpoint: fsync + send; True if all sent
    tracker.close("FINISHED")                    # or "FAILED" / "KILLED"; sends the rest and ends the run

Calls come from one thread (the training loop). They raise ValueError for bad input, never because
MLflow is unreachable. Records refused by MLflow for good (e.g. a param whose value changed) are
dropped with a warning and stay in the spool. Importing this package does not import MLflow.
"""

from hypersolid_scale.tracking.client import TrackingError
from hypersolid_scale.tracking.config import TrackingConfig, validate_config
from hypersolid_scale.tracking.metadata import default_run_name, git_commit
from hypersolid_scale.tracking.records import MAX_KEY_LENGTH, MAX_PARAM_VALUE_LENGTH, MAX_TAG_VALUE_LENGTH
from hypersolid_scale.tracking.recovery import close_abandoned_runs, sync_spool
from hypersolid_scale.tracking.tracker import MlflowTracker, Tracker, make_tracker

__all__ = [
    "MAX_KEY_LENGTH",
    "MAX_PARAM_VALUE_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "MlflowTracker",
    "Tracker",
    "TrackingConfig",
    "TrackingError",
    "close_abandoned_runs",
    "default_run_name",
    "git_commit",
    "make_tracker",
    "sync_spool",
    "validate_config",
]
