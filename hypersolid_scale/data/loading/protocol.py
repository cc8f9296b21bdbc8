"""`TrainLoader`: what the trainer, the run builder and the resume ask of a training loader, whatever its format.

Every format's training loader is one (they share `common.ResumableEpochs`; tests/test_data_formats.py checks
each). Iterating gives the epoch's batches `(views, labels)`, from the position `load_state_dict` restored; a
batch counts as consumed when it is handed out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from hypersolid_scale.data.device.views import DeviceStage


@runtime_checkable
class TrainLoader(Protocol):
    # Per-epoch counters summed over ranks in the epoch report (skipped samples, lost shards, data wait).
    stats: dict[str, float]
    # True when batch t holds the same samples whatever the world size (the position carries to another world
    # size at the same global batch); False for WebDataset, whose streams are split by rank.
    world_size_invariant: bool
    # data.views_on=device: the stage the builder prepares before the first step; None otherwise.
    device_stage: DeviceStage | None

    def __len__(self) -> int:
        """Global batches per epoch, the same on every rank."""
        ...

    def __iter__(self) -> Iterator[tuple[list[torch.Tensor], torch.Tensor]]: ...

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, batches handed out) and the stats, for the checkpoint."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None:
        """Stop the loader's workers and threads (at the end of the run, or when it fails)."""
        ...
