"""The MLflow client: imported only when a run is really tracked, set up to fail fast; a new SQLite store's
schema created by one process at a time (a copy of a cached empty store, ``sqlite_seed.py``); and the failures
at start told apart: a configuration mistake is one message that says what is wrong and how to fix it,
anything else is an outage the tracker waits out."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypersolid_scale.safety.errors import UserError
from hypersolid_scale.tracking.sqlite_seed import seed_new_store

# The client must not hang training: one attempt per call (the outbox retries with its own backoff), and a
# short timeout. Set only where the user has not chosen: the environment wins.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
# MLflow's answers at start that waiting does not change: a bad URI or name, missing credentials or rights.
CONFIG_ERRORS = {
    "INVALID_PARAMETER_VALUE",
    "INVALID_STATE",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "ENDPOINT_NOT_FOUND",
}
_UNKNOWN_HOST = "unknown host name"
# How long a start waits for another process that creates the SQLite store's schema (seconds, normally).
_INIT_LOCK_WAIT_S = 120.0


class TrackingError(UserError, RuntimeError):
    """A tracking URI that cannot work (``config_mistake``), or a hand sync of a spool a live tracker holds."""


def require_mlflow() -> Any:
    """The ``mlflow`` module. Imported only when a run is really tracked: the package imports and trains
    without MLflow installed as long as tracking is off (``tracking.enabled=false``) or not on rank 0."""
    try:
        import mlflow
    except ImportError as err:
        raise ImportError(
            "tracking.enabled=true needs MLflow, which is not installed: `pip install mlflow`, "
            "or turn tracking off with tracking.enabled=false"
        ) from err
    return mlflow


def is_remote(uri: str) -> bool:
    """Whether the store is reached over the network (as opposed to a local SQLite or file store)."""
    return "://" in uri and not uri.startswith(("sqlite:", "file:"))


def make_client(uri: str) -> Any:
    """The client of ``uri``. Raises what MLflow raises when the store cannot be opened (see ``config_mistake``)."""
    MlflowClient = require_mlflow().MlflowClient  # non-zero ranks never pay for importing MLflow

    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    with _schema_lock(uri):
        db = _sqlite_file(uri)
        if db is not None:
            seed_new_store(db)  # a copy of an empty store at MLflow's schema: no migrations to replay
        try:
            return MlflowClient(tracking_uri=uri)  # opens the store; a new SQLite one gets its schema here
        except Exception:
            _forget_engine(uri)
            raise


def _forget_engine(uri: str) -> None:
    """Drop MLflow's cached SQLAlchemy engine of a SQLite store that failed to open: its pooled connection
    would keep reading the file it opened (e.g. a damaged store that has since been replaced) in every later
    try of this process. A no-op where MLflow keeps no such cache."""
    if _sqlite_file(uri) is None:
        return
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        engine = getattr(SqlAlchemyStore, "_engine_map", {}).pop(uri, None)
        if engine is not None:
            engine.dispose()
    except Exception:  # noqa: BLE001 - only a cache
        pass


def _sqlite_file(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return Path(path) if path and path != ":memory:" else None


@contextmanager
def _schema_lock(uri: str) -> Iterator[None]:
    """Held while MLflow opens a SQLite store: ``<db>.lock`` next to the file, ``flock``-ed.

    MLflow creates the schema of a new SQLite store when it first opens it, with no lock of its own, so two
    processes that open a new store at once both run the migrations: one fails ("table ... already exists",
    "Online migration expected to match one row"), and the store can be left half-migrated for good. Under
    this lock the second one finds the schema complete. Where no lock can be had (a read-only directory, a
    filesystem without flock, a holder stuck for minutes) MLflow opens the store unguarded, as before.
    """
    db = _sqlite_file(uri)
    fd = None
    if db is not None:
        try:
            db.parent.mkdir(parents=True, exist_ok=True)  # as MLflow would
            fd = os.open(f"{db}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            deadline = time.monotonic() + _INIT_LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
        except OSError:
            pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)  # drops the lock


def _unreachable_cause(err: BaseException) -> str | None:
    """Why the server could not be reached (refused, timeout, unknown host), or None if it answered.

    MLflow wraps the socket error in requests' and urllib3's own (one chained traceback each); the cause
    is found by walking the chain, by type where it is a builtin and by name otherwise, so that neither
    library is imported here.
    """
    seen: set[int] = set()
    chain: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        chain.append(cur)
        cur = cur.__cause__ or cur.__context__
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    if any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "connection refused: nothing listens on that host and port"
    if any(isinstance(e, TimeoutError) for e in chain) or {"Timeout", "TimeoutError"} & names:
        timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", HTTP_ENV_DEFAULTS["MLFLOW_HTTP_REQUEST_TIMEOUT"])
        return f"timeout: no answer within {timeout} s (MLFLOW_HTTP_REQUEST_TIMEOUT)"
    if any(isinstance(e, socket.gaierror) for e in chain) or "NameResolutionError" in names:
        return _UNKNOWN_HOST
    if any(isinstance(e, ConnectionError) for e in chain) or "ConnectionError" in names:
        return f"connection failed ({str(chain[-1]).splitlines()[0][:200]})"
    return None


def start_error(uri: str, err: BaseException) -> TrackingError:
    """The one error make_tracker raises when the store cannot start a run, with the fixes in its message."""
    alternatives = (
        "log to a file in the run directory instead by leaving tracking.tracking_uri unset "
        "(or tracking.tracking_uri=sqlite:///ABSOLUTE/PATH/mlflow.db), or turn tracking off with "
        "tracking.enabled=false"
    )
    cause = _unreachable_cause(err)
    if cause is not None:
        return TrackingError(
            f"could not start an MLflow run: the tracking server {uri} is unreachable ({cause}). Start the "
            f"server (e.g. `mlflow server --host HOST --port PORT`) or fix tracking.tracking_uri, "
            f"{alternatives}"
        )
    first_line = (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
    return TrackingError(
        f"could not start an MLflow run at {uri}: {first_line}. Fix tracking.tracking_uri, {alternatives}"
    )


def config_mistake(uri: str, err: BaseException) -> TrackingError | None:
    """The clear error for a store that failed at start because of the configuration (an unsupported URI
    scheme, a missing database driver, a host name that does not resolve, refused credentials or names);
    None for anything else (a server that is down or slow, a SQLite store that is locked, being created by
    another process or damaged): an outage, which training rides out."""
    if (
        isinstance(err, ImportError)
        or getattr(err, "error_code", None) in CONFIG_ERRORS
        or _unreachable_cause(err) == _UNKNOWN_HOST
    ):
        return start_error(uri, err)
    return None


def outage_reason(err: BaseException) -> str:
    """Why the store could not be used, in a few words (one line)."""
    first_line = (str(err).strip().splitlines() or [""])[0][:200]
    return _unreachable_cause(err) or f"{type(err).__name__}: {first_line}"
