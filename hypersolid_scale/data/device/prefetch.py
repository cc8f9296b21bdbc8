"""Run a loader's device stage ahead of the training step: in its own thread, on its own CUDA stream.

`data.views_on=device` finishes each batch in the training process (`views.DeviceStage`: decode, crops,
photometric chain). Called from the loader's generator, that work sits on the step's critical path: the
step waits for the next batch's views while the GPU idles. `staged` instead runs the stage `depth` batches
ahead in a background thread, on a side stream, and hands each batch over with an event the consumer's stream
waits for; the GPU then overlaps the next batch's augmentation with the current step, and the host issues
both. `depth=0` runs the stage inline (the CPU default: there the stage and the step share the same cores).

Hand-written: torch's DataLoader prefetches in worker processes, which cannot hold CUDA tensors made by this
process's streams; torchdata's thread nodes know nothing of CUDA streams, and the hand-over here is exactly
one event and one ``record_stream`` per tensor.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch

_DONE = object()


def staged(
    items: Iterator[Any], stage: Callable[[Any], Any], *, depth: int, device: torch.device
) -> Iterator[tuple[Any, Any]]:
    """``(stage(item), item)`` for each item of `items`, in order, computed up to `depth` items ahead.

    `stage` returns ``(views, extra)``: a list of tensors, which the consumer may use on its current stream at
    once, and anything else that goes with them (a count of the batch's replaced images, say).
    An exception in the source or the stage is raised in the consumer, at the item where it happened.
    Closing the returned generator stops the thread and closes `items` (DataLoader workers shut down).
    """
    if depth < 0:
        raise ValueError(f"prefetch depth must be >= 0, got {depth}")
    if depth == 0:
        for item in items:
            yield stage(item), item
        return
    yield from _Ahead(items, stage, depth, device)


class _Ahead:
    """The thread and the bounded queue behind `staged` (depth >= 1)."""

    def __init__(self, items: Iterator[Any], stage: Callable[[Any], Any], depth: int, device: torch.device) -> None:
        self.items, self.stage, self.device = items, stage, device
        self.out: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.thread = threading.Thread(target=self._run, name="device-stage", daemon=True)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        self.thread.start()
        try:
            while True:
                got = self.out.get()
                if got is _DONE:
                    return
                kind, value, item, event = got
                if kind == "error":
                    raise value
                if event is not None:
                    consumer = torch.cuda.current_stream(self.device)
                    consumer.wait_event(event)
                    # The allocator must not hand these tensors' memory to the side stream's next batch
                    # while the consumer's stream still reads them.
                    for t in value[0]:
                        t.record_stream(consumer)
                yield value, item
        finally:
            self.stop.set()
            while self.thread.is_alive():  # unblock a put() waiting on a full queue
                try:
                    self.out.get(timeout=0.05)
                except queue.Empty:
                    pass
            self.thread.join()

    def _put(self, got: Any) -> bool:
        """Put `got` unless the consumer left; False once it has."""
        while not self.stop.is_set():
            try:
                self.out.put(got, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self.items:
                if self.stop.is_set():
                    break
                if self.stream is None:
                    views, event = self.stage(item), None
                else:
                    with torch.cuda.stream(self.stream):
                        views = self.stage(item)
                        event = torch.cuda.Event()
                        event.record(self.stream)
                if not self._put(("ok", views, item, event)):
                    break
            else:
                self._put(_DONE)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            self._put(("error", err, None, None))
        finally:
            close = getattr(self.items, "close", None)
            if close is not None:
                close()
