"""One source of batches for the whole run: the same worker pool and stage thread from the first step to the last.

A loader that builds a new DataLoader every epoch forks new workers, and starts a new stage thread
(`prefetch.staged`), at every epoch boundary: the step then waits for the workers to start and to make the
epoch's first batches, while the GPU idles (issue #41: ~1.8 s a boundary at batch 128 on an H100). Instead
the loaders open ONE iterator over every epoch's batches, from a start position on (its workers produce epoch
e + 1's batches while the main process still takes epoch e's), and take `count - start` batches of it per
epoch. `RunStream` keeps that iterator and where it is; an epoch that does not start where the previous one
stopped (a restored position, `set_epoch` jumping, a changed epoch length, a consumer that stopped mid-epoch
and comes back elsewhere) closes it and opens a new one at the requested position. Which samples and views a
batch holds depend only on (seed, epoch, batch) as before (docs/design.md §3b): the stream is an optimisation
of when batches are made, never of what they are.

Hand-written: torch's ``persistent_workers`` keeps a pool across epochs but re-creates each worker's
iterator at every epoch (the dataset copy in the workers cannot learn the new epoch) and still waits for the
first batch of each epoch; torchdata's nodes know neither resumable positions nor CUDA streams.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

Position = tuple[int, int, int]  # (epoch, next batch, batches per epoch)


class RunStream:
    """Hands out epoch after epoch of one long-lived iterator, opened by ``open(epoch, start)``.

    ``open`` returns an iterator over the batches of epoch `epoch` from batch `start` on, then of every later
    epoch from batch 0, without end; it must not refer back to the loader (see __init__).
    ``epoch(e, start, count)`` yields batches start..count-1 of epoch e.
    """

    def __init__(self, open_: Callable[[int, int], Iterator[Any]]) -> None:
        # A loader's own method is held weakly, and the opened iterator holds no reference to the loader: a
        # loader that is dropped without close() is freed at once, and with it the workers and the thread.
        self._open: Callable[[], Callable[[int, int], Iterator[Any]] | None] = (
            weakref.WeakMethod(open_) if hasattr(open_, "__self__") else lambda: open_
        )
        self._it: Iterator[Any] | None = None
        self._next: Position | None = None  # where the open iterator is
        self.opened = 0  # how many iterators (worker pools, stage threads) this run opened

    def epoch(self, epoch: int, start: int, count: int) -> Iterator[Any]:
        if self._it is None or self._next != (epoch, start, count):
            self.close()
            open_ = self._open()
            assert open_ is not None  # its loader is alive: it called this
            self._it = open_(epoch, start)
            self.opened += 1
        it = self._it
        for b in range(start, count):
            try:
                item = next(it)
            except StopIteration:
                self.close()
                raise RuntimeError(f"the run's batch stream ended in epoch {epoch} at batch {b} of {count}") from None
            except BaseException:  # the stream is in an unknown state: a next epoch opens a new one
                self.close()
                raise
            # Before the yield: a consumer that stops after this batch leaves the stream at the right place.
            self._next = (epoch, b + 1, count) if b + 1 < count else (epoch + 1, 0, count)
            yield item

    def close(self) -> None:
        """Stop the workers and the stage thread (idempotent)."""
        it, self._it, self._next = self._it, None, None
        close = getattr(it, "close", None)
        if close is not None:
            close()
