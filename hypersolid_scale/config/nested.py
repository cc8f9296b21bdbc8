"""Nested mappings as flat ``a.b.c`` keys: how configs are compared, fingerprinted and logged as params."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any, cast


def flatten(d: Mapping[str, Any] | Any, prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; dataclasses are read as dicts, OmegaConf DictConfigs are Mappings."""
    if is_dataclass(d) and not isinstance(d, type):
        d = asdict(d)
    out: dict[str, Any] = {}
    for key, value in cast(Mapping[str, Any], d).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value or is_dataclass(value) and not isinstance(value, type):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out
