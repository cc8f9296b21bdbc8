"""Checks of a method's hyperparameter section: each field declares its kind in the section's ``KINDS``."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypersolid_scale.safety.errors import ConfigError

# What each kind accepts, as the error message states it.
KINDS = {
    "pos_int": "a positive integer",
    "layers": "an integer >= 2",
    "nonneg_int": "an integer >= 0",
    "pos_float": "a number > 0",
    "nonneg_float": "a number >= 0",
    "unit": "a number in [0, 1]",
    "bool": "true or false",
}


def _valid(kind: str, value: object) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):  # bool is an int subclass: `hidden_dim: true` in YAML must not become 1
        return False
    if kind in ("pos_int", "nonneg_int", "layers"):
        return isinstance(value, int) and value >= {"pos_int": 1, "nonneg_int": 0, "layers": 2}[kind]
    if not isinstance(value, (int, float)) or value != value:  # value != value: NaN
        return False
    if kind == "pos_float":
        return 0 < value < float("inf")
    if kind == "nonneg_float":
        return 0 <= value < float("inf")
    return 0.0 <= value <= 1.0  # unit


def check_section(prefix: str, section: object) -> None:
    """Raise :class:`ConfigError` naming the first field of ``section`` outside its kind (``prefix.field``),
    and a momentum schedule that falls (``momentum_base`` > ``momentum_end``)."""
    kinds: dict[str, str] = getattr(type(section), "KINDS", {})
    for f in fields(section):  # type: ignore[arg-type]
        value = getattr(section, f.name)
        if f.name in kinds and not _valid(kinds[f.name], value):
            raise ConfigError(f"{prefix}.{f.name}={value!r} is not allowed; it must be {KINDS[kinds[f.name]]}")
    base, end = getattr(section, "momentum_base", None), getattr(section, "momentum_end", None)
    if base is not None and end is not None and base > end:
        raise ConfigError(
            f"{prefix}.momentum_base={base} must be <= {prefix}.momentum_end={end} (the teacher's "
            "EMA momentum rises from base to end)"
        )


def section_tags(section: Any) -> dict[str, Any]:
    """A run's tags from its method section: the section's ``TAGS`` maps a tag to the key whose value it shows
    (Hypersolid's ``loss_backend`` is its ``backend``); most sections have none."""
    return {tag: getattr(section, key) for tag, key in getattr(type(section), "TAGS", {}).items()}
