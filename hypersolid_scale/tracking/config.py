"""The ``tracking`` section of the config, and its validation."""

from __future__ import annotations

from dataclasses import dataclass

from hypersolid_scale.errors import ConfigError


@dataclass
class TrackingConfig:
    """Where and how a run is tracked.

    tracking_uri: None means a SQLite store inside the run directory (``sqlite:///<run_dir>/mlflow.db``,
    artifacts in ``<run_dir>/mlartifacts``); any MLflow URI (``http://host:5000``, ``sqlite:///...``) works.
    run_name: None means ``<run_dir name>-<UTC start time>-<4 random hex digits>``, distinct for every run.
    log_every_n_steps: how often the trainer logs per-step metrics.
    sync_every_s: how long records may wait in the spool before being sent (batching); ``flush()`` and
    ``close()`` always send.
    """

    enabled: bool = True
    tracking_uri: str | None = None
    experiment: str = "hypersolid"
    run_name: str | None = None
    log_every_n_steps: int = 10
    sync_every_s: float = 5.0


def validate_config(cfg: TrackingConfig) -> None:
    """Raise ConfigError (a ValueError) naming the key and the fix for a value that cannot work."""
    if not cfg.experiment or not cfg.experiment.strip():
        raise ConfigError("tracking.experiment is empty; give the MLflow experiment a name, e.g. "
                          "tracking.experiment=hypersolid")
    if cfg.log_every_n_steps < 1:
        raise ConfigError(f"tracking.log_every_n_steps={cfg.log_every_n_steps}; it must be >= 1")
    if cfg.sync_every_s < 0:
        raise ConfigError(f"tracking.sync_every_s={cfg.sync_every_s}; it must be >= 0 (0 = send every call)")
