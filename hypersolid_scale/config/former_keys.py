"""Config keys read under a former name: each layer (a YAML file, an override, a stored config) is rewritten to
the key's current name before it is merged, with a one-line note (rank 0, once per key and process).

A key is renamed when its name meant two things (docs/design.md §7, "one meaning per name"), or moves into the
section it belongs to (a format's own keys, ``data.<format>.*``). Both spellings in one layer are an error
unless they say the same; across layers the later one wins, as for any key. The ``dist.bf16`` ->
``dist.precision`` change maps values too and lives in ``precision``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hypersolid_scale.safety.errors import ConfigError

__all__ = ["FORMER_KEYS", "rename_former_keys"]

_WEBDATASET = "WebDataset's own keys are the section data.webdataset"
_FFCV = "FFCV's own keys are the section data.ffcv"
# former key -> (key, why it was renamed)
FORMER_KEYS: dict[str, tuple[str, str]] = {
    "data.max_train_samples": (
        "data.max_pretrain_samples",
        "the pre-training subset; eval.max_train_samples caps the evaluation's training split",
    ),
    "data.decode": (
        "data.views_on",
        "where the multi-crop views are made; data.jpeg_decoder says where JPEGs are decoded",
    ),
    **{f"data.{k}": (f"data.webdataset.{k}", _WEBDATASET) for k in ("shuffle_buffer", "manifest", "verify_shards")},
    "data.max_lost_fraction": ("data.webdataset.max_lost_fraction", _WEBDATASET),
    **{f"data.ffcv_{k}": (f"data.ffcv.{k}", _FFCV) for k in ("order", "os_cache", "batches_ahead")},
}
_noted: set[str] = set()
_ABSENT = object()


def _get(d: Any, path: list[str]) -> Any:
    """The value at ``path`` in nested dicts, ``_ABSENT`` when there is none."""
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return _ABSENT
        d = d[key]
    return d


def _without(d: dict[str, Any], path: list[str]) -> dict[str, Any]:
    """A copy of ``d`` without the key at ``path`` (which exists)."""
    if len(path) == 1:
        return {k: v for k, v in d.items() if k != path[0]}
    return {**d, path[0]: _without(d[path[0]], path[1:])}


def _with(d: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``d`` with ``value`` at ``path``, the sections on the way created when absent."""
    if len(path) == 1:
        return {**d, path[0]: value}
    inner = d.get(path[0])
    return {**d, path[0]: _with(inner if isinstance(inner, dict) else {}, path[1:], value)}


def rename_former_keys(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (nested sections) with every former key moved to its current name; ``d`` itself is not changed.
    The note names the keys moved for one reason on one line.

    Raises:
        ConfigError: a layer that gives a key under both names with different values.
    """
    notes: dict[str, list[tuple[str, str]]] = {}  # why -> (former, current) keys not noted before
    for old, (new, why) in FORMER_KEYS.items():
        value = _get(d, old.split("."))
        if value is _ABSENT:
            continue
        present = _get(d, new.split("."))
        if present is not _ABSENT and present != value:
            raise ConfigError(
                f"config keys '{old}' = {value!r} and '{new}' = {present!r} ({where}) disagree; "
                f"keep {new} only ({old} is its former name)"
            )
        if old not in _noted and os.environ.get("RANK", "0") == "0":
            _noted.add(old)
            notes.setdefault(why, []).append((old, new))
        d = _with(_without(d, old.split(".")), new.split("."), value)
    for why, pairs in notes.items():
        olds, news = (", ".join(f"'{pair[i]}'" for pair in pairs) for i in (0, 1))
        keys, verb = ("keys", "are") if len(pairs) > 1 else ("key", "is")
        print(f"note: config {keys} {olds} ({where}) {verb} read as {news}: {why}", file=sys.stderr, flush=True)
    return d
