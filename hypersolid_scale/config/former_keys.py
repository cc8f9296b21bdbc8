"""Every config key that was ever renamed, moved or removed, in one table, read in one place with one behaviour.

Each layer (a YAML file, an override, a stored config: a checkpoint's) is rewritten to the present names before
it is merged, with a one-line note (rank 0, once per key and process) naming where the former key was found: a
configuration written for an earlier version keeps loading, and an older checkpoint keeps resuming. Both
spellings in one layer are an error unless they say the same; across layers the later one wins, as for any key.
A removed key is dropped with its note saying why.

One behaviour for all: a former key is *read*, never refused. (``dist.backend`` was once refused because the
word also names the repulsion algorithm; but the key ``dist.backend`` can only have meant the transport, so
refusing it made a user edit a file that says nothing wrong, while ``data.decode``, renamed for the same
reason, was read. Both are read now.)

A key is renamed when its name meant two things (docs/design.md §6, "one meaning per name"), or moves into the
section it belongs to (a format's own keys, ``data.<format>.*``; a method's, ``method.<name>.*``). The table
is applied in order, so an entry for a whole section (``loss``) takes what the entries before it left.

What is not here, because it is not a rename: the sections of methods or formats not installed here, left out
of a stored config (``config/sections.drop_missing``, for methods and formats alike),
and a checkpoint's own layout (``checkpoint/layout.migrate_layout``: where its tensors are, not its config).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypersolid_scale.data import formats
from hypersolid_scale.methods.config import DEFAULT_METHOD
from hypersolid_scale.methods.registry import method_names
from hypersolid_scale.safety.errors import ConfigError

__all__ = ["FORMER_KEYS", "Former", "former_keys", "former_keys_in", "rename_former_keys"]


@dataclass(frozen=True)
class Former:
    """What became of a former key: ``new`` (its name now; None: removed) and why."""

    new: str | None
    why: str
    # Its former values, as their present ones (lower-cased text; YAML's booleans read as "true"/"false").
    values: Mapping[str, str] = field(default_factory=dict)
    # The entry applies only to these values (None: to every value).
    when: Callable[[Any], bool] | None = None


_WEBDATASET = "WebDataset's own keys are the section data.webdataset"
_FFCV = "FFCV's own keys are the section data.ffcv"
_LOSS = "the section 'loss' is now 'method' (method.name, method.<method>.*, Hypersolid's keys method.hypersolid.*)"
_BACKBONE = "a backbone's own keys are its section model.<arch> (model.small_cnn.width, model.vit_tiny.patch_size)"
_BACKEND_KEYS = (
    "a repulsion backend's own keys are its section method.hypersolid.<backend> (method.hypersolid.neighbors.k, "
    "method.hypersolid.auto.to_neighbors)"
)
_PROJECTOR = "every method's section holds its heads' shape: Hypersolid's projector is method.hypersolid.*"


def _names_a_format(value: Any) -> bool:
    return isinstance(value, str) and value in formats.names() and value != "builtin"


def former_keys() -> dict[str, Former]:
    """Former key -> what it is now, in the order applied (the ``loss`` entries come from the method registry)."""
    return {
        "dist.backend": Former(
            "dist.transport",
            "the process group's transport (auto | gloo | nccl); 'backend' names the repulsion algorithm, "
            "method.hypersolid.backend",
        ),
        "dist.bf16": Former(
            "dist.precision",
            "dist.precision says auto | bf16 | fp32 | fp64 (bf16: auto -> auto, true -> bf16, false -> fp32)",
            values={"auto": "auto", "true": "bf16", "false": "fp32"},
        ),
        "data.max_train_samples": Former(
            "data.max_pretrain_samples",
            "the pre-training subset; eval.max_train_samples caps the evaluation's training split",
        ),
        "data.decode": Former(
            "data.views_on", "where the multi-crop views are made; data.jpeg_decoder says where JPEGs are decoded"
        ),
        "data.dataset": Former(
            "data.format",
            "the storage format is data.format; data.dataset is only the dataset's name",
            when=_names_a_format,
        ),
        **{f"data.{k}": Former(f"data.webdataset.{k}", _WEBDATASET) for k in ("shuffle_buffer", "manifest")},
        **{f"data.{k}": Former(f"data.webdataset.{k}", _WEBDATASET) for k in ("verify_shards", "max_lost_fraction")},
        **{f"data.ffcv_{k}": Former(f"data.ffcv.{k}", _FFCV) for k in ("order", "os_cache", "batches_ahead")},
        "eval.monitor_max_train": Former(
            "eval.monitor_max_samples", "the online monitor caps both of its splits, train and test, with it"
        ),
        "loss.name": Former("method.name", _LOSS),
        **{f"loss.{m}": Former(f"method.{m}", _LOSS) for m in method_names() if m != DEFAULT_METHOD},
        "loss": Former(f"method.{DEFAULT_METHOD}", _LOSS),
        "model.small_cnn_width": Former("model.small_cnn.width", _BACKBONE),
        **{f"model.{k}": Former(f"model.vit_tiny.{k}", _BACKBONE) for k in ("img_size", "patch_size")},
        # After "loss": an earlier config's loss section has become method.hypersolid by now.
        **{
            f"method.{DEFAULT_METHOD}.{k}": Former(f"method.{DEFAULT_METHOD}.neighbors.{k}", _BACKEND_KEYS)
            for k in ("index", "k", "nprobe", "ef_search", "recall_every", "ivf_retrain_every")
        },
        **{
            f"method.{DEFAULT_METHOD}.auto_{k}": Former(f"method.{DEFAULT_METHOD}.auto.{k}", _BACKEND_KEYS)
            for k in ("to_neighbors", "to_tiled")
        },
        **{
            f"model.proj_{old}": Former(f"method.hypersolid.{new}", _PROJECTOR)
            for old, new in (("layers", "num_layers"), ("hidden_dim", "hidden_dim"), ("dim", "out_dim"))
        },
    }


FORMER_KEYS = former_keys()
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
    """A copy of ``d`` without the key at ``path`` (which exists); a section left empty goes too."""
    if len(path) == 1:
        return {k: v for k, v in d.items() if k != path[0]}
    inner = _without(d[path[0]], path[1:])
    return {k: v for k, v in d.items() if k != path[0]} if not inner else {**d, path[0]: inner}


def _with(d: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of ``d`` with ``value`` at ``path``, the sections on the way created when absent."""
    if len(path) == 1:
        return {**d, path[0]: value}
    inner = d.get(path[0])
    return {**d, path[0]: _with(inner if isinstance(inner, dict) else {}, path[1:], value)}


