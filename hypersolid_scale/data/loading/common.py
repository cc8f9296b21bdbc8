"""Pieces shared by every loader: the epoch order and its split by rank, keyed random streams, epoch/position
bookkeeping for resume, seeds, manifests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hypersolid_scale.safety.errors import DataError

if TYPE_CHECKING:
    from hypersolid_scale.data.device.views import DeviceStage

MANIFEST = "manifest.json"


def mix_seed(*parts: int) -> int:
    """A well-spread 63-bit seed from several integers (seed, epoch, rank, batch, ...)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2, np.uint64)[0] >> 1)


def batches_per_epoch(num_samples: int, world_size: int, batch_size: int) -> int:
    """Batches per rank per epoch, the same on every rank (the remainder is dropped)."""
    n = num_samples // (world_size * batch_size)
    if n == 0:
        raise ValueError(
            f"{num_samples} samples cannot fill one batch of {batch_size} on each of {world_size} ranks: "
            "lower data.batch_size_per_gpu or use more data"
        )
    return n


def epoch_permutation(num_samples: int, *, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order of `epoch`: a permutation of range(num_samples) that depends only on (seed, epoch)."""
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(mix_seed(seed, epoch)).permutation(num_samples).astype(np.int64)


def split_global_batches(order: np.ndarray, *, rank: int, world_size: int, batch_size: int) -> np.ndarray:
    """This rank's rows of every global batch of `order`, concatenated (docs/design.md §3b).

    Global batch t = order[t*B : (t+1)*B] with B = world_size * batch_size; rank r takes its rows
    [r*b, (r+1)*b). So rank r's batch t is the returned slice [t*b, (t+1)*b), and concatenating the
    batches t of ranks 0..P-1 gives global batch t whatever P is. The remainder of the epoch is dropped.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n_batches = batches_per_epoch(len(order), world_size, batch_size)
    rows = np.asarray(order[: n_batches * world_size * batch_size]).reshape(n_batches, world_size, batch_size)
    return np.ascontiguousarray(rows[:, rank]).reshape(-1)


def rank_indices(
    num_samples: int, *, rank: int, world_size: int, batch_size: int, seed: int, epoch: int, shuffle: bool = True
) -> np.ndarray:
    """This rank's sample indices for `epoch`, batch after batch (see `split_global_batches`)."""
    order = epoch_permutation(num_samples, seed=seed, epoch=epoch, shuffle=shuffle)
    return split_global_batches(order, rank=rank, world_size=world_size, batch_size=batch_size)


# ------------------------------------------------------------------ keyed random streams ------------
# Augmentation randomness is a pure function of (seed, epoch, sample index, view), never of a
# generator's history, so it cannot depend on the world size, the rank or the worker count. The hash
# below is written with plain integer operators only, so that one definition serves Python ints,
# int64 torch tensors (the batched tensor path) and numba (the FFCV decoder): every intermediate stays
# below 2**49, so nothing overflows int64 anywhere.
M32 = 0xFFFFFFFF


def hash32(x: Any) -> Any:
    """A 32-bit integer hash (Wellons' "triple32" mixer) of 0 <= x < 2**32, elementwise on tensors.

    Each x * c mod 2**32 is computed as x*c_lo + ((x*c_hi mod 2**16) << 16) with 16-bit halves of c.
    """
    x = x ^ (x >> 17)
    x = (x * 0xD4BB + (((x * 0xED5A) & 0xFFFF) << 16)) & 0xFFFFFFFF
    x = x ^ (x >> 11)
    x = (x * 0x1B51 + (((x * 0xAC4C) & 0xFFFF) << 16)) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * 0x8BAB + (((x * 0x3184) & 0xFFFF) << 16)) & 0xFFFFFFFF
    x = x ^ (x >> 14)
    return x


# Stream domains: one sample's draws for different purposes never share a stream.
DOMAIN_TENSOR_VIEW = 1  # tensor path: crop, flip and photometric uniforms of one view
DOMAIN_FFCV_CROP = 2  # FFCV decoder: crop + flip of one view


def stream_key(seed: int, epoch: int, view: int, domain: int) -> int:
    """The 32-bit key of the stream of (seed, epoch, view, domain); combine with `sample_hash`."""
    h = hash32(0x9E3779B9 ^ (int(seed) & M32))
    for word in ((int(seed) >> 32) & M32, int(epoch) & M32, int(view) & M32, int(domain) & M32):
        h = hash32(h ^ word)
    return int(h)


def sample_hash(key: Any, index: Any) -> Any:
    """32-bit hash of (stream key, sample index); index is an int or an int64 tensor of indices >= 0."""
    return hash32(hash32(key ^ (index & M32)) ^ ((index >> 32) & M32))


class ResumableEpochs:
    """What every training loader shares (loading/protocol.py's `TrainLoader`): `set_epoch` / `state_dict` /
    `load_state_dict` / `stats`, and the defaults of a loader with no device stage and nothing to close.

    The position is (epoch, batches handed out in that epoch). A batch counts as consumed as soon as it
    is handed out, so a checkpoint written after training on batch k resumes at batch k + 1.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self._skip = 0  # batches to skip at the start of the next iteration (restored position)
        self._done = 0
        self.stats: dict[str, float] = {}

    _len: int = 0  # batches per epoch, the same on every rank
    # Batch t holds the same samples and views whatever the world size, so the position (which counts global
    # batches) carries over to another world size at the same global batch (docs/design.md §3b, §5).
    world_size_invariant = True
    # data.views_on=device: the stage that finishes each batch in the training process (device/views.py).
    device_stage: DeviceStage | None = None

    @property
    def device_stage_cpu_s(self) -> float:
        """This process's CPU seconds in the device stage (data.views_on=device; 0 otherwise)."""
        return self.device_stage.cpu_seconds if self.device_stage is not None else 0.0

    def close(self) -> None:
        """Stop what the loader started (DataLoader workers, a stage thread); nothing here."""

    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self._skip = 0
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batches_done": self._done, "stats": dict(self.stats)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "epoch" not in state or "batches_done" not in state:
            raise ValueError(f"loader state must hold 'epoch' and 'batches_done', got keys {sorted(state)}")
        self.epoch = int(state["epoch"])
        self._skip = int(state["batches_done"])
        self._done = self._skip
        self.stats.update(state.get("stats", {}))

    def _begin(self) -> int:
        """Start an epoch's iteration; returns the first batch index to produce."""
        start, self._skip = self._skip, 0
        self._done = start
        return start

    def _count(self) -> None:
        self._done += 1


def sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, as a conversion manifest records each output file."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def find_manifest(path: str | None) -> dict | None:
    """The conversion manifest next to (or above) a shard directory, a .beton or a dataset root."""
    if not path:
        return None
    p = Path(path.split("{")[0]) if "{" in path else Path(path)
    for d in (p, p.parent, p.parent.parent):
        if (d / MANIFEST).is_file():
            try:
                with open(d / MANIFEST) as f:
                    return json.load(f)
            except (OSError, ValueError) as e:
                raise DataError(
                    f"cannot read the conversion manifest {d / MANIFEST}: {type(e).__name__}: {e}; "
                    "re-create it with `python -m hypersolid_scale.data.convert`, or remove it "
                    "(sample counts are then read from the shards)"
                ) from e
    return None
