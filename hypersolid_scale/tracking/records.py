"""What one spooled record may hold: MLflow's limits on names and values, and the checks that enforce them.

A value MLflow would refuse is refused here, at the call, with a ValueError naming it; what reaches the
spool is then accepted by any MLflow store.
"""

from __future__ import annotations

import operator
import posixpath
import re
import time
from collections.abc import Mapping
from typing import Any

# MLflow's own limits (mlflow.utils.validation); values beyond them are refused by the store.
MAX_PARAM_VALUE_LENGTH = 6000
MAX_TAG_VALUE_LENGTH = 8000
MAX_KEY_LENGTH = 250
# Values per log_batch call, per kind (and at most 1000 in all).
BATCH_LIMITS = {"metrics": 1000, "params": 100, "tags": 100}
TERMINAL_STATUSES = ("FINISHED", "FAILED", "KILLED")
_VALID_KEY = re.compile(r"^[/\w.\- :]*$")
_TRUNCATED = "...[truncated]"


def now_ms() -> int:
    return int(time.time() * 1000)


def check_key(key: str, what: str) -> str:
    key = str(key)
    # MLflow stores names as file paths too, so they must be normalised relative paths ("a/b", not "a//b").
    if (
        not key
        or len(key) > MAX_KEY_LENGTH
        or not _VALID_KEY.match(key)
        or posixpath.normpath(key) != key
        or key.startswith(("/", ".."))
    ):
        raise ValueError(
            f"invalid {what} name {key!r}: use 1-{MAX_KEY_LENGTH} characters among letters, "
            "digits, '_', '-', '.', ' ', ':' and '/', as a relative path without '//' or '..'"
        )
    return key


def truncate(value: Any, limit: int) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def chunks(items: dict[str, Any], size: int) -> list[dict[str, Any]]:
    keys = list(items)
    return [{k: items[k] for k in keys[i : i + size]} for i in range(0, len(keys), size)]


def check_step(step: Any) -> int:
    try:
        if isinstance(step, bool):
            raise TypeError
        return operator.index(step)  # ints, numpy and torch integer scalars; not floats
    except TypeError:
        raise ValueError(f"step must be an int, got {step!r}") from None


def check_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    values: dict[str, float] = {}
    for key, value in metrics.items():
        key = check_key(key, "metric")
        try:
            values[key] = float(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"metric {key!r} has value {value!r}; metrics must be numbers") from err
    return values
