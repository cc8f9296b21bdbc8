"""MLflow tracking for a training run: one MLflow run per training run, logged by rank 0 only.

Every record (metrics of one step, params, tags, an artifact, a status change) is first appended to a
JSONL spool in ``<run_dir>/tracking/`` (a write-ahead log) and then sent to MLflow, in order, with
``MlflowClient.log_batch``. A watermark file remembers how far MLflow has the spool. So:

- a tracking server that goes away never stops training: sends fail fast (no client-side retries,
  short HTTP timeout), one warning is printed, and later calls retry with exponential backoff;
- when the server is back, the backlog is sent in order; nothing is lost or sent twice in effect
  (records carry their own timestamps, and MLflow drops exact duplicate metrics);
- a killed process loses nothing it logged: the next tracker on the same run (``resume_run_id``)
  sends what the dead one had not. ``python -m hypersolid_scale.tracking sync RUN_DIR`` does the
  same by hand.

The spool is append-only; a record torn by a kill is cut off when the spool is reopened.

Use (rank 0 gets an MLflow tracker, every other rank a no-op one with the same methods)::

    tracker = make_tracker(cfg.tracking, run_dir, rank=rank, resume_run_id=ckpt_run_id, tags={...})
    tracker.log_params(config_dict)              # nested dicts are flattened to "a.b.c"
    tracker.log_metrics({"loss": 0.5}, step)     # cheap: a spool append; sends every sync_every_s
    tracker.flush()                              # before a checkpoint: fsync + send; True if all sent
    tracker.close("FINISHED")                    # or "FAILED" / "KILLED"; sends the rest and ends the run

Calls come from one thread (the training loop). They raise ValueError for bad input, never because
MLflow is unreachable. Records refused by MLflow for good (e.g. a param whose value changed) are
dropped with a warning and stay in the spool.
"""

from __future__ import annotations

import json
import logging
import operator
import os
import posixpath
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from hypersolid_scale.nested import flatten

log = logging.getLogger(__name__)

# MLflow's own limits (mlflow.utils.validation); values beyond them are refused by the store.
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_KEY_LENGTH = 250
_BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
_VALID_KEY = re.compile(r"^[/\w.\- :]*$")
_TRUNCATED = "...[truncated]"
# The client must not hang training: one attempt per call (we retry with our own backoff), and a short
# timeout. Set only where the user has not chosen: the environment wins.
_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# Errors that mean "this record will never be accepted", as opposed to "the server is not there".
_PERMANENT_ERRORS = {
    "INVALID_PARAMETER_VALUE", "BAD_REQUEST", "INVALID_STATE", "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS", "MALFORMED_REQUEST",
}
_MAX_BACKOFF_S = 60.0


