"""`data.views_on=device`: each JPEG decoded once, on the training device, and every view cut from that decode.

Two stages (docs/design.md §3e):

- `HostStage` runs in the DataLoader workers, per sample: it reads the image header (not the pixels) and
  draws the view parameters exactly as the PIL path would (`view_params.py`, under the same per-sample
  seeding). A JPEG in the preset's colour mode travels undecoded (`data.jpeg_decoder=device`) or decoded by
  libjpeg-turbo in the worker (`data.jpeg_decoder=workers`); any other file (PNG, CMYK JPEG, ...) is decoded
  in the worker with PIL, as the PIL path decodes it. A file whose header does not parse, or a JPEG without
  its end marker (truncated), is decoded in the worker too, so the PIL decoder's error skips and counts it.
- `DeviceStage` runs in the main process, per batch: `torchvision.io.decode_jpeg(list, device=...)` decodes
  the batch's JPEGs (nvJPEG on CUDA) and one copy packs them end to end (no padding); then, per view and for
  the whole batch at once: `batched_resize.crop_resize_packed` cuts and resizes every crop box with PIL's
  antialiased bicubic filter (8-bit levels, mirrored where drawn; one call per group of similar box sizes,
  each over its own window) and `BatchPhotometric.apply` runs the
  photometric chain with the PIL path's decisions, as per-sample tensors. A fixed number of calls per view
  whatever the batch size, and no read of a device value on the host. The loaders run the stage ahead of
  the step, in a thread on a side CUDA stream (`prefetch.staged`; one batch ahead on CUDA, inline on the CPU).

A JPEG that fails on the device (it passed the header checks) is decoded on the CPU instead; one that fails
there too is replaced by the batch's previous good image and counted in `stats["corrupt_skipped"]` with a
warning: the batch keeps its size on every rank.
"""

from __future__ import annotations

import io
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate
from torchvision.io import ImageReadMode, decode_jpeg

from hypersolid_scale.data.augment import view_params as vp
from hypersolid_scale.data.augment.photometric import BatchPhotometric, Decisions
from hypersolid_scale.data.augment.presets import MultiCropPreset
from hypersolid_scale.data.augment.transforms import build_pil_multicrop, pil_mode
from hypersolid_scale.data.config import JPEG_DECODERS
from hypersolid_scale.data.device.batched_resize import crop_resize_packed, pack_images, window_buckets
from hypersolid_scale.data.device.prefetch import staged
from hypersolid_scale.safety.errors import DataError

_EOI = b"\xff\xd9"  # a JPEG's end-of-image marker


class HostSample(NamedTuple):
    payload: torch.Tensor  # JPEG bytes (1-D uint8), or the decoded image (C, H, W) uint8
    encoded: bool
    params: np.ndarray  # (V, view_params.NUM_PARAMS)


class HostBatch(NamedTuple):
    payloads: list[torch.Tensor]
    encoded: list[bool]
    params: torch.Tensor  # (B, V, NUM_PARAMS) float64, on the CPU


class HostStage:
    """bytes -> `HostSample`; call it inside the per-sample seeding of the PIL path (`seeded_global_rngs`)."""

    def __init__(self, preset: MultiCropPreset, jpeg_decoder: str = "device") -> None:
        if jpeg_decoder not in JPEG_DECODERS:
            raise ValueError(f"jpeg_decoder must be one of {JPEG_DECODERS}, got {jpeg_decoder!r}")
        self.views = vp.view_transforms(build_pil_multicrop(preset))
        self.mode = pil_mode(preset)
        self.read_mode = ImageReadMode.GRAY if preset.channels == 1 else ImageReadMode.RGB
        self.on_device = jpeg_decoder == "device"

    def __call__(self, data: bytes) -> HostSample:
        img = Image.open(io.BytesIO(data))  # reads the header only
        width, height = img.size
        jpeg = img.format == "JPEG" and img.mode == self.mode and data.rstrip(b"\0").endswith(_EOI)
        if jpeg and self.on_device:
            payload, encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8), True
        elif jpeg:
            payload, encoded = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), self.read_mode), False
        else:  # as the PIL path decodes it (a corrupt file raises here as there: WebDataset skips and counts it)
            img.load()
            arr = np.asarray(img.convert(self.mode))
            payload = torch.from_numpy(arr.copy()).reshape(height, width, -1).permute(2, 0, 1).contiguous()
            encoded = False
        return HostSample(payload, encoded, vp.draw_view_params(self.views, height, width))


