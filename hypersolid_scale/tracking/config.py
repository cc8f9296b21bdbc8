"""The ``tracking`` section of the config, and its validation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hypersolid_scale.safety.errors import ConfigError


@dataclass
class TrackingConfig:
    """Where and how a run is tracked.

    tracking_uri: None means a SQLite store inside the run directory (``sqlite:///<run_dir>/mlflow.db``,
    artifacts in ``<run_dir>/mlartifacts``); any MLflow URI (``http://host:5000``, ``sqlite:///...``) works.
    run_name: None means ``<run_dir name>-<UTC start time>-<4 random hex digits>``, distinct for every run.
    parent_run_id: a new run is created as a child of this MLflow run (tag ``mlflow.parentRunId``; the MLflow UI
    nests it), e.g. one training of ``launch/compare.py``'s comparison. Ignored when a run is resumed.
    log_every_n_steps: how often the trainer logs per-step metrics.
    sync_every_s: how long records may wait in the spool before being sent (batching); ``flush()`` and
    ``close()`` always send.
    """

    enabled: bool = True
    tracking_uri: str | None = None
    experiment: str = "hypersolid"
    run_name: str | None = None
    parent_run_id: str | None = None
    log_every_n_steps: int = 10
    sync_every_s: float = 5.0


def validate_config(cfg: TrackingConfig) -> None:
    """Raise ConfigError (a ValueError) naming the key and the fix for a value that cannot work."""
    if not cfg.experiment or not cfg.experiment.strip():
        raise ConfigError(
            "tracking.experiment is empty; give the MLflow experiment a name, e.g. tracking.experiment=hypersolid"
        )
    if cfg.parent_run_id is not None and not re.fullmatch(r"[0-9a-f]{32}", str(cfg.parent_run_id)):
        raise ConfigError(
            f"tracking.parent_run_id={cfg.parent_run_id!r} is not an MLflow run id (32 hex digits); "
            "copy it from the parent run's page, or leave it out"
        )
    if cfg.log_every_n_steps < 1:
        raise ConfigError(f"tracking.log_every_n_steps={cfg.log_every_n_steps}; it must be >= 1")
    if cfg.sync_every_s < 0:
        raise ConfigError(f"tracking.sync_every_s={cfg.sync_every_s}; it must be >= 0 (0 = send every call)")
