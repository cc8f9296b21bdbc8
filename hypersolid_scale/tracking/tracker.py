"""The trackers: ``MlflowTracker`` on rank 0, the no-op ``Tracker`` everywhere else, and ``make_tracker``."""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypersolid_scale.config.nested import flatten
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.tracking.client import config_mistake, is_remote, make_client, outage_reason, require_mlflow
from hypersolid_scale.tracking.config import TrackingConfig, validate_config
from hypersolid_scale.tracking.metadata import default_run_name, git_commit
from hypersolid_scale.tracking.outbox import Outbox
from hypersolid_scale.tracking.records import (
    BATCH_LIMITS,
    MAX_PARAM_VALUE_LENGTH,
    MAX_TAG_VALUE_LENGTH,
    TERMINAL_STATUSES,
    check_key,
    check_metrics,
    check_step,
    chunks,
    now_ms,
    truncate,
)
from hypersolid_scale.tracking.recovery import close_abandoned_runs
from hypersolid_scale.tracking.runs import find_created, find_spool, open_run, pending_spec, run_spec, spool_run_id
from hypersolid_scale.tracking.spool import LoggedSteps, Spool, read_header, spool_path

log = logging.getLogger(__name__)


class Tracker:
    """The tracker interface. This base does nothing: it is what non-zero ranks and ``enabled=False`` get."""

    run_id: str | None = None
    tracking_uri: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None: ...
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None: ...
    def log_figure(self, figure: Any, artifact_file: str) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def flush(self) -> bool:
        return True

    def close(self, status: str | None = "FINISHED") -> None: ...


