"""Per-step bookkeeping of the training loop that never makes the host wait for the GPU.

Reading a CUDA value on the host (``float(t)``, ``bool(t)``, ``.item()``) waits until the GPU has finished
everything queued, and the GPU then idles while the host prepares the next step. The training loop only
reads device values where it must wait anyway (logging steps, epoch ends, checkpoints); these pieces keep
everything else on the device:

* :class:`NonFiniteGuard`: records the first non-finite step on the device; ``check`` raises
  :class:`NonFiniteLossError` (the trainer calls it at logging steps, epoch ends and before every save).
* :class:`StopVote`: every rank agrees on a preemption signal, reading the vote one step late.
* :class:`EpochMeter`: epoch sums of the step statistics on the device; timings per logging window.
"""

from __future__ import annotations

import time

import torch

from hypersolid_scale.distributed import all_reduce_max, all_reduce_max_flag, is_distributed
from hypersolid_scale.losses.stats import HostValue, PackedStats


class NonFiniteLossError(FloatingPointError):
    """The loss became NaN/inf; no checkpoint was written after that step, the newest one is the last good state."""


class NonFiniteGuard:
    """Remembers, on the device, the first step whose statistics were not finite (see
    ``hypersolid_scale.training.trainer``).

    ``record`` queues a few tiny kernels and never reads anything on the host; ``check`` reads the record
    (one host synchronisation) and raises :class:`NonFiniteLossError` if a step went bad. The statistics are
    reduced across ranks before they get here, so every rank holds the same record and raises at the same
    check: no rank is left waiting in a collective.
    """

    def __init__(self, device: torch.device, run_dir: str) -> None:
        self.run_dir = run_dir
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self.bad_values: torch.Tensor | None = None  # the statistics of the first bad step
        self.names: tuple[str, ...] = ()

    def record(self, step: int, stats: PackedStats) -> None:
        if self.bad_values is None or self.names != stats.names:
            if self.bad_values is not None:
                self.check()  # the layout changed: settle the old record before starting a new one
            self.names, self.bad_values = stats.names, torch.zeros_like(stats.values)
        bad = ~torch.isfinite(stats.values).all()
        if "nonfinite" in stats:
            bad = bad | (stats["nonfinite"] > 0)
        newly = bad & (self.first_bad < 0)
        self.first_bad = torch.where(newly, torch.full_like(self.first_bad, step), self.first_bad)
        self.bad_values = torch.where(newly, stats.values, self.bad_values)

    def check(self) -> None:
        """Raise if any recorded step was not finite. A host synchronisation: call it where one is paid anyway."""
        step = int(self.first_bad)
        if step < 0:
            return
        assert self.bad_values is not None  # recorded with first_bad
        what = ", ".join(f"{k}={v:.4g}" for k, v in zip(self.names, self.bad_values.tolist()))
        raise NonFiniteLossError(
            f"non-finite loss at step {step} ({what}). Training stopped before any checkpoint was written after "
            f"that step: the newest checkpoint in {self.run_dir}/checkpoints is the last good state. Lower "
            "optim.lr, set optim.grad_clip, or use dist.precision=fp32"
        )


class StopVote:
    """Every rank agrees to stop when any rank got a preemption signal, without a host sync per step.

    Called once per step with this rank's flag. Deferred (the default with several CUDA ranks): the flag is
    max-reduced on the device and the result copied to pinned memory without blocking; the call returns the
    result of the PREVIOUS step's vote, so all ranks stop after the same step, one step after the signal.
    Otherwise (one process, or gloo on the CPU, where the collective blocks anyway) the answer is immediate.
    ``now`` votes synchronously, counting a pending vote too (epoch ends).
    """

    def __init__(self, device: torch.device, deferred: bool | None = None) -> None:
        self.device = device
        self.deferred = (is_distributed() and device.type == "cuda") if deferred is None else deferred
        self._pending = HostValue()

    def _pending_flag(self) -> bool:
        return bool(self._pending.get()[0] > 0) if self._pending.ready else False

    def __call__(self, flag: bool) -> bool:
        if not self.deferred:
            return all_reduce_max_flag(flag)
        agreed = self._pending_flag()
        self._pending.put(all_reduce_max(torch.full((1,), float(flag), device=self.device)))
        return agreed

    def now(self, flag: bool) -> bool:
        return all_reduce_max_flag(flag or self._pending_flag())


