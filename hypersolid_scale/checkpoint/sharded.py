"""The sharded checkpoint (``checkpoint.format=sharded``): a folder ``step_<step:08d>.dcp`` of
``torch.distributed.checkpoint`` parts, for runs on many ranks (docs/design.md §5).

What it holds is the single file's content (:mod:`hypersolid_scale.checkpoint`), split in two:

- the tensors that grow with the model, in DCP's parts: ``model/<name>`` and ``method/<name>`` (every rank holds
  them whole; DCP writes each once, the writes spread over the ranks), and the optimizer state by parameter name,
  ``optim/<parameter>/<key>``, flattened (``Engine.optimizer_pieces``): whole on every rank under DDP, a slice per
  rank under ZeRO 1/2, stored as a ShardedTensor whose shards are the ranks' slices. So every rank writes its own
  part and no rank gathers another's;
- the rest (step, epoch, each rank's RNG state, loader position, config, the optimizer's hyperparameters and
  per-parameter scalars), small, in ``run.pt``, written by rank 0 and read with ``weights_only=True``.

A resume on any world size reads ``run.pt`` and, of the parts, the model's tensors and the slices of the optimizer
state its engine needs (``Engine.needed_ranges``): under ZeRO a rank reads its partition's slices, not the others'.
Evaluation and export read the whole folder in one process (:func:`read_whole`), as they read a single file.

Writing: the parts go into ``step_<step>.dcp.tmp``; once every rank's parts and DCP's ``.metadata`` are written,
rank 0 renames the folder to its final name (the commit). A crash or a kill before that leaves the previous
checkpoints complete and the newest as a ``*.tmp`` folder, which resuming skips and the run directory's lock
holder deletes. With ``checkpoint.async_save`` the save returns once the tensors are copied and the parts are
written by a daemon thread, over a process group of its own (so its collectives never meet the training's); the
next save, and the run's last, wait for it first; a failed run leaves without it (``distributed/parts.write``).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.checkpoint.files import (
    FORMAT_VERSION,
    REQUIRED_KEYS,
    BadCheckpoint,
    atomic_save,
    checkpoint_dir,
    load_file,
    prune_checkpoints,
)
from hypersolid_scale.distributed import parts
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import CheckpointError

SUFFIX = ".dcp"
RUN_FILE = "run.pt"
WEIGHTS = ("model", "method")  # whole on every rank, stored as <entry>/<name>
OPTIM = "optim"  # optim/<parameter>/<key>: the per-parameter pieces of Engine.optimizer_pieces


def sharded_path(run_dir: str | os.PathLike, step: int) -> Path:
    return checkpoint_dir(run_dir) / f"step_{step:08d}{SUFFIX}"


def is_sharded(path: str | os.PathLike) -> bool:
    return Path(path).name.endswith(SUFFIX)


# ----------------------------------------------------------------------------------------------------------
# The split: tensors into DCP's parts, the rest into run.pt
# ----------------------------------------------------------------------------------------------------------


def split_weights(state: dict[str, Any], entry: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors keyed <entry>/<name>, the entries that are not tensors)`` of a model or method state."""
    tensors = {f"{entry}/{k}": v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return tensors, {k: v for k, v in state.items() if not isinstance(v, torch.Tensor)}


def optimizer_tensors(pieces: dict, numel: dict[str, int], replicated: bool) -> dict[str, Any]:
    """The engine's pieces keyed ``optim/<parameter>/<key>``: whole tensors when every rank holds them all
    (DCP writes one copy), slices (ShardedTensors) otherwise."""
    out: dict[str, Any] = {}
    for name, keys in pieces.items():
        for key, (first, flat) in keys.items():
            fqn = f"{OPTIM}/{name}/{key}"
            out[fqn] = flat if replicated else parts.slice_of(flat, first, numel[name])
    return out


# ----------------------------------------------------------------------------------------------------------
# Save
# ----------------------------------------------------------------------------------------------------------


def _write_failed(path: Path, err: BaseException) -> CheckpointError:
    """What a failed write of the parts says: DCP's exception holds each failing rank's traceback; the last
    line of the first is the cause (a full disk, a read-only folder)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    cause = lines[-1] if lines else type(err).__name__
    return CheckpointError(
        f"cannot write checkpoint {path}: {cause}. The previous checkpoints are intact; free disk space or make "
        "run_dir writable, then rerun"
    )


@dataclass
class PendingSave:
    """A save in flight; ``wait()`` raises what went wrong in it (a full disk) as a CheckpointError."""

    path: Path
    future: Future | None = None
    error: list[BaseException] = field(default_factory=list)
    committed: threading.Event = field(default_factory=threading.Event)  # set once the commit is done (or skipped)

    def wait(self) -> Path:
        if self.future is not None:
            self.committed.wait()
            try:
                self.future.result()
            except parts.WRITE_FAILURES as err:
                raise _write_failed(self.path, err) from err
        if self.error:
            raise self.error[0]
        return self.path


def _commit(tmp: Path, final: Path, keep_last: int, run_dir: Path) -> None:
    """Rank 0, once every part is written: the folder under its final name, durably, then the pruning."""
    if final.exists():  # the same step written before (a run resumed from an older checkpoint)
        shutil.rmtree(final)
    atomic.commit(tmp, final)  # the folder fsync'ed, renamed, its directory fsync'ed
    prune_checkpoints(run_dir, keep_last)


def save_sharded(
    run_dir: str | os.PathLike,
    step: int,
    tensors: dict[str, Any],
    meta: dict[str, Any] | None,
    *,
    keep_last: int,
    asynchronous: bool,
    agree: Callable[[Callable[[], Any]], Any],
) -> PendingSave:
    """Collective. ``tensors``: this rank's (``split_weights``, ``optimizer_tensors``); ``meta``: rank 0's
    ``run.pt`` (None elsewhere); ``agree(fn)`` runs ``fn`` on every rank and raises a rank's CheckpointError on
    all (``run_builder.on_every_rank``). Returns the save, finished unless ``asynchronous``."""

    final = sharded_path(run_dir, step)
    tmp = final.with_name(final.name + ".tmp")

    def prepare() -> None:
        if meta is None:
            return
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        missing = [k for k in REQUIRED_KEYS if k not in meta and k not in ("format_version", "model")]
        if missing:
            raise ValueError(f"checkpoint state lacks keys {missing}; every checkpoint needs {list(REQUIRED_KEYS)}")
        atomic_save({**meta, "format_version": FORMAT_VERSION}, tmp / RUN_FILE)

    agree(prepare)  # the folder exists, empty but for run.pt, before any rank writes into it
    pending = PendingSave(final)
    rank0 = meta is not None

    def commit(future: Future | None = None) -> None:
        try:
            if rank0 and (future is None or future.exception() is None):
                _commit(tmp, final, keep_last, Path(run_dir))
        except OSError as err:
            pending.error.append(CheckpointError(f"cannot commit checkpoint {final}: {err}"))
        finally:
            pending.committed.set()

    try:
        pending.future = parts.write(tensors, tmp, asynchronous=asynchronous)
    except parts.WRITE_FAILURES as err:
        raise _write_failed(final, err) from err
    if pending.future is not None:
        pending.future.add_done_callback(commit)
        return pending

    def commit_here() -> None:
        commit()
        pending.wait()  # a failed commit, raised on every rank by agree

    agree(commit_here)  # every rank returns once the checkpoint is under its final name
    return pending


# ----------------------------------------------------------------------------------------------------------
# Read
# ----------------------------------------------------------------------------------------------------------


def open_sharded(path: str | os.PathLike) -> dict[str, Any]:
    """``run.pt`` of a sharded checkpoint, checked as a single file is, its tensors not read yet (a key
    ``sharded`` holds the folder). Raises BadCheckpoint for a folder without a complete set of parts."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        raise BadCheckpoint(
            f"checkpoint {str(path)!r} is not a complete sharded checkpoint (no .metadata: its save did not "
            "finish); use the previous step_* checkpoint of the run"
        )
    meta = load_file(path / RUN_FILE, required=tuple(k for k in REQUIRED_KEYS if k != "model"))
    return {**meta, "sharded": str(path)}


