"""What a run trains, as a hash: the config's fingerprint, and the differences a refused resume lists.

Only the keys that define *what* is trained enter it (a method's or a format's section only when it is the
chosen one); how long, where, how it is logged, evaluated or checkpointed may change between a checkpoint and
its resumption. Configs stored by older versions are compared as this version reads them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from hypersolid_scale.config.nested import flatten
from hypersolid_scale.config.schema import Config, from_dict, to_dict
from hypersolid_scale.data.config import DEFAULT_FORMAT, DataConfig
from hypersolid_scale.methods import method_names
from hypersolid_scale.methods.config import DEFAULT_METHOD

__all__ = ["config_diff", "fingerprint"]

# Keys that may change between a checkpoint and its resumption without changing what is being trained:
# how long, where, how it is logged/evaluated/checkpointed and how many workers feed it. ("dist.backend" is
# dist.transport's former name, still found in older checkpoints' configs.) The per-rank batch may change
# with the world size: resuming compares the global batch instead (checkpoint.restore_run_state).
_RESUMABLE_PREFIXES = (
    "run_dir",
    "epochs",
    "max_steps",
    "progress",
    "tracking.",
    "eval.",
    "checkpoint.",
    "dist.timeout_minutes",
    "dist.peer_timeout_s",
    "dist.transport",
    "dist.backend",
    "dist.device",
    "data.num_workers",
    "model.channels_last",  # a memory format: the same numbers, within float rounding
    # How the global batch is stated and split (data/batch.py): the checkpoint's global batch is compared
    # instead, so a requeue onto another GPU count, or with another accumulation count, continues.
    "data.global_batch_size",
    "data.batch_size_per_gpu",
    "optim.accumulate_steps",
    "data.root",
    "data.path",
    "data.cache",
    "data.download",
)


def _training_relevant(cfg_dict: dict[str, Any]) -> dict[str, Any]:
    """The keys that define what is trained: a method's or a format's section counts only when it is the chosen
    one (``method.<name>.*``, ``data.<format>.*``)."""
    flat = {k: v for k, v in flatten(cfg_dict).items() if not k.startswith(_RESUMABLE_PREFIXES)}
    chosen = flat.get("method.name", DEFAULT_METHOD)  # the schema's default for a config that sets none
    fmt = flat.get("data.format", DEFAULT_FORMAT)
    unread = tuple(f"method.{m}." for m in method_names() if m != chosen) + tuple(
        f"data.{f}." for f in DataConfig.format_sections if f != fmt
    )
    return {k: v for k, v in flat.items() if not k.startswith(unread)}


def fingerprint(cfg: Config | dict[str, Any]) -> str:
    """Hash of the keys that define *what* is trained; checkpoints refuse to resume across a change."""
    d = cfg if isinstance(cfg, dict) else to_dict(cfg)
    blob = json.dumps(_training_relevant(d), sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _as_read_now(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` as this version reads it: migrated, keys added since at their defaults, and the builtin
    dataset's default name spelled out. A dict this version cannot read is compared as it is."""
    try:
        out = to_dict(from_dict(d))
    except ValueError:
        return d
    if out["data"]["format"] == "builtin" and out["data"]["dataset"] is None:
        out["data"]["dataset"] = "fashion_mnist"
    return out


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Human-readable ``key: old -> new`` lines for the keys that enter the fingerprint, comparing both
    configs as this version reads them (so a config stored by an older version, with keys renamed or added
    since, differs only where the training it describes differs). Empty: the same training."""
    a, b = _training_relevant(_as_read_now(old)), _training_relevant(_as_read_now(new))
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k)
    ]