class EpochMeter:
    """Per-epoch running sums of the step statistics (on the device) and host timings per logging window.

    Throughput is measured between logging steps: there the host has just waited for the GPU, so the
    elapsed wall time covers the window's GPU work; a single step's host time only measures kernel launches.
    """

    def __init__(self, steps_per_epoch: int, device: torch.device) -> None:
        self.n, self.summed = 0, 0
        self.names: tuple[str, ...] = ()
        self.sum: torch.Tensor | None = None
        self.losses = torch.zeros(steps_per_epoch, dtype=torch.float64, device=device)  # for the loss plot
        self.t_epoch = self.t_window = time.perf_counter()
        self.window_steps, self.window_data_s = 0, 0.0
        self.data_s = 0.0  # this epoch's time waiting for the loader
        # The wait for the epoch's first batch (the boundary stall: starting workers, a restored position's skip),
        # reported apart from the steady state's wait (docs/training.md, "Waiting for data").
        self.boundary_s = 0.0

    def add(self, stats: PackedStats, data_time_s: float) -> None:
        if self.sum is None or self.names != stats.names:
            # A new layout (say, a grad norm that appears after the first step): average it from here on.
            self.names, self.sum, self.summed = stats.names, torch.zeros_like(stats.values), 0
        assert self.sum is not None
        self.sum += stats.values
        self.summed += 1
        if self.n < self.losses.numel():
            self.losses[self.n] = stats["loss"]  # an indexed device copy, no host read
        if self.n == 0:
            self.boundary_s = data_time_s
        self.n += 1
        self.window_steps += 1
        self.window_data_s += data_time_s
        self.data_s += data_time_s

    def window(self, global_batch: int) -> dict[str, float]:
        """Mean timings since the last call (call right after a host transfer, i.e. once the GPU caught up)."""
        now = time.perf_counter()
        steps, elapsed = max(1, self.window_steps), max(now - self.t_window, 1e-9)
        out = {
            "images_per_s": global_batch * steps / elapsed,
            "step_time_s": elapsed / steps,
            "data_time_s": self.window_data_s / steps,
            # The share of the wall time spent waiting for the next batch: near 0 when the loader keeps up,
            # the GPU's idle share when it starves it.
            "data_wait_share": self.window_data_s / elapsed,
        }
        self.t_window, self.window_steps, self.window_data_s = now, 0, 0.0
        return out

    def summary(self, global_batch: int) -> tuple[dict[str, float], list[float]]:
        """Epoch means of every statistic plus throughput, and the per-step losses: one host transfer."""
        assert self.sum is not None  # summary() follows add()
        values = torch.cat([self.sum / max(1, self.summed), self.losses[: min(self.n, self.losses.numel())]]).tolist()
        mean = dict(zip(self.names, values[: len(self.names)]))
        elapsed = max(time.perf_counter() - self.t_epoch, 1e-9)
        mean["images_per_s"] = global_batch * self.n / elapsed
        mean["data_wait_share"] = self.data_s / elapsed  # the whole epoch's, boundary stall included
        mean["boundary_stall_s"] = self.boundary_s
        # The share after the first batch arrived: what the loader costs once it runs.
        mean["steady_wait_share"] = (self.data_s - self.boundary_s) / max(elapsed - self.boundary_s, 1e-9)
        return mean, values[len(self.names) :]


def loggable(values: dict[str, float]) -> dict[str, float]:
    """Drop recall on steps that did not measure it (it reads 1.0 there by construction)."""
    if values.get("recall_measured", 1.0) == 0:
        values = {k: v for k, v in values.items() if k not in ("recall", "recall_measured")}
    return values