def collate_host(items: list[tuple[Any, ...]]) -> tuple[Any, ...]:
    """Items (HostSample, label, ...) -> (HostBatch, labels, ...): payloads stay a list (their sizes differ)."""
    columns = list(zip(*items, strict=True))
    samples: tuple[HostSample, ...] = columns[0]
    batch = HostBatch(
        [s.payload for s in samples],
        [s.encoded for s in samples],
        torch.from_numpy(np.stack([s.params for s in samples])),
    )
    return (batch, *(default_collate(list(c)) for c in columns[1:]))


class DeviceStage:
    """`HostBatch` -> the views [global_0, global_1, local_0, ...], normalised, float32 (bfloat16 for a bf16
    step: `prepare`), on `device` (channels-last unless `channels_last=False`; the trainer gives the step the
    model's format either way).

    `cpu_seconds` adds up the CPU time spent here by the calling thread (decode calls, kernel launches; on
    the CPU device, the whole of the device's work), `corrupt` the images replaced after a failed decode.
    """

    def __init__(
        self, preset: MultiCropPreset, device: torch.device | str, *, channels_last: bool = True, prefetch: int = -1
    ) -> None:
        """prefetch: batches the loaders prepare ahead of the step (`prefetch.staged`); -1: 1 on CUDA, where the
        stage overlaps the step on a side stream, 0 on the CPU, where both would share the same cores."""
        self.preset = preset
        self.device = torch.device(device)
        self.prefetch = (1 if self.device.type == "cuda" else 0) if prefetch < 0 else prefetch
        self.photometric = BatchPhotometric(preset, self.device)
        self.read_mode = ImageReadMode.GRAY if preset.channels == 1 else ImageReadMode.RGB
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.dtype = torch.float32  # the views' (`prepare`)
        self.cpu_seconds = 0.0
        self.corrupt = 0
        # nvJPEG's hardware decoder writes its outputs without waiting for the caller's stream, and torchvision
        # takes those outputs from the caller stream's pool: a block freed there while queued kernels still
        # read it (the last batch's boxes, say) gets overwritten early (pytorch/vision#9606; wrong views, or
        # an index out of bounds in `crop_resize`'s gather). The decoder therefore gets a stream of its own,
        # whose pool holds only decoded images, each released only once the caller's kernels reading it ran.
        self.decode_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    def __call__(self, batch: HostBatch) -> list[torch.Tensor]:
        t0 = time.thread_time()
        try:
            return self._views(batch)
        finally:
            self.cpu_seconds += time.thread_time() - t0

    def stage(self, item: tuple[Any, ...]) -> tuple[list[torch.Tensor], int]:
        """For `prefetch.staged`: a loader's item (HostBatch, ...) -> (views, images of it replaced)."""
        before = self.corrupt
        views = self(item[0])
        return views, self.corrupt - before

    def ahead(self, items: Iterator[tuple[Any, ...]]) -> Iterator[tuple[list[torch.Tensor], int, tuple[Any, ...]]]:
        """(views, replaced, item) for the loader's items (HostBatch, ...), `self.prefetch` batches ahead."""
        for (views, replaced), item in staged(items, self.stage, depth=self.prefetch, device=self.device):
            yield views, replaced, item

    def decode(self, batch: HostBatch) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The batch's images (C, H, W) uint8 on the device (JPEGs decoded in one batched call), and the
        view parameters of each row (a failed image's row takes the previous good row's image and draws)."""
        images: list[torch.Tensor | None] = [
            None if enc else p.to(self.device, non_blocking=True) for p, enc in zip(batch.payloads, batch.encoded)
        ]
        todo = [i for i, enc in enumerate(batch.encoded) if enc]
        if todo:
            data = [batch.payloads[i] for i in todo]
            decoded = self._decode_all(data)
            for i, img in zip(todo, decoded):
                images[i] = img
        params = batch.params
        bad = [i for i, im in enumerate(images) if im is None or tuple(im.shape[1:]) != self._size(params[i])]
        if bad:
            good = [i for i in range(len(images)) if i not in bad]
            if not good:
                raise DataError(
                    f"no image of a batch of {len(images)} decoded on {self.device}: the files are damaged; "
                    "re-create them from the source images, or use data.views_on=workers to skip them one by one"
                )
            params = params.clone()
            for i in bad:
                donor = max((g for g in good if g < i), default=good[0])
                images[i], params[i] = images[donor], params[donor]
            self.corrupt += len(bad)
            warnings.warn(
                f"{len(bad)} image(s) of a batch did not decode on {self.device} to their header's size; each is "
                "replaced by another image of the batch (counted in corrupt_skipped)",
                stacklevel=2,
            )
        return [im for im in images if im is not None], params

    def _decode_all(self, data: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """The JPEGs `data` decoded on the device, in one batched call where they all decode, on the decoder's
        own stream (`decode_stream`); the caller's stream waits for it and holds each image until read."""
        caller = torch.cuda.current_stream(self.device) if self.decode_stream is not None else None
        with torch.cuda.stream(self.decode_stream):  # a no-op context for None (the CPU)
            try:
                decoded: list[torch.Tensor | None] = list(decode_jpeg(data, mode=self.read_mode, device=self.device))
            except RuntimeError:  # one bad file fails the batched call: find it
                decoded = [self._decode_one(d) for d in data]
        if caller is not None and self.decode_stream is not None:
            caller.wait_stream(self.decode_stream)
            for img in decoded:
                if img is not None:
                    img.record_stream(caller)
        return decoded

    def _decode_one(self, data: torch.Tensor) -> torch.Tensor | None:
        """One JPEG on the device, else on the CPU (a file nvJPEG does not take is not a corrupt one), else None."""
        for device in dict.fromkeys((self.device, torch.device("cpu"))):
            try:
                return decode_jpeg(data, mode=self.read_mode, device=device).to(self.device, non_blocking=True)
            except RuntimeError:
                continue
        return None

    @staticmethod
    def _size(params: torch.Tensor) -> tuple[int, int]:
        """The image size (H, W) the sample's view parameters were drawn for."""
        return int(params[0, vp.IMAGE_HEIGHT]), int(params[0, vp.IMAGE_WIDTH])

    def _views(self, batch: HostBatch) -> list[torch.Tensor]:
        return self.views_of(*self.decode(batch))

    def prepare(self, batch_size: int, *, bf16: bool = False) -> str:
        """Before training, on the main thread: compile the photometric chain for this loader's views (the
        stage's thread then compiles nothing); with `bf16` (the step runs in bf16), the views come in
        bfloat16, cast once at the end (the step's autocast would cast them to it anyway). Returns which
        chain runs (`BatchPhotometric.chain`)."""
        self.dtype = torch.bfloat16 if bf16 else torch.float32
        return self.photometric.prepare(batch_size, self.preset.view_sizes())

    def send_draws(self, params: torch.Tensor, order: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's draws (B, V, NUM_PARAMS) and each view's rows in window-group order (V, B) on the
        device: every view's boxes, flips, photometric decisions and groups in ONE host->device copy, from
        pinned memory on CUDA (asynchronous). Float32 holds the draws' values and the row numbers exactly."""
        b, v, n = params.shape
        host = torch.cat([params.to(torch.float32).flatten(), torch.from_numpy(order).to(torch.float32).flatten()])
        if self.device.type == "cuda":
            host = host.pin_memory()
        sent = host.to(self.device, non_blocking=True)
        return sent[: b * v * n].view(b, v, n), sent[b * v * n :].view(v, b).long()

    def views_of(
        self, images: list[torch.Tensor], params: torch.Tensor, mark: Callable[[str], None] | None = None
    ) -> list[torch.Tensor]:
        """The views of a batch's decoded images (C, H_i, W_i) on the device and its draws (B, V, NUM_PARAMS)
        on the CPU: per view, at most a fixed number of calls whatever the batch, nothing read back.

        The crops of a view are grouped by box size (`window_buckets`, from the host's draws), each group read
        over its own window of the packed images (`crop_resize_packed`): an image costs its own pixels and
        crops, whatever the other images' sizes. `mark(phase)`, if given, is called as each phase ends
        (benchmarks/stage_alone.py times them)."""
        mark = mark or (lambda phase: None)
        host = params.numpy()
        sizes = self.preset.view_sizes()
        groups = [window_buckets(host[:, v, vp.HEIGHT], host[:, v, vp.WIDTH], size) for v, size in enumerate(sizes)]
        draws, order = self.send_draws(params, np.stack([np.concatenate([g[0] for g in gs]) for gs in groups]))
        packed = pack_images(images)
        image_sizes = draws[:, 0, vp.IMAGE_HEIGHT : vp.IMAGE_WIDTH + 1].long()  # (B, 2)
        areas = image_sizes[:, 0] * image_sizes[:, 1]
        starts = torch.cumsum(areas, 0) - areas  # where each row's image starts in `packed`
        mark("draws and packing")
        out = []
        for v, size in enumerate(sizes):
            p = draws[:, v]
            boxes, flips = p[:, vp.TOP : vp.WIDTH + 1], p[:, vp.FLIP] > 0  # top, left, height, width
            if len(groups[v]) == 1:  # one window for the whole view: the rows as they are
                x = crop_resize_packed(packed, starts, image_sizes, boxes, flips, size, groups[v][0][1:])
            else:
                parts, first = [], 0
                for rows, wh, ww in groups[v]:
                    idx = order[v, first : first + len(rows)]  # this group's rows, on the device
                    first += len(rows)
                    parts.append(
                        crop_resize_packed(
                            packed, starts[idx], image_sizes[idx], boxes[idx], flips[idx], size, (wh, ww)
                        )
                    )
                grouped = torch.cat(parts)
                x = torch.empty_like(grouped).index_copy_(0, order[v], grouped)  # back in the batch's order
            mark("crops")
            x = self.photometric.apply(x.div_(255.0), _decisions(p))
            mark("photometric")
            out.append(x.to(self.dtype, memory_format=self.memory_format))  # one copy, or none
            mark("cast")
        return out


def _decisions(p: torch.Tensor) -> Decisions:
    """The photometric decisions of one view's (B, NUM_PARAMS) rows, on the rows' device."""
    on = lambda col: p[:, col] > 0  # noqa: E731
    return Decisions(
        jitter=on(vp.JITTER),
        factors=p[:, vp.FACTORS : vp.FACTORS + 4],
        order=p[:, vp.ORDER : vp.ORDER + 4].long(),
        gray=on(vp.GRAY),
        blur=on(vp.BLUR),
        sigma=p[:, vp.SIGMA],
        solarize=on(vp.SOLARIZE),
    )


def device_stages(preset: MultiCropPreset, jpeg_decoder: str, device: torch.device) -> tuple[HostStage, DeviceStage]:
    """data.views_on=device's two halves, as every format that offers it wires them: the workers' `HostStage`
    (bytes -> draws, the loader's per-sample transform) and this process's `DeviceStage` (decode and augment)."""
    return HostStage(preset, jpeg_decoder), DeviceStage(preset, device)
