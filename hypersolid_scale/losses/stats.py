"""Telemetry that stays on the device: one packed vector of named statistics, read on the host on demand.

A ``float(tensor)`` on a CUDA tensor waits until the GPU has finished everything queued before it; done for
ten statistics every step it drains the queue ten times and leaves the GPU idle while the host catches up.
So the loss and the trainer keep their statistics in one 1-D float64 tensor on the device
(:class:`PackedStats`) and convert it to Python floats in one transfer, only where a human or a file needs
the numbers (logging steps, epoch summaries).

:class:`HostValue` covers the one case where host code must *act* on a device value every step (the
``auto`` backend choice, the preemption vote): the value is copied to pinned host memory without blocking
and read one step later, once the GPU has long finished producing it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class PackedStats:
    """Named statistics as one 1-D float64 tensor on the device.

    ``names[i]`` labels ``values[i]``. Indexing by name returns a 0-dim view (still on the device);
    :meth:`to_dict` is the one host transfer.
    """

    names: tuple[str, ...]
    values: torch.Tensor  # (len(names),) float64

    def __post_init__(self) -> None:
        if self.values.dim() != 1 or self.values.numel() != len(self.names):
            raise ValueError(f"PackedStats: {len(self.names)} names for values of shape {tuple(self.values.shape)}")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"PackedStats: duplicate names in {self.names}")

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise KeyError(f"no statistic {name!r}; available: {', '.join(self.names)}") from None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.values[self.index(name)]

    def __contains__(self, name: object) -> bool:
        return name in self.names

    def to_dict(self) -> dict[str, float]:
        """Python floats: ONE device-to-host transfer (a synchronisation on CUDA)."""
        return dict(zip(self.names, self.values.tolist()))

    def extend(self, extra: Mapping[str, torch.Tensor | float]) -> PackedStats:
        """A new PackedStats with ``extra`` appended; Python floats become device scalars without a copy."""
        dev = self.values.device
        tail = [
            v.detach().to(device=dev, dtype=torch.float64).reshape(())
            if isinstance(v, torch.Tensor)
            else torch.full((), float(v), dtype=torch.float64, device=dev)  # a fill kernel, not a host copy
            for v in extra.values()
        ]
        if not tail:
            return self
        return PackedStats(self.names + tuple(extra), torch.cat([self.values, torch.stack(tail)]))


def pack(values: Mapping[str, torch.Tensor]) -> PackedStats:
    """Stack 0-dim device tensors (any float dtype) into a PackedStats, in the mapping's order."""
    return PackedStats(tuple(values), torch.stack([v.detach().to(torch.float64).reshape(()) for v in values.values()]))


class HostValue:
    """A small device tensor copied to host memory without making the host wait; read it later.

    ``put`` queues a non-blocking copy into a pinned buffer and records a CUDA event behind it; ``get`` waits
    for that event and returns a NumPy copy. Read one step after ``put``, the event has long completed (it
    was queued before the previous step's backward pass), so the wait returns at once and, unlike a
    ``float(tensor)``, never drains the GPU's queue. On the CPU there is nothing to overlap: ``get`` reads
    the value directly.
    """

    def __init__(self) -> None:
        self._buf: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self._ready = False

    def put(self, value: torch.Tensor) -> None:
        value = value.detach()
        if value.is_cuda:
            if self._buf is None or self._buf.shape != value.shape or self._buf.dtype != value.dtype:
                self._buf = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
                self._event = torch.cuda.Event()
            self._buf.copy_(value, non_blocking=True)
            assert self._event is not None  # made with the buffer
            self._event.record()
        else:
            self._buf, self._event = value.clone(), None
        self._ready = True

    @property
    def ready(self) -> bool:
        """True when a value was put and not yet read."""
        return self._ready

    def get(self) -> np.ndarray:
        value = self.peek()
        if value is None:
            raise RuntimeError("HostValue.get() before put(): nothing to read")
        self._ready = False
        return value

    def peek(self) -> np.ndarray | None:
        """The value waiting to be read, left waiting (None when there is none): for a checkpoint, which
        stores what the next ``get`` will return."""
        if not self._ready or self._buf is None:
            return None
        if self._event is not None:
            self._event.synchronize()  # waits for work queued a step ago, not for the current step
        return self._buf.numpy().copy()
