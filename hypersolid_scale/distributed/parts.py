"""Tensors written and read as parts, one per rank, with ``torch.distributed.checkpoint`` (DCP): what the sharded
checkpoint (``hypersolid_scale/checkpoint/sharded.py``) stores its tensors with.

- :func:`write`: every rank hands its tensors to DCP, which writes a tensor that several ranks hold alike once
  (the writes spread over the ranks) and each rank's :func:`slice_of` tensors as that rank's part, then, once all
  are written, its ``.metadata``. Asynchronously, the tensors are copied first and a daemon thread writes them,
  over a gloo group of its own (:func:`_save_group`), so that its collectives never meet the step's.
- :func:`read`: one rank alone reads what its template asks for: whole tensors, or slices (:func:`slice_of`), of
  which DCP opens only the stored parts that overlap them; the bytes it read.
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hypersolid_scale.distributed.collectives import get_rank, get_world_size, is_distributed

# What a failed write raises: an OSError in one process; DCP's CheckpointException (a BaseException) holding
# each failing rank's traceback otherwise.
WRITE_FAILURES: tuple[type[BaseException], ...] = (OSError, CheckpointException)


# A slice is a ShardedTensor, which torch announces it deprecates in favour of DTensor: but a DTensor's shards are
# the even chunks of a device mesh, and a ZeRO partition cuts its parameters anywhere. DCP still reads and
# writes ShardedTensors; the announcement, once per slice and copy, says nothing to the user of a checkpoint.
warnings.filterwarnings("ignore", message="Please use DTensor instead and we are deprecating ShardedTensor")
# DCP warns at every call in one process (``no_dist``), from the background writer's thread too: meant here (one
# process, or a rank reading its own part).
warnings.filterwarnings("ignore", message="torch.distributed is (disabled|unavailable)")


def slice_of(flat: torch.Tensor, first: int, total: int) -> torch.Tensor:
    """A rank's slice ``first .. first + len(flat)`` of a flat tensor of ``total`` elements, as the ShardedTensor
    DCP saves a slice of and reads slices into. DCP's planner takes each rank's shards from ``local_shards()``
    and assembles the global layout from all ranks' itself; the metadata here only has to cover the tensor, so
    what lies outside the slice is named as another rank's, which no rank needs to know exactly."""
    from torch.distributed._shard.metadata import ShardMetadata
    from torch.distributed._shard.sharded_tensor import Shard, ShardedTensor
    from torch.distributed._shard.sharded_tensor.metadata import ShardedTensorMetadata, TensorProperties

    rank, world = get_rank(), get_world_size()
    device = "cpu" if flat.device.type == "cpu" else f"{flat.device.type}:{flat.device.index or 0}"
    mine = ShardMetadata(shard_offsets=[first], shard_sizes=[flat.numel()], placement=f"rank:{rank}/{device}")
    elsewhere = f"rank:{(rank + 1) % world}/{device}"
    rest = [(0, first), (first + flat.numel(), total)]
    others = [ShardMetadata([lo], [hi - lo], elsewhere) for lo, hi in rest if hi > lo]
    if others and world == 1:
        raise ValueError(f"one process holds elements {first}..{first + flat.numel()} of {total}: it holds all")
    props = TensorProperties(dtype=flat.dtype, layout=torch.strided, requires_grad=False)
    whole = ShardedTensorMetadata(shards_metadata=[mine, *others], size=torch.Size([total]), tensor_properties=props)
    return ShardedTensor._init_from_local_shards_and_global_metadata([Shard(flat.contiguous(), mine)], whole)


def local_part(value: torch.Tensor) -> torch.Tensor:
    """A read tensor itself, or the slice a :func:`slice_of` template received."""
    shards = getattr(value, "local_shards", None)
    return shards()[0].tensor if shards is not None else value


_GROUP: Any = None


def _save_group() -> Any:
    """The background writes' gloo group, made once, by every rank at its first save (collective)."""
    global _GROUP
    if _GROUP is None and is_distributed():
        _GROUP = dist.new_group(backend="gloo")
    return _GROUP


def _copy(value: torch.Tensor) -> torch.Tensor:
    """A copy of a tensor or of a slice's local shard (the slice wrapped again around it). Our own copy, not
    DCP's stager, which walks a ShardedTensor through torch's function overrides: 5.8 s for a ResNet-18's
    optimizer slices on this CPU."""
    shards = getattr(value, "local_shards", None)
    if shards is None:
        return value.detach().clone()
    shard = shards()[0]
    return slice_of(shard.tensor.detach().clone(), int(shard.metadata.shard_offsets[0]), int(value.size(0)))


def write(tensors: dict[str, torch.Tensor], folder: Path, *, asynchronous: bool) -> Future | None:
    """Collective: every rank's ``tensors`` into ``folder``. Returns once written (None), or with
    ``asynchronous`` once copied (the copy is all the step waits for), with the Future of the write (it raises
    one of ``WRITE_FAILURES``).

    The background write is ``dcp.save`` in a daemon thread of ours rather than ``dcp.async_save``, whose
    executor thread the interpreter joins at exit: a run that fails while a write waits on a rank that is gone
    would then wait out the collective's timeout before it could exit. A run that ends well waits for its write
    (``PendingSave.wait``); one that fails leaves it, unfinished, to be skipped and removed (a ``*.tmp``)."""
    writer = dcp.FileSystemWriter(str(folder), sync_files=True)
    kwargs: dict[str, Any] = {"storage_writer": writer, "process_group": _save_group(), "no_dist": not is_distributed()}
    if not asynchronous:
        dcp.save(tensors, **kwargs)
        return None
    copied = {k: _copy(v) for k, v in tensors.items()}
    future: Future = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            dcp.save(copied, **kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(err)
        else:
            future.set_result(None)

    threading.Thread(target=run, name=f"checkpoint-writer {folder.name}", daemon=True).start()
    return future


def stored(folder: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """The size and dtype of every tensor in ``folder`` (from its ``.metadata``)."""
    md = dcp.FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    return {k: (v.size, v.properties.dtype) for k, v in md.items() if isinstance(v, TensorStorageMetadata)}


def read(folder: Path, template: dict[str, torch.Tensor]) -> int:
    """Fill ``template`` (whole tensors and :func:`slice_of` slices) from ``folder`` on this rank alone (nothing
    to agree on: each rank asks for what it needs); the bytes read from storage."""

    class CountingReader(dcp.FileSystemReader):
        bytes_read = 0

        def read_data(self, plan: Any, planner: Any) -> Any:
            items = (self.storage_data[r.storage_index] for r in plan.items)
            opened = {(i.relative_path, i.offset): i.length for i in items}  # each stored item read once
            CountingReader.bytes_read += sum(opened.values())
            return super().read_data(plan, planner)

    dcp.load(template, storage_reader=CountingReader(str(folder)), no_dist=True)
    return CountingReader.bytes_read