def _leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(relative dotted key, value) of every leaf of a section; ``[("", value)]`` for a plain value."""
    if not isinstance(value, dict) or not value:
        return [(prefix, value)]
    return [leaf for k, v in value.items() for leaf in _leaves(v, f"{prefix}.{k}" if prefix else str(k))]


def _as_present(old: str, former: Former, value: Any, where: str) -> Any:
    if not former.values:
        return value
    said = str(value).lower()
    if said not in former.values:
        allowed = " | ".join(former.values)
        raise ConfigError(
            f"config key '{old}' = {value!r} ({where}) is not allowed; choose one of: {allowed} "
            f"(or write its successor {former.new})"
        )
    return former.values[said]


def _same(former: Former, a: Any, b: Any) -> bool:
    """Whether two spellings say the same (a mapped value's case does not matter: dist.precision=FP32)."""
    return a == b or bool(former.values) and str(a).lower() == str(b).lower()


def former_keys_in(d: dict[str, Any]) -> list[str]:
    """The former keys (or sections) one layer ``d`` uses: what a config written today must not hold."""
    return [
        old
        for old, former in FORMER_KEYS.items()
        if (value := _get(d, old.split("."))) is not _ABSENT and (former.when is None or former.when(value))
    ]


def rename_former_keys(d: dict[str, Any], where: str, *, note: bool = True) -> dict[str, Any]:
    """``d`` (one layer: nested sections) with every former key under its present name, removed ones left out;
    ``d`` itself is not changed. One note per reason names the keys (unless ``note`` is False).

    Raises:
        ConfigError: a layer that gives a key under both names with different values, or a former key's
        value that has no present spelling.
    """
    notes: dict[str, list[tuple[str, str]]] = {}  # why -> (former, present) keys not noted before
    for old, former in FORMER_KEYS.items():
        value = _get(d, old.split("."))
        if value is _ABSENT or (former.when is not None and not former.when(value)):
            continue
        d = _without(d, old.split("."))
        if former.new is not None:
            for leaf, raw in _leaves(value):
                new = f"{former.new}.{leaf}" if leaf else former.new
                v = _as_present(f"{old}.{leaf}" if leaf else old, former, raw, where)
                present = _get(d, new.split("."))
                if present is not _ABSENT and not _same(former, present, v):
                    said = f"{str(raw).lower()} ({new}={v})" if former.values else repr(v)
                    raise ConfigError(
                        f"config keys '{f'{old}.{leaf}' if leaf else old}' = {said} and '{new}' = {present!r} "
                        f"({where}) disagree; keep {new} only (the other is its former name)"
                    )
                d = _with(d, new.split("."), v)
        if note and old not in _noted and os.environ.get("RANK", "0") == "0":
            _noted.add(old)
            shown = (f"{old}.*", f"{former.new}.*") if isinstance(value, dict) else (old, former.new or "")
            notes.setdefault(former.why, []).append(shown)
    for why, pairs in notes.items():
        olds, news = (", ".join(f"'{pair[i]}'" for pair in pairs if pair[i]) for i in (0, 1))
        keys, verb = ("keys", "are") if len(pairs) > 1 else ("key", "is")
        did = f"read as {news}" if news else "removed, and left out"
        print(f"note: config {keys} {olds} ({where}) {verb} {did}: {why}", file=sys.stderr, flush=True)
    return d
