"""The photometric chain of the preset's views, batched: colour jitter, grayscale, blur, solarization and
normalisation, per sample, with the PIL path's semantics (lightly's DINOViewTransform order: colour jitter
(p, random order of the four jitters) -> grayscale -> blur (per view type) -> solarize (global_1 only) ->
normalize).

Used by the FFCV loader (after FFCV decoded, cropped and flipped each view), the in-memory multi-crop
(`tensor_aug.TensorMultiCrop`) and the device stage of data.views_on=device (`data/device/views.py`, with the PIL
path's own draws). Decisions are made on the CPU and travel with the views (the device stage sends a whole
batch's in one copy); the chain reads nothing back from the device, and its number of calls does not depend on
the batch (docs/design.md §3e).
Pass ``record={}`` to get the per-sample decisions back (used by the parity tests).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hypersolid_scale.data.augment.blur import gaussian_blur, kernel_size
from hypersolid_scale.data.augment.color import gray, hue_shift
from hypersolid_scale.data.augment.keyed_draws import (
    COL_BLUR,
    COL_GRAY,
    COL_JITTER,
    COL_JITTER_FACTORS,
    COL_JITTER_ORDER,
    COL_SIGMA,
    COL_SOLARIZE,
    check_indices,
    keyed_uniforms,
)
from hypersolid_scale.data.augment.presets import MultiCropPreset


def _jitter_op(k: int, x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Jitter `k` (0 brightness, 1 contrast, 2 saturation, 3 hue) of rows x with their (n, 4) factors."""
    f = factors[:, k].view(-1, 1, 1, 1)
    if k == 0:
        return x * f
    if k == 1:
        return f * x + (1 - f) * gray(x).mean(dim=(1, 2, 3), keepdim=True)
    if k == 2:
        return f * x + (1 - f) * gray(x)
    return hue_shift(x, factors[:, 3])


def _lerp(lo: float, hi: float, u: torch.Tensor) -> torch.Tensor:
    return lo + (hi - lo) * u


@dataclass
class Decisions:
    """One view's photometric decisions for a batch, per sample (B rows).

    jitter/gray/blur/solarize: (B,) bool, applied or not; factors: (B, 4) brightness, contrast and
    saturation factors and the hue shift (a fraction of a turn); order: (B, 4) the jitters' order
    (0 brightness, 1 contrast, 2 saturation, 3 hue); sigma: (B,) the blur's standard deviation.
    """

    jitter: torch.Tensor
    factors: torch.Tensor
    order: torch.Tensor
    gray: torch.Tensor
    blur: torch.Tensor
    sigma: torch.Tensor
    solarize: torch.Tensor