class MlflowTracker(Tracker):
    """Rank 0's tracker. Calls never raise because of the store; bad input raises ValueError.

    A store that cannot be used at start (a server that is down, a SQLite store that is locked or that another
    process is creating) does not stop training: the records wait in the spool, under a local run id until
    the run can be created (``runs.py``), and are sent when the store answers. Only a configuration mistake
    (``client.config_mistake``: an unsupported URI, a host name that does not resolve, refused credentials)
    raises TrackingError (a UserError), before anything is written to the run directory.
    """

    tracking_uri: str  # always set here

    def __init__(
        self,
        cfg: TrackingConfig,
        run_dir: Path,
        resume_run_id: str | None,
        tags: Mapping[str, Any] | None,
        *,
        attach: bool = False,
    ):
        run_dir = Path(run_dir).resolve()
        self.tracking_uri = uri = cfg.tracking_uri or f"sqlite:///{run_dir}/mlflow.db"
        self._dir = run_dir / "tracking"
        self._closed = False
        self._skip_noted = False
        if not is_remote(uri):
            run_dir.mkdir(parents=True, exist_ok=True)  # the default SQLite store lives in it
        client: Any = None
        failure: Exception | None = None
        to_create: dict | None = None  # the run is not created yet: what creating it needs
        spec = run_spec(cfg.experiment, cfg.run_name or default_run_name(run_dir), cfg.parent_run_id)
        try:
            client = make_client(uri)
            if resume_run_id:
                self.run_id, to_create = self._find_run(client, cfg, resume_run_id)
            else:
                self.run_id = open_run(client, uri, spec)
        except ConfigError:
            raise
        except Exception as err:  # noqa: BLE001
            mistake = config_mistake(uri, err)
            if mistake is not None:
                raise mistake from None  # one message with the fixes, not the client's chain of tracebacks
            failure = err
            if resume_run_id:  # its id is known: go on offline, send when the store is back
                self.run_id, to_create = self._find_local(resume_run_id)
            else:  # a local id until the store answers
                self.run_id, to_create = uuid.uuid4().hex, spec
        # What earlier processes of this run logged: a resumed training redoes the steps after its checkpoint,
        # and a (metric, step) is logged once per run. Read before this process appends anything. Only the
        # spool of the tracker that created the run (the training's own) counts: an offline evaluation that
        # resumes the run into its own directory and evaluates a checkpoint again logs its new values.
        path = spool_path(self._dir, self.run_id)
        header = read_header(path) if resume_run_id else None
        self._logged = LoggedSteps.scan(path) if header is not None and header["created"] else None
        spool = Spool(self._dir, self.run_id, uri, created=not resume_run_id, exclusive=False, pending=to_create)
        self._outbox = Outbox(client, uri, self.run_id, spool, cfg.sync_every_s, to_create)
        if failure is not None:
            self._outbox.went_offline(failure, time.monotonic(), announce=bool(resume_run_id))
            if not resume_run_id:
                log.warning(
                    "could not start the MLflow run at %s (%s); training goes on: its records are kept in %s "
                    "and sent when the store answers (or by `python -m hypersolid_scale.tracking sync %s`)",
                    uri,
                    outage_reason(failure),
                    spool.path,
                    run_dir,
                )
        if resume_run_id and not attach:  # attached (an evaluation): the run's status stays the training's
            self._append({"kind": "status", "status": "RUNNING", "time": now_ms()})
        commit = git_commit()
        self.set_tags({**({"mlflow.source.git.commit": commit} if commit else {}), **dict(tags or {})})
        self._sync(force=failure is None)
        close_abandoned_runs(self._dir, keep={self.run_id})

    def _find_local(self, run_id: str) -> tuple[str, dict | None]:
        """The run to resume as this directory's spools know it: (its id, what creating it needs if it is not
        created yet). A local id whose run was created since is the run's id."""
        path = find_spool(self._dir, run_id)
        if path is None:
            return run_id, None
        return spool_run_id(path), pending_spec(path, read_header(path))

    def _find_run(self, client: Any, cfg: TrackingConfig, run_id: str) -> tuple[str, dict | None]:
        run_id, to_create = self._find_local(run_id)
        if to_create is not None:
            return run_id, to_create
        try:
            client.get_run(run_id)
        except Exception as err:
            if getattr(err, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
            created = find_created(client, cfg.experiment, run_id)  # a local id, resumed elsewhere
            if created is None:
                raise ConfigError(
                    f"MLflow run {run_id} does not exist in {self.tracking_uri}; "
                    "resume with the tracking URI the run was started with"
                ) from None
            run_id = created
        return run_id, None

    def _sync(self, force: bool = False) -> bool:
        done = self._outbox.sync(force=force)
        self.run_id = self._outbox.run_id  # the run's id once a run that was not created at start is created
        return done

    # -- logging --------------------------------------------------------------------------------------

    def _append(self, record: dict) -> None:
        if self._closed:
            raise RuntimeError(
                f"MLflow run {self.run_id}: the tracker is closed; create a new one with "
                "make_tracker(..., resume_run_id=run_id) to log more"
            )
        self._outbox.spool.append(record)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log a (nested) config as params: keys joined with '.', values cut to MLflow's length limit."""
        values = {check_key(k, "param"): truncate(v, MAX_PARAM_VALUE_LENGTH) for k, v in flatten(params).items()}
        for chunk in chunks(values, BATCH_LIMITS["params"]):
            self._append({"kind": "params", "values": chunk})
        self._sync()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log metrics at ``step``. On a resumed training run, a (key, step) that an earlier process of the run
        logged (in this run directory) is skipped: each is logged once per run."""
        step = check_step(step)
        values = check_metrics(metrics)
        if self._logged is not None:
            # Steps redone after a resume: deterministic resume gives the values already logged, and MLflow
            # keeps every (key, step, timestamp), so logging them again would double the history.
            kept = {k: v for k, v in values.items() if (k, step) not in self._logged}
            if len(kept) < len(values) and not self._skip_noted:
                self._skip_noted = True
                log.info(
                    "run %s: not logging again the steps an earlier process of this run logged (from "
                    "step %d on, redone after the resume)",
                    self.run_id,
                    step,
                )
            values = kept
        now = now_ms()
        for chunk in chunks(values, BATCH_LIMITS["metrics"]):
            self._append({"kind": "metrics", "step": step, "time": now, "values": chunk})
        self._sync()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        values = {check_key(k, "tag"): truncate(v, MAX_TAG_VALUE_LENGTH) for k, v in tags.items()}
        for chunk in chunks(values, BATCH_LIMITS["tags"]):
            self._append({"kind": "tags", "values": chunk})
        self._sync()

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a file or directory. A copy is staged at once, so later changes to ``path`` don't leak in."""
        source = Path(path)
        if not source.exists():
            raise ValueError(f"cannot log artifact {source}: no such file or directory")
        staged = self._stage_dir() / source.name
        if source.is_dir():
            shutil.copytree(source, staged)
        else:
            shutil.copy2(source, staged)
        self._append({"kind": "artifact", "staged": str(staged), "artifact_path": artifact_path})
        self._sync()

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib figure (PNG, or the format of the file's suffix) as artifact ``artifact_file``."""
        name = Path(artifact_file)
        if not name.suffix:
            name = name.with_suffix(".png")
        staged = self._stage_dir() / name.name
        figure.savefig(staged, dpi=120, bbox_inches="tight")
        parent = str(name.parent) if str(name.parent) != "." else None
        self._append({"kind": "artifact", "staged": str(staged), "artifact_path": parent})
        self._sync()

    def _stage_dir(self) -> Path:
        staging = self._dir / f"artifacts-{self.run_id}" / uuid.uuid4().hex[:12]
        staging.mkdir(parents=True)
        return staging

    def flush(self) -> bool:
        """Make the spool durable (fsync) and try to send everything now; True when MLflow has it all."""
        done = self._sync(force=True)
        self._outbox.spool.fsync()
        return done

    def close(self, status: str | None = "FINISHED") -> None:
        """End the run with ``status`` (FINISHED, FAILED, KILLED), or send what is left and leave the run's
        status as it is (None: an evaluation attached to a training that may still be running). Safe to call
        twice."""
        if self._closed:
            return
        if status is not None and status not in TERMINAL_STATUSES:
            raise ValueError(f"close(status={status!r}): use FINISHED, FAILED or KILLED (or None)")
        if status is not None:
            self._append({"kind": "status", "status": status, "time": now_ms()})
        done = self.flush()
        self._closed = True
        self._outbox.spool.close()
        if self._outbox.refused:
            log.warning(
                "MLflow refused %d logged values of run %s (see the warnings above); they remain in %s",
                self._outbox.refused,
                self.run_id,
                self._outbox.spool.path,
            )
        if not done:
            log.warning(
                "%d tracking records are not in MLflow yet (%s unreachable); they are kept in %s and "
                "sent by `python -m hypersolid_scale.tracking sync %s` or when this run resumes",
                len(self._outbox.spool.pending),
                self.tracking_uri,
                self._outbox.spool.path,
                self._dir.parent,
            )


def make_tracker(
    cfg: TrackingConfig,
    run_dir: str | os.PathLike,
    *,
    rank: int,
    resume_run_id: str | None = None,
    tags: Mapping[str, Any] | None = None,
    attach: bool = False,
) -> Tracker:
    """The run's tracker: an MLflow one on rank 0 (continuing ``resume_run_id`` if given), else a no-op.

    ``attach``: log into ``resume_run_id`` without marking it RUNNING (an evaluation of a training's checkpoint;
    close it with ``close(None)`` to leave the training's status alone).

    Raises ConfigError for a bad config, TrackingError (both UserErrors) for a tracking URI that cannot work
    (``client.config_mistake``), ImportError when MLflow is missing; in each case nothing is written. A store
    that is down or busy at start is not an error: the run is created, and its records sent, when it answers.
    """
    validate_config(cfg)
    if rank != 0 or not cfg.enabled:
        return Tracker()
    require_mlflow()  # fail before any file is written, with the fix in the message
    return MlflowTracker(cfg, Path(run_dir), resume_run_id, tags, attach=attach)
