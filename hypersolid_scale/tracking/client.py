"""The MLflow client: imported only when a run is really tracked, set up to fail fast, and its failures at
start turned into one message that says what is wrong and how to fix it."""

from __future__ import annotations

import os
import socket
from typing import Any

from hypersolid_scale.safety.errors import UserError

# The client must not hang training: one attempt per call (the outbox retries with its own backoff), and a
# short timeout. Set only where the user has not chosen: the environment wins.
HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


class TrackingError(UserError, RuntimeError):
    """The tracking store cannot start (or find) a run: unreachable server, refused request, bad URI."""


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
    MlflowClient = require_mlflow().MlflowClient  # non-zero ranks never pay for importing MLflow

    if uri.startswith(("http://", "https://")):
        for name, value in HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
    return MlflowClient(tracking_uri=uri)


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
        return "unknown host name"
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