class BatchPhotometric:
    """Color jitter, grayscale, blur, solarization and normalisation of a batch of views, per sample.

    Draws come from `keyed_uniforms(seed, epoch, indices, view)`, so they follow the samples (`view`); or
    they are given (`apply`: the device path passes the PIL path's own draws). The decisions are made on the
    CPU and sent to the device with the views.

    Which chain runs is `chain`: ``compiled``, or ``eager`` and why (asked for, or the compiler failed here).
    On the CPU device the eager chain runs each step on its rows (indices from the host decisions); on any
    other device it is the `where` chain uncompiled (row indices would be one host->device copy each).
    """

    def __init__(
        self, preset: MultiCropPreset, device: torch.device | str, seed: int = 0, compile: bool | None = None
    ) -> None:
        """compile: run the chain through ``torch.compile`` (default: on CUDA), which fuses its elementwise
        calls into a few kernels per view; a compiler that fails (`compile_failure`) falls back to the eager
        chain with a warning and says so in `chain`; any other error, a CUDA one included, is raised."""
        self.preset = preset
        self.device = torch.device(device)
        self.seed = int(seed)
        self.mean = torch.tensor(preset.mean, device=self.device).view(1, -1, 1, 1)
        self.std = torch.tensor(preset.std, device=self.device).view(1, -1, 1, 1)
        if compile is None:
            compile = self.device.type == "cuda"
        # The device stage calls it from its prefetch thread (data/device/prefetch.py). torch.compile is not
        # thread-safe: `prepare` compiles it on the main thread before training starts (the model's compile, if
        # any, comes later on that same thread); the thread's batches of the same shapes only check the graph's
        # guards.
        self._compiled = (
            torch.compile(self._chain, fullgraph=True, dynamic=False, options=batch_invariant_options())
            if compile
            else None
        )
        self.chain = "compiled" if compile else "eager (compile off)"

    @property
    def compiled(self) -> bool:
        """Whether the chain runs compiled (False: asked for eager, or the compiler failed and it fell back)."""
        return self._compiled is not None

    def prepare(self, batch_size: int, sizes: list[int]) -> str:
        """Compile the chain for views of `batch_size` x `sizes` (what the loader gives) now, on the calling
        thread, so that no batch compiles it later (and no thread runs Dynamo beside the main one). Returns
        `chain`. Nothing to do eager."""
        if self._compiled is None:
            return self.chain
        c = self.preset.channels
        d = Decisions(
            jitter=torch.ones(batch_size, dtype=torch.bool),
            factors=torch.ones(batch_size, 4),
            order=torch.arange(4).repeat(batch_size, 1),
            gray=torch.zeros(batch_size, dtype=torch.bool),
            blur=torch.ones(batch_size, dtype=torch.bool),
            sigma=torch.ones(batch_size),
            solarize=torch.zeros(batch_size, dtype=torch.bool),
        )
        for size in dict.fromkeys(sizes):
            self.apply(torch.zeros(batch_size, c, size, size, device=self.device), d)
        return self.chain

    def decisions(self, u: torch.Tensor, index: int) -> Decisions:
        """View `index`'s decisions from its uniforms `u` (B, NUM_COLUMNS) (torchvision's ColorJitter ranges)."""
        p = self.preset
        bri, con, sat, hue = p.jitter_ranges()
        f = u[:, COL_JITTER_FACTORS : COL_JITTER_FACTORS + 4]
        factors = torch.stack(
            [
                _lerp(max(0.0, 1 - bri), 1 + bri, f[:, 0]),
                _lerp(max(0.0, 1 - con), 1 + con, f[:, 1]),
                _lerp(max(0.0, 1 - sat), 1 + sat, f[:, 2]),
                _lerp(-hue, hue, f[:, 3]),
            ],
            dim=1,
        )
        return Decisions(
            jitter=u[:, COL_JITTER] < p.cj_prob,
            factors=factors,
            order=torch.argsort(u[:, COL_JITTER_ORDER : COL_JITTER_ORDER + 4], dim=1, stable=True),
            gray=u[:, COL_GRAY] < p.gray_prob,
            blur=u[:, COL_BLUR] < p.view_blur_probs()[index],
            sigma=_lerp(p.blur_sigmas[0], p.blur_sigmas[1], u[:, COL_SIGMA]),
            solarize=u[:, COL_SOLARIZE] < p.view_solarize_probs()[index],
        )

    def _jitter(self, x: torch.Tensor, factors: torch.Tensor, order: torch.Tensor, on: torch.Tensor) -> torch.Tensor:
        """torchvision ColorJitter semantics: the four jitters in each sample's order, where `on` (for `_chain`).

        Every stage computes each jitter for the whole batch with the sample's factor where the sample takes
        that jitter at that stage, and the neutral factor (1, exactly the identity) elsewhere; the hue, not
        an identity at shift 0 in float, is chosen per sample with `where`.
        """
        n = x.shape[0]
        rgb = x.shape[1] == 3
        one = torch.ones((), device=x.device, dtype=x.dtype)
        for stage in range(4):
            op = order[:, stage]
            take = [((op == k) & on).view(n, 1, 1, 1) for k in range(4)]
            fb, fc, fs = (torch.where(take[k], factors[:, k].view(n, 1, 1, 1), one) for k in range(3))
            x = (x * fb).clamp(0.0, 1.0)
            x = (fc * x + (1 - fc) * gray(x).mean(dim=(1, 2, 3), keepdim=True)).clamp(0.0, 1.0)
            if rgb:  # saturation and hue: no-ops on one channel
                x = (fs * x + (1 - fs) * gray(x)).clamp(0.0, 1.0)
                x = torch.where(take[3], hue_shift(x, factors[:, 3]).clamp(0.0, 1.0), x)
        return x

    def _blur(self, x: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        """Per-sample Gaussian blur as a fixed sum over its taps (`blur.py`: kornia's values, no grouped conv)."""
        _, _, h, w = x.shape
        return gaussian_blur(x, sigma.to(x.device, non_blocking=True), kernel_size(h, w, self.preset.blur_sigmas[1]))

    def view(self, x: torch.Tensor, index: int, u: torch.Tensor, record: dict | None = None) -> torch.Tensor:
        """Augment and normalise view number `index` ((B, C, H, W) float in [0, 1] or uint8).

        `u`: (B, NUM_COLUMNS) uniforms of this view (`keyed_uniforms`, on the CPU: the decisions are made on
        the host and sent with the views, so nothing is read back); the photometric columns are used.
        Always float32, also when called inside an autocast region (the views must not depend on the caller).
        """
        return self.apply(x, self.decisions(u.cpu(), index), record)

    def apply(self, x: torch.Tensor, d: Decisions, record: dict | None = None) -> torch.Tensor:
        """Augment and normalise a batch of views with the decisions `d`: made on the CPU, and either still
        there (each is sent with x) or already on x's device (`DeviceStage` sends a batch's in one copy)."""
        if x.dtype == torch.uint8:
            x = x.to(self.device, non_blocking=True).float().div_(255.0)
        else:  # a copy of our own: the eager chain writes into it
            x = x.to(self.device).float().clone()
        # Neither autocast nor grad mode reaches the chain: the views do not depend on the caller, and the
        # compiled graph's guards see the same state on every thread.
        no_autocast = (
            torch.autocast(self.device.type, enabled=False)
            if torch.amp.is_autocast_available(self.device.type)
            else contextlib.nullcontext()  # a device without autocast (meta: the tests count copies there)
        )
        with no_autocast, torch.no_grad():
            out = self._run_chain(x, d)
        if record is not None:
            for name in ("jitter", "gray", "blur", "solarize"):
                record.setdefault(name, []).append(getattr(d, name).cpu())
        return out

    def _run_chain(self, x: torch.Tensor, d: Decisions) -> torch.Tensor:
        if self._compiled is None and self.device.type == "cpu":
            return self._chain_subsets(x, d)
        # No copy for a tensor already there; contiguous, as `prepare` compiled the chain for (a slice of the
        # batch's draws is not).
        send = lambda t: t.to(self.device, non_blocking=True).contiguous()  # noqa: E731
        sigma = torch.where(d.blur, d.sigma, 1.0)  # a sample left sharp: any valid sigma (its blur is not taken)
        args = [send(t) for t in (sigma, d.jitter, d.gray, d.blur, d.solarize, d.factors, d.order)]
        if self._compiled is not None:
            try:
                return self._compiled(x, *args)
            except Exception as err:
                if not compile_failure(err):
                    raise
                self.chain = f"eager (compile failed: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]})"
                warnings.warn(f"the compiled photometric chain failed; running it eagerly: {self.chain}", stacklevel=3)
                self._compiled = None
        return self._chain(x, *args)

    def _chain_subsets(self, x: torch.Tensor, d: Decisions) -> torch.Tensor:
        """The eager chain: each step on the rows it applies to, picked by indices made on the host from the
        decisions (no read of the device, and at most a fixed number of calls per view whatever the batch)."""
        factors = d.factors.to(self.device, non_blocking=True)
        rgb = x.shape[1] == 3
        if self.preset.cj_prob > 0:
            for stage in range(4):
                for k in range(4 if rgb else 2):  # saturation and hue: no-ops on one channel
                    if (idx := self._rows(d.jitter & (d.order[:, stage] == k))) is not None:
                        y = _jitter_op(k, x.index_select(0, idx), factors.index_select(0, idx))
                        x.index_copy_(0, idx, y.clamp_(0.0, 1.0))
        if (idx := self._rows(d.gray)) is not None:
            x.index_copy_(0, idx, gray(x.index_select(0, idx)).expand(-1, x.shape[1], -1, -1))
        if (idx := self._rows(d.blur)) is not None:
            x.index_copy_(0, idx, self._blur(x.index_select(0, idx), d.sigma[d.blur]))
        sol = d.solarize.to(self.device, non_blocking=True).view(-1, 1, 1, 1)
        # PIL ImageOps.solarize(threshold=128) inverts pixels >= 128 (of 255).
        x = torch.where(sol & (x >= 128 / 255), 1.0 - x, x)
        return (x - self.mean) / self.std

    def _rows(self, mask: torch.Tensor) -> torch.Tensor | None:
        """The device's copy of the indices of a host mask's rows; None when there are none."""
        idx = mask.nonzero().flatten()  # on the host
        return idx.to(self.device, non_blocking=True) if idx.numel() else None

    def _chain(
        self,
        x: torch.Tensor,
        sigma: torch.Tensor,
        jit: torch.Tensor,
        grays: torch.Tensor,
        blur: torch.Tensor,
        sol: torch.Tensor,
        factors: torch.Tensor,
        order: torch.Tensor,
    ) -> torch.Tensor:
        """The chain for the compiler: static shapes, every decision applied with `where` over the whole batch."""
        # No boolean-mask indexing and no read of a device value on the host, a fixed number of calls (fused
        # by the compiler into a few kernels); every jitter is computed for the whole batch at each stage.
        n = x.shape[0]
        if self.preset.cj_prob > 0:
            x = self._jitter(x, factors, order, jit)
        x = torch.where(grays.view(n, 1, 1, 1), gray(x).expand_as(x), x)
        if max(self.preset.view_blur_probs()) > 0:  # the preset's setting: no look at the data
            x = torch.where(blur.view(n, 1, 1, 1), self._blur(x, sigma), x)
        # PIL ImageOps.solarize(threshold=128) inverts pixels >= 128 (of 255).
        x = torch.where(sol.view(n, 1, 1, 1) & (x >= 128 / 255), 1.0 - x, x)
        return (x - self.mean) / self.std

    def __call__(
        self, views: list[torch.Tensor], indices: torch.Tensor, epoch: int, record: dict | None = None
    ) -> list[torch.Tensor]:
        """views[i]: (B, C, H, W) of view i; indices: (B,) the samples' dataset indices (on the CPU)."""
        idx = check_indices(indices, views[0].shape[0]).cpu()
        return [self.view(v, i, keyed_uniforms(self.seed, epoch, idx, i), record) for i, v in enumerate(views)]


def batch_invariant_options() -> dict[str, str | int | bool | Callable[..., Any]]:
    """Inductor's batch-invariant mode, where this torch has it (``torch._inductor.config.batch_invariant``).

    Without it, inductor may choose a reduction's kernel configuration from the batch size (the chain's largest
    reduction is the contrast jitter's per-image mean), so a batch split across ranks can sum an image in
    another order: the H200 run of tests/test_data_invariance.py's CUDA test saw views 1.9e-6 apart between a
    batch of 16 and its halves (docs/benchmarks.md, "GPU runs of 2026-12-04"). Where torch lacks the option the
    chain compiles as before."""
    from torch._inductor import config

    return {"batch_invariant": True} if hasattr(config, "batch_invariant") else {}


def compile_failure(err: BaseException) -> bool:
    """Whether `err` is the compiler failing here (Dynamo or Inductor: no C compiler, an op it cannot trace),
    which the eager chain may replace; not when a device error (CUDA's, out of memory) is behind it."""
    from torch._dynamo.exc import TorchDynamoException

    if not isinstance(err, TorchDynamoException):
        return False
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, (torch.AcceleratorError, torch.OutOfMemoryError)) or "CUDA error" in str(seen):
            return False
        seen = seen.__cause__ or seen.__context__
    return True