@dataclass
class TrackingConfig:
    """Where and how a run is tracked.

    tracking_uri: None means a SQLite store inside the run directory (``sqlite:///<run_dir>/mlflow.db``,
    artifacts in ``<run_dir>/mlartifacts``); any MLflow URI (``http://host:5000``, ``sqlite:///...``) works.
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
    if not cfg.experiment or not cfg.experiment.strip():
        raise ValueError("tracking.experiment is empty; give the MLflow experiment a name, e.g. "
                         "tracking.experiment=hypersolid")
    if cfg.log_every_n_steps < 1:
        raise ValueError(f"tracking.log_every_n_steps={cfg.log_every_n_steps}; it must be >= 1")
    if cfg.sync_every_s < 0:
        raise ValueError(f"tracking.sync_every_s={cfg.sync_every_s}; it must be >= 0 (0 = send every call)")


def git_commit(path: str | os.PathLike | None = None) -> str | None:
    """The commit checked out at ``path`` (default: this package's checkout), or None outside git."""
    cwd = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = out.stdout.strip()
    return sha if re.fullmatch(r"[0-9a-f]{40,64}", sha) else None


def _check_key(key: str, what: str) -> str:
    key = str(key)
    # MLflow stores names as file paths too, so they must be normalised relative paths ("a/b", not "a//b").
    if not key or len(key) > MAX_KEY_LENGTH or not _VALID_KEY.match(key) \
            or posixpath.normpath(key) != key or key.startswith(("/", "..")):
        raise ValueError(f"invalid {what} name {key!r}: use 1-{MAX_KEY_LENGTH} characters among letters, "
                         "digits, '_', '-', '.', ' ', ':' and '/', as a relative path without '//' or '..'")
    return key


def _truncate(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def _chunks(items: dict[str, Any], size: int) -> list[dict[str, Any]]:
    keys = list(items)
    return [{k: items[k] for k in keys[i:i + size]} for i in range(0, len(keys), size)]


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------
# Spool: the durable, append-only record log of one MLflow run
# ---------------------------------------------------------------------------------------------------

class _Spool:
    """``spool-<run_id>.jsonl`` + ``synced-<run_id>.json`` (byte offset up to which MLflow has it)."""

    def __init__(self, directory: Path, run_id: str, uri: str):
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.path = directory / f"spool-{run_id}.jsonl"
        self._mark_path = directory / f"synced-{run_id}.json"
        self.pending: deque[dict] = deque()
        synced = self._read_mark()
        if self.path.exists():
            self._load(synced)
        self._file = open(self.path, "ab")
        if self._file.tell() == 0:
            self._write({"kind": "open", "uri": uri, "run": run_id, "time": _now_ms()})
            self.mark_synced(self._file.tell())

    def _read_mark(self) -> int:
        try:
            return int(json.loads(self._mark_path.read_text())["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0  # no watermark: resend everything; sends are idempotent

    def _load(self, synced: int) -> None:
        size = self.path.stat().st_size
        if synced > size:
            synced = 0  # watermark newer than the file (writes lost in a machine crash): resend everything
        with open(self.path, "rb") as f:
            f.seek(synced)
            data = f.read()  # only what MLflow does not have yet
        end = data.rfind(b"\n") + 1
        if end < len(data):
            # A kill tore the last record while it was written: it was never complete, drop it.
            with open(self.path, "r+b") as f:
                f.truncate(synced + end)
        offset = synced
        for line in data[:end].splitlines(keepends=True):
            offset += len(line)
            try:
                record = json.loads(line)
            except ValueError:
                log.warning("skipping an unreadable record in %s at byte %d", self.path, offset - len(line))
                continue
            if record.get("kind") != "open":
                record["_end"] = offset
                self.pending.append(record)

    def _write(self, record: dict) -> None:
        line = json.dumps({k: v for k, v in record.items() if not k.startswith("_")}) + "\n"
        self._file.write(line.encode())
        # Hand it to the OS now: a killed process then loses nothing; fsync() covers a machine crash.
        self._file.flush()

    def append(self, record: dict) -> None:
        self._write(record)
        record["_end"] = self._file.tell()
        self.pending.append(record)

    def mark_synced(self, offset: int, durable: bool = False) -> None:
        tmp = self._mark_path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"offset": offset}, f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, self._mark_path)

    def fsync(self) -> None:
        """Make the spool durable, and the watermark too when MLflow has everything."""
        if self._file.closed:
            return
        os.fsync(self._file.fileno())
        if not self.pending:
            self.mark_synced(self._file.tell(), durable=True)

    def close(self) -> None:
        self.fsync()
        self._file.close()


# ---------------------------------------------------------------------------------------------------
# Sending spooled records to MLflow
# ---------------------------------------------------------------------------------------------------

class _Outbox:
    """Sends a spool's pending records in order; goes offline on failure and retries with backoff."""

    def __init__(self, client: Any, uri: str, run_id: str, spool: _Spool, sync_every_s: float):
        self.client, self.uri, self.run_id, self.spool = client, uri, run_id, spool
        self.sync_every_s = sync_every_s
        self.online = True
        self._backoff = 1.0
        self._retry_at = 0.0
        self._last_sync = time.monotonic()
        self.refused = 0
        self._refusals_warned: set[tuple[str, str]] = set()

    def sync(self, force: bool = False) -> bool:
        """Send what is due; True when nothing is left pending. Never raises for a missing server."""
        pending = self.spool.pending
        now = time.monotonic()
        if not pending:
            return True
        if not force and (now < self._retry_at or (
                self.online and now - self._last_sync < self.sync_every_s and len(pending) < 1000)):
            return False
        sent = 0
        while pending:
            batch = self._next_batch()
            try:
                self._send(batch)
            except Exception as err:  # noqa: BLE001 - any failure to reach the store is handled alike
                if not _is_permanent(err) or not self._send_one_by_one(batch):
                    self._went_offline(err, time.monotonic())
                    return False
            for _ in batch:
                pending.popleft()
            self.spool.mark_synced(batch[-1]["_end"])
            sent += len(batch)
        if not self.online:
            log.info("tracking server %s is back: sent %d buffered records", self.uri, sent)
        self.online, self._backoff, self._last_sync = True, 1.0, now
        return True

    def _next_batch(self) -> list[dict]:
        """The longest prefix of pending records that fits one log_batch call (or one other call)."""
        first = self.spool.pending[0]
        if first["kind"] not in _BATCH_LIMITS:
            return [first]
        counts = dict.fromkeys(_BATCH_LIMITS, 0)
        batch: list[dict] = []
        for record in self.spool.pending:
            kind = record["kind"]
            if kind not in _BATCH_LIMITS:
                break
            counts[kind] += len(record["values"])
            if batch and (counts[kind] > _BATCH_LIMITS[kind] or sum(counts.values()) > 1000):
                break
            batch.append(record)
        return batch

    def _send(self, batch: list[dict]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        kind = batch[0]["kind"]
        if kind == "artifact":
            staged = Path(batch[0]["staged"])
            if not staged.exists():
                raise FileNotFoundError(f"staged artifact {staged} is gone")
            self.client.log_artifact(self.run_id, str(staged), batch[0].get("artifact_path"))
            shutil.rmtree(staged.parent, ignore_errors=True)
        elif kind == "status":
            if batch[0]["status"] == "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.client.set_terminated(self.run_id, batch[0]["status"], end_time=batch[0]["time"])
        else:
            metrics = [Metric(k, v, r["time"], r["step"]) for r in batch if r["kind"] == "metrics"
                       for k, v in r["values"].items()]
            params = [Param(k, v) for r in batch if r["kind"] == "params" for k, v in r["values"].items()]
            tags = [RunTag(k, v) for r in batch if r["kind"] == "tags" for k, v in r["values"].items()]
            self.client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)

    def _send_one_by_one(self, batch: list[dict]) -> bool:
        """After a refusal, send each value alone and drop (with a warning) only those refused."""
        for record in batch:
            items = [{**record, "values": {k: v}} for k, v in record["values"].items()] \
                if "values" in record else [record]
            for item in items:
                try:
                    self._send([item])
                except Exception as err:  # noqa: BLE001
                    if not _is_permanent(err):
                        return False
                    self.refused += 1
                    reason = (record["kind"], getattr(err, "error_code", type(err).__name__))
                    if reason not in self._refusals_warned:  # once per kind of refusal, not per record
                        self._refusals_warned.add(reason)
                        log.warning("MLflow refused a %s record for run %s; dropped: %s",
                                    record["kind"], self.run_id, str(err).splitlines()[0])
        return True

    def _went_offline(self, err: Exception, now: float) -> None:
        if self.online:
            log.warning("tracking server %s is unreachable (%s); training goes on, records are kept in %s "
                        "and sent when it is back", self.uri, str(err).splitlines()[0][:200], self.spool.path)
        self.online = False
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)


def _require_mlflow() -> Any:
    """The ``mlflow`` module. Imported only when a run is really tracked: the package imports and trains
    without MLflow installed as long as tracking is off (``tracking.enabled=false``) or not on rank 0."""
    try:
        import mlflow
    except ImportError as err:
        raise ImportError("tracking.enabled=true needs MLflow, which is not installed: `pip install mlflow`, "
                          "or turn tracking off with tracking.enabled=false") from err
    return mlflow


def _client(uri: str) -> Any:
    MlflowClient = _require_mlflow().MlflowClient  # non-zero ranks never pay for importing MLflow

    if uri.startswith(("http://", "https://")):
        for name, value in _HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    return MlflowClient(tracking_uri=uri)


def _is_permanent(err: Exception) -> bool:
    if isinstance(err, FileNotFoundError):
        return True  # a staged artifact that vanished will never upload
    return getattr(err, "error_code", None) in _PERMANENT_ERRORS


# ---------------------------------------------------------------------------------------------------
# Trackers
# ---------------------------------------------------------------------------------------------------

class Tracker:
    """The tracker interface. This base does nothing: it is what non-zero ranks and ``enabled=False`` get."""

    run_id: str | None = None
    tracking_uri: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None: ...
    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None: ...
    def log_figure(self, figure: Any, artifact_file: str) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def flush(self) -> bool: return True
    def close(self, status: str = "FINISHED") -> None: ...


class MlflowTracker(Tracker):
    """Rank 0's tracker. Calls never raise because of the server; bad input raises ValueError."""

    def __init__(self, cfg: TrackingConfig, run_dir: Path, resume_run_id: str | None,
                 tags: Mapping[str, Any] | None):
        run_dir = Path(run_dir).resolve()
        run_dir.mkdir(parents=True, exist_ok=True)
        self.tracking_uri = cfg.tracking_uri or f"sqlite:///{run_dir}/mlflow.db"
        self._client = _client(self.tracking_uri)
        self._dir = run_dir / "tracking"
        self._closed = False
        server_down: Exception | None = None
        if resume_run_id:
            self.run_id = resume_run_id
            try:
                self._client.get_run(resume_run_id)
            except Exception as err:  # noqa: BLE001
                if getattr(err, "error_code", None) == "RESOURCE_DOES_NOT_EXIST":
                    raise ValueError(f"MLflow run {resume_run_id} does not exist in {self.tracking_uri}; "
                                     "resume with the tracking URI the run was started with") from err
                server_down = err  # the run id is known: go on offline, send when the server is back
        else:
            self.run_id = self._create_run(cfg, run_dir)
        spool = _Spool(self._dir, self.run_id, self.tracking_uri)
        self._outbox = _Outbox(self._client, self.tracking_uri, self.run_id, spool, cfg.sync_every_s)
        if server_down is not None:
            self._outbox._went_offline(server_down, time.monotonic())
        if resume_run_id:
            self._append({"kind": "status", "status": "RUNNING", "time": _now_ms()})
        commit = git_commit()
        self.set_tags({**({"mlflow.source.git.commit": commit} if commit else {}), **dict(tags or {})})
        self._outbox.sync(force=True)

    def _create_run(self, cfg: TrackingConfig, run_dir: Path) -> str:
        artifact_root = None
        if self.tracking_uri.startswith("sqlite:///"):
            # Without this MLflow puts artifacts in ./mlruns of whatever directory we were started from.
            db_dir = Path(self.tracking_uri[len("sqlite:///"):]).resolve().parent
            artifact_root = (db_dir / "mlartifacts").as_uri()
        try:
            experiment = self._client.get_experiment_by_name(cfg.experiment)
            if experiment is None:
                try:
                    experiment_id = self._client.create_experiment(cfg.experiment, artifact_location=artifact_root)
                except Exception as err:  # noqa: BLE001 - another process created it first
                    if getattr(err, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
                        raise
                    experiment_id = self._client.get_experiment_by_name(cfg.experiment).experiment_id
            else:
                experiment_id = experiment.experiment_id
            return self._client.create_run(experiment_id, run_name=cfg.run_name).info.run_id
        except Exception as err:  # noqa: BLE001
            raise RuntimeError(
                f"could not start an MLflow run at {self.tracking_uri}: {str(err).splitlines()[0][:300]}. "
                "Start the tracking server, fix tracking.tracking_uri, or set tracking.enabled=false"
            ) from err

    # -- logging --------------------------------------------------------------------------------------

    def _append(self, record: dict) -> None:
        if self._closed:
            raise RuntimeError(f"MLflow run {self.run_id}: the tracker is closed; create a new one with "
                               "make_tracker(..., resume_run_id=run_id) to log more")
        self._outbox.spool.append(record)

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log a (nested) config as params: keys joined with '.', values cut to MLflow's length limit."""
        values = {_check_key(k, "param"): _truncate(v, MAX_PARAM_VALUE_LENGTH) for k, v in flatten(params).items()}
        for chunk in _chunks(values, _BATCH_LIMITS["params"]):
            self._append({"kind": "params", "values": chunk})
        self._outbox.sync()

    def log_metrics(self, metrics: Mapping[str, Any], step: int) -> None:
        try:
            if isinstance(step, bool):
                raise TypeError
            step = operator.index(step)  # ints, numpy and torch integer scalars; not floats
        except TypeError:
            raise ValueError(f"step must be an int, got {step!r}") from None
        values: dict[str, float] = {}
        for key, value in metrics.items():
            key = _check_key(key, "metric")
            try:
                values[key] = float(value)
            except (TypeError, ValueError) as err:
                raise ValueError(f"metric {key!r} has value {value!r}; metrics must be numbers") from err
        now = _now_ms()
        for chunk in _chunks(values, _BATCH_LIMITS["metrics"]):
            self._append({"kind": "metrics", "step": step, "time": now, "values": chunk})
        self._outbox.sync()

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        values = {_check_key(k, "tag"): _truncate(v, MAX_TAG_VALUE_LENGTH) for k, v in tags.items()}
        for chunk in _chunks(values, _BATCH_LIMITS["tags"]):
            self._append({"kind": "tags", "values": chunk})
        self._outbox.sync()

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
        self._outbox.sync()

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """Save a matplotlib figure (PNG, or the format of the file's suffix) as artifact ``artifact_file``."""
        name = Path(artifact_file)
        if not name.suffix:
            name = name.with_suffix(".png")
        staged = self._stage_dir() / name.name
        figure.savefig(staged, dpi=120, bbox_inches="tight")
        parent = str(name.parent) if str(name.parent) != "." else None
        self._append({"kind": "artifact", "staged": str(staged), "artifact_path": parent})
        self._outbox.sync()

    def _stage_dir(self) -> Path:
        staging = self._dir / f"artifacts-{self.run_id}" / uuid.uuid4().hex[:12]
        staging.mkdir(parents=True)
        return staging

    def flush(self) -> bool:
        """Make the spool durable (fsync) and try to send everything now; True when MLflow has it all."""
        done = self._outbox.sync(force=True)
        self._outbox.spool.fsync()
        return done

    def close(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (FINISHED, FAILED, KILLED). Safe to call twice."""
        if self._closed:
            return
        if status not in {"FINISHED", "FAILED", "KILLED"}:
            raise ValueError(f"close(status={status!r}): use FINISHED, FAILED or KILLED")
        self._append({"kind": "status", "status": status, "time": _now_ms()})
        done = self.flush()
        self._closed = True
        self._outbox.spool.close()
        if self._outbox.refused:
            log.warning("MLflow refused %d logged values of run %s (see the warnings above); they remain in %s",
                        self._outbox.refused, self.run_id, self._outbox.spool.path)
        if not done:
            log.warning("%d tracking records are not in MLflow yet (%s unreachable); they are kept in %s and "
                        "sent by `python -m hypersolid_scale.tracking sync %s` or when this run resumes",
                        len(self._outbox.spool.pending), self.tracking_uri, self._outbox.spool.path,
                        self._dir.parent)


def make_tracker(cfg: TrackingConfig, run_dir: str | os.PathLike, *, rank: int,
                 resume_run_id: str | None = None, tags: Mapping[str, Any] | None = None) -> Tracker:
    """The run's tracker: an MLflow one on rank 0 (continuing ``resume_run_id`` if given), else a no-op."""
    validate_config(cfg)
    if rank != 0 or not cfg.enabled:
        return Tracker()
    _require_mlflow()  # fail before any file is written, with the fix in the message
    return MlflowTracker(cfg, Path(run_dir), resume_run_id, tags)


def sync_spool(run_dir: str | os.PathLike, tracking_uri: str | None = None) -> tuple[int, int]:
    """Send every record still pending in ``<run_dir>/tracking`` (to the URI each spool was written for,
    unless ``tracking_uri`` is given); not while a tracker on that run is open. Returns (sent, pending)."""
    sent = left = 0
    for path in sorted((Path(run_dir) / "tracking").glob("spool-*.jsonl")):
        run_id = path.stem[len("spool-"):]
        try:
            with open(path) as f:
                uri = tracking_uri or json.loads(f.readline())["uri"]
        except (ValueError, KeyError):
            log.warning("skipping %s: no readable header line naming its tracking URI", path)
            continue
        spool = _Spool(path.parent, run_id, uri)
        before = len(spool.pending)
        if before:
            _Outbox(_client(uri), uri, run_id, spool, 0.0).sync(force=True)
        sent, left = sent + before - len(spool.pending), left + len(spool.pending)
        spool.close()
    return sent, left


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4) or sys.argv[1] != "sync":
        sys.exit("usage: python -m hypersolid_scale.tracking sync RUN_DIR [TRACKING_URI]")
    n_sent, n_left = sync_spool(sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else None)
    print(f"sent {n_sent} tracking records; {n_left} still pending")
    sys.exit(1 if n_left else 0)
