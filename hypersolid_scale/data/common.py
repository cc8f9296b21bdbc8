"""Pieces shared by every loader: epoch/position bookkeeping for resume, seeds, manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import numpy as np

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
            "lower data.batch_size_per_gpu or use more data")
    return n


def rank_indices(num_samples: int, *, rank: int, world_size: int, batch_size: int, seed: int, epoch: int,
                 shuffle: bool = True) -> np.ndarray:
    """This rank's sample indices for `epoch`: a seeded permutation, strided by rank, cut to full batches."""
    order = np.random.default_rng(mix_seed(seed, epoch)).permutation(num_samples) if shuffle \
        else np.arange(num_samples)
    per_rank = batches_per_epoch(num_samples, world_size, batch_size) * batch_size
    return order[rank::world_size][:per_rank]


class ResumableEpochs:
    """`set_epoch` / `state_dict` / `load_state_dict` / `stats` of every training loader.

    The position is (epoch, batches handed out in that epoch). A batch counts as consumed as soon as it
    is handed out, so a checkpoint written after training on batch k resumes at batch k + 1.
    """

    def __init__(self) -> None:
        self.epoch = 0
        self._skip = 0  # batches to skip at the start of the next iteration (restored position)
        self._done = 0
        self.stats: dict[str, float] = {}

    _len: int = 0

    def limit_batches(self, n: int) -> None:
        """Cap batches per epoch (quick runs); every rank gets the same cap."""
        if n < 1:
            raise ValueError(f"epoch_length must be >= 1, got {n}")
        self._len = min(self._len, n)

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


def find_manifest(path: Optional[str]) -> Optional[dict]:
    """The conversion manifest next to (or above) a shard directory, a .beton or a dataset root."""
    if not path:
        return None
    p = Path(path.split("{")[0]) if "{" in path else Path(path)
    for d in (p, p.parent, p.parent.parent):
        if (d / MANIFEST).is_file():
            with open(d / MANIFEST) as f:
                return json.load(f)
    return None