def fill_weights(ckpt: dict[str, Any]) -> int:
    """Read a sharded checkpoint's model and method tensors into ``ckpt`` (``open_sharded``'s); the bytes read."""
    path = Path(ckpt["sharded"])
    template = {k: torch.empty(size, dtype=dtype) for k, (size, dtype) in parts.stored(path).items()}
    template = {k: v for k, v in template.items() if k.split("/", 1)[0] in WEIGHTS}
    read = parts.read(path, template)
    for entry in WEIGHTS:
        prefix = f"{entry}/"
        tensors = {k[len(prefix) :]: v for k, v in template.items() if k.startswith(prefix)}
        rest = ckpt.get(f"{entry}_rest") or {}
        ckpt[entry] = {**tensors, **rest} or (None if entry == "method" else {})
    return read


def read_optimizer(ckpt: dict[str, Any], ranges: dict[str, tuple[int, int]] | None) -> tuple[dict, int]:
    """The optimizer pieces of a sharded checkpoint, ``{parameter: {key: (first, flat)}}``: the elements
    ``ranges[parameter]`` of each (all of them for None); and the bytes read."""
    path = Path(ckpt["sharded"])
    template: dict[str, torch.Tensor] = {}
    where: dict[str, tuple[str, str, int]] = {}
    for fqn, (size, dtype) in parts.stored(path).items():
        entry, _, rest = fqn.partition("/")
        if entry != OPTIM:
            continue
        name, _, key = rest.rpartition("/")
        total = int(size[0])
        lo, hi = (0, total) if ranges is None else ranges.get(name, (0, 0))
        if lo >= hi:
            continue
        flat = torch.empty(hi - lo, dtype=dtype)
        template[fqn] = flat if (lo, hi) == (0, total) else parts.slice_of(flat, lo, total)
        where[fqn] = (name, key, lo)
    read = parts.read(path, template) if template else 0
    pieces: dict[str, dict[str, tuple[int, torch.Tensor]]] = {}
    for fqn, (name, key, lo) in where.items():
        pieces.setdefault(name, {})[key] = (lo, parts.local_part(template[fqn]))
    return pieces, read


def read_part(ckpt: dict[str, Any], ranges: dict[str, tuple[int, int]] | None) -> dict[str, Any]:
    """``ckpt`` (``open_sharded``'s) with its tensors read, in the single file's layout: the weights whole, the
    optimizer entry ``{"pieces": ..., "plain": ...}`` holding the elements ``ranges`` names of each parameter's
    state (all of them for None); ``bytes_read`` says how much was read."""
    ckpt = dict(ckpt)
    read = fill_weights(ckpt)
    pieces, optim_read = read_optimizer(ckpt, ranges)
    ckpt["optimizer"] = {"pieces": pieces, "plain": ckpt.get("optimizer_plain")}
    ckpt["bytes_read"] = read + optim_read
    return ckpt


def read_whole(path: str | os.PathLike) -> dict[str, Any]:
    """The whole checkpoint in one process (evaluation, export): :func:`read_part` of all of it."""
    return read_part(open_sharded(path), None)
