"""Config keys read under a former name: each layer (a YAML file, an override, a stored config) is rewritten to
the key's current name before it is merged, with a one-line note (rank 0, once per key and process).

A key is renamed when its name meant two things (docs/design.md §7, "one meaning per name"). Both spellings in
one layer are an error unless they say the same; across layers the later one wins, as for any key. The
``dist.bf16`` -> ``dist.precision`` change maps values too and lives in ``precision``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from hypersolid_scale.safety.errors import ConfigError

__all__ = ["FORMER_KEYS", "rename_former_keys"]

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
}
_noted: set[str] = set()


def rename_former_keys(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (nested sections) with every former key moved to its current name; ``d`` itself is not changed.

    Raises:
        ConfigError: a layer that gives a key under both names with different values.
    """
    for old, (new, why) in FORMER_KEYS.items():
        (section, old_key), new_key = old.split("."), new.split(".")[1]
        part = d.get(section)
        if not isinstance(part, dict) or old_key not in part:
            continue
        if new_key in part and part[new_key] != part[old_key]:
            raise ConfigError(
                f"config keys '{old}' = {part[old_key]!r} and '{new}' = {part[new_key]!r} ({where}) disagree; "
                f"keep {new} only ({old} is its former name)"
            )
        if old not in _noted and os.environ.get("RANK", "0") == "0":
            _noted.add(old)
            print(f"note: config key '{old}' ({where}) is read as '{new}': {why}", file=sys.stderr, flush=True)
        moved = {k: v for k, v in part.items() if k != old_key}
        d = {**d, section: {**moved, new_key: part[old_key]}}
    return d
