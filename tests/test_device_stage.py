"""The batched device stage (docs/design.md §3e): every crop of a view in one resize, the photometric chain
as per-sample `where`, a number of calls that does not grow with the batch, no host synchronisation (CUDA),
and the stage run ahead of the step (data/device/prefetch.py). Held to the plain per-crop / masked references."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from test_device_decode import EPOCH, SEED, SMALL, photos

from benchmarks.aug_reference import crop_resize_one, masked_photometric
from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.augment import view_params as vp
from hypersolid_scale.data.augment.tensor_aug import TensorMultiCrop, keyed_uniforms
from hypersolid_scale.data.augment.transforms import seeded_global_rngs
from hypersolid_scale.data.device.batched_resize import crop_resize, pack_images, pad_images, window_buckets
from hypersolid_scale.data.device.prefetch import staged
from hypersolid_scale.data.device.views import DeviceStage, HostBatch, HostStage, _decisions, collate_host


def host_batch(preset: Any, data: list[bytes]) -> HostBatch:
    host = HostStage(preset)
    items = []
    for i, d in enumerate(data):
        with seeded_global_rngs(SEED, EPOCH, i):
            items.append((host(d), i))
    return collate_host(items)[0]


@pytest.fixture(scope="module")
def decoded() -> tuple[Any, list[torch.Tensor], torch.Tensor]:
    stage = DeviceStage(PRESETS["default"], "cpu")
    images, params = stage.decode(host_batch(PRESETS["default"], photos(16, seed=11)))
    return stage, images, params


def test_the_batched_resize_is_the_per_crop_8bit_kernel(decoded: Any) -> None:
    """Against torch's 8-bit antialiased bicubic kernel (PIL's algorithm), one call per crop: whole levels,
    differing on rounding ties only (measured: 0.2-0.4 % of pixels, by one or two levels)."""
    _, images, params = decoded
    padded = pad_images(images)
    for v, size in enumerate(PRESETS["default"].view_sizes()):
        p = params[:, v].float()
        window = (int(p[:, vp.HEIGHT].max()), int(p[:, vp.WIDTH].max()))
        got = crop_resize(padded, p[:, : vp.WIDTH + 1], p[:, vp.FLIP] > 0, size, window)
        ref = torch.stack([crop_resize_one(im, row, size) for im, row in zip(images, params[:, v].tolist())])
        diff = (got - ref).abs()
        assert torch.equal(got, got.round()) and float(diff.max()) <= 2 and float((diff > 0).float().mean()) < 0.01
        # A wrong draw fails: the box one pixel to the right, or the mirror image.
        moved = p.clone()
        moved[:, vp.LEFT] = (moved[:, vp.LEFT] + 1).clamp(max=(moved[:, vp.IMAGE_WIDTH] - moved[:, vp.WIDTH]))
        shifted = crop_resize(padded, moved[:, : vp.WIDTH + 1], p[:, vp.FLIP] > 0, size, window)
        mirrored = crop_resize(padded, p[:, : vp.WIDTH + 1], p[:, vp.FLIP] <= 0, size, window)
        assert float((shifted - ref).abs().mean()) > 20 * float(diff.mean()) + 0.1
        assert float((mirrored - ref).abs().mean()) > 100 * float(diff.mean()) + 1


def test_upscaled_and_unscaled_boxes() -> None:
    """A box smaller than the view (upsampling: the filter is not widened) and one of the view's size
    (identity), against the per-crop kernel."""
    img = torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    for box, size in (((3, 5, 10, 12), 32), ((4, 6, 16, 16), 16), ((0, 0, 40, 50), 16)):
        row = [0.0] * vp.NUM_PARAMS
        row[vp.TOP], row[vp.LEFT], row[vp.HEIGHT], row[vp.WIDTH] = box
        got = crop_resize(img[None], torch.tensor([box], dtype=torch.float32), torch.tensor([False]), size, box[2:])
        ref = crop_resize_one(img, row, size)
        assert float((got[0] - ref).abs().max()) <= 1
    box = (4, 6, 16, 16)
    same = crop_resize(img[None], torch.tensor([box], dtype=torch.float32), torch.tensor([False]), 16, (16, 16))
    assert torch.equal(same[0], img[:, 4:20, 6:22].float())


@pytest.mark.parametrize("preset", [SMALL, PRESETS["default"]], ids=lambda p: p.name)
def test_the_photometric_chain_equals_the_masked_reference(preset: Any) -> None:
    """Per-sample `where` over the whole batch gives what the masked subsets gave, within float rounding: the
    contrast's per-image mean summed over a batch or a subset, and the hue rotation (color.hue_shift against
    kornia's; measured: at most 1.1e-6 of the normalised views, under 1e-3 of a level). A decision taken on the
    wrong sample is a whole jitter away."""
    stage = DeviceStage(preset, "cpu")
    images, params = stage.decode(host_batch(preset, photos(12, seed=12)))
    padded = pad_images(images)
    for v, size in enumerate(preset.view_sizes()):
        p = params[:, v].float()
        x = crop_resize(padded, p[:, : vp.WIDTH + 1], p[:, vp.FLIP] > 0, size, (size * 8, size * 8)).div_(255)
        d = _decisions(p)
        got, ref = stage.photometric.apply(x, d), masked_photometric(stage.photometric, x, d)
        assert float((got - ref).abs().max()) <= 1e-5
        d.jitter = d.jitter.roll(1)  # a wrong decision
        assert float((stage.photometric.apply(x, d) - ref).abs().max()) > 0.05


def test_tensor_multicrop_equals_the_masked_reference() -> None:
    """The in-memory path (keyed draws on the device) too, one channel and three."""
    for preset, channels in ((PRESETS["fashion_mnist"], 1), (SMALL, 3)):
        aug = TensorMultiCrop(preset, "cpu", seed=3)
        images = torch.randint(0, 256, (16, channels, 40, 40), dtype=torch.uint8)
        idx = torch.arange(16)
        views = aug(images, idx, epoch=2)
        raw = aug.photometric.view  # the photometric step of each view, compared on the cropped views
        for i, view in enumerate(views):
            u = keyed_uniforms(3, 2, idx, i)
            d = aug.photometric.decisions(u, i)
            # undo normalisation to get the cropped view back, then rerun both chains on it
            crops = view * aug.photometric.std + aug.photometric.mean
            assert float((raw(crops, i, u) - masked_photometric(aug.photometric, crops, d)).abs().max()) <= 1e-5


def test_hue_shift_is_kornias_hsv_rotation() -> None:
    """color.hue_shift against kornia's adjust_hue on random colours, gray pixels and ties included."""
    import kornia

    from hypersolid_scale.data.augment.color import hue_shift

    x = torch.rand(6, 3, 17, 19)
    x[:, :, 0] = x[:, :1, 0]  # gray pixels: no hue
    x[:, 1, 1] = x[:, 0, 1]  # red and green tie for the largest channel
    shift = torch.tensor([-0.5, -0.2, 0.0, 0.1, 0.37, 0.5])
    ref = kornia.enhance.adjust_hue(x, shift * 2 * torch.pi)
    assert float((hue_shift(x, shift) - ref).abs().max()) < 1e-5
    assert float((hue_shift(x, shift.roll(1)) - ref).abs().max()) > 0.1


@pytest.mark.parametrize("shape", [(6, 3, 32, 32), (4, 1, 20, 27), (3, 3, 7, 5)], ids=str)
def test_the_blur_is_kornias_grouped_convolution(shape: tuple[int, ...]) -> None:
    """data/augment/blur.py's two matrix products against kornia's per-sample blur (what they replaced), on values and
    gradients: square and oblong images, one channel, a kernel cut to the image (7 x 5). Measured: 2e-7.
    A sigma given to the wrong sample is far off."""
    from benchmarks.aug_reference import kornia_blur
    from hypersolid_scale.data.augment.blur import gaussian_blur, kernel_size

    x = torch.rand(shape, requires_grad=True)
    sigma = torch.linspace(0.1, 2.0, shape[0])
    got = gaussian_blur(x, sigma, kernel_size(shape[2], shape[3], 2.0))
    ref = kornia_blur(x, sigma, 2.0)
    assert float((got - ref).detach().abs().max()) <= 1e-6
    weights = torch.rand(shape)
    (grad,) = torch.autograd.grad((got * weights).sum(), x)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), x)
    assert float((grad - ref_grad).abs().max()) <= 1e-5
    wrong = gaussian_blur(x, sigma.flip(0), kernel_size(shape[2], shape[3], 2.0))
    assert float((wrong - ref).detach().abs().max()) > 0.01


def _ops(fn: Any) -> int:
    """Operator calls made by `fn()` (top-level: what the Python code asks of torch)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def test_operator_calls_do_not_grow_with_the_batch() -> None:
    """The views of a decoded batch: at most a fixed number of calls per view and window group (a step whose
    rows are all empty is skipped; at most NUM_BUCKETS groups), the same at 32 and 64 images with the same
    groups; the packing of the decoded images costs a call per image (a reshape), and nothing else grows.
    The compiled chain's graph: the same at any batch."""
    stage = DeviceStage(SMALL, "cpu")
    counts = {}
    for n in (4, 32, 64):
        images, params = stage.decode(host_batch(SMALL, photos(n, seed=13)))
        packing = _ops(lambda images=images: pack_images(images))
        views = _ops(lambda images=images, params=params: stage.views_of(images, params))
        host = params.numpy()
        sizes = SMALL.view_sizes()
        groups = [len(window_buckets(host[:, v, vp.HEIGHT], host[:, v, vp.WIDTH], s)) for v, s in enumerate(sizes)]
        counts[n] = (views - packing, packing, groups)
    assert counts[32][2] == counts[64][2] and max(counts[64][2]) > 1, counts  # these photos: the same groups
    assert counts[4][0] <= counts[32][0] == counts[64][0], counts
    grown = counts[64][1] - counts[32][1]
    assert 32 <= grown <= 32 * 2, counts
    aug = TensorMultiCrop(PRESETS["fashion_mnist"], "cpu")
    calls = [_ops(lambda n=n: aug(torch.zeros(n, 1, 28, 28, dtype=torch.uint8), torch.arange(n), 0)) for n in (32, 64)]
    assert calls[0] == calls[1], calls
    inputs = {n: (torch.rand(n, 3, 16, 16), _chain_args(n)) for n in (4, 64)}
    where = [_ops(lambda x=x, a=a: stage.photometric._chain(x, *a)) for x, a in inputs.values()]
    assert where[0] == where[1], where


def _chain_args(n: int) -> list[torch.Tensor]:
    """Inputs of the `where` chain for n rows: every step taken by some rows."""
    on = torch.arange(n) % 2 == 0
    order = torch.stack([torch.randperm(4) for _ in range(n)])
    return [torch.full((n,), 1.0), on, ~on, on, ~on, torch.rand(n, 4) * 0.2 + 0.9, order]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_device_stage_never_synchronises_with_the_host() -> None:
    """torch's sync debug mode raises on any host synchronisation in the stage, turned on BEFORE its first
    decode: the batched nvJPEG decode, the packing, the crops and the compiled chain (compiled first by
    `prepare`, as the trainer does before training), then the eager chain (the `where` chain uncompiled, as a
    compiler failure leaves it). A whole training step: tests/test_hot_path.py."""
    preset = PRESETS["default"]
    stage = DeviceStage(preset, "cuda")
    batch = host_batch(preset, photos(16, seed=14))
    assert stage.prepare(16) == "compiled"
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        images, params = stage.decode(batch)  # the stage's first decode
        views = stage.views_of(images, params)
        stage.photometric._compiled = None
        eager = stage.views_of(images, params)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [v.shape[-1] for v in views] == preset.view_sizes()
    assert stage.photometric.chain == "compiled"  # the compiled chain ran, no fall-back
    for a, b in zip(views, eager):
        assert float((a - b).abs().max()) <= 1e-4


def test_the_eager_chain_makes_no_tensor_from_host_data_even_on_its_first_batch(monkeypatch) -> None:
    """``torch.tensor(..., device=cuda)`` waits for the device (a host synchronisation per call; the CUDA test
    above sees it): the device stage's calls make no tensor from Python data, from its first batch on (its
    colour constants are filled on the device: color.channel_constant, here with an empty cache)."""
    import sys

    from hypersolid_scale.data.augment import color

    preset = PRESETS["default"]
    stage = DeviceStage(preset, "cpu")
    assert stage.photometric._compiled is None  # the eager chain (the CPU's: row subsets by host indices)
    images, params = stage.decode(host_batch(preset, photos(8, seed=16)))
    monkeypatch.setattr(color, "_CONSTANTS", {})
    made: list[str] = []
    original = torch.tensor

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        where = sys._getframe(1).f_code.co_filename
        if "hypersolid_scale" in where:
            made.append(f"{Path(where).name}:{sys._getframe(1).f_lineno}")
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counting)
    for _ in range(2):
        stage.views_of(images, params)
    assert made == [], made
    assert color._CONSTANTS, "the chain made no colour constant: this test no longer covers one"
    for (values, _, dtype), t in color._CONSTANTS.items():  # what torch.tensor would have made, bit for bit
        assert torch.equal(t, original(values, dtype=dtype).view(1, -1, 1, 1)), values


def decoder_overwrites(stage: DeviceStage, batch: HostBatch, rounds: int = 20) -> int:
    """How many reductions queued on the caller's stream read memory the decoder overwrote first
    (pytorch/vision#9606): per round, tensors the size of the decoded images are filled, reductions over
    them are queued behind a long kernel, the tensors are freed, and the batch is decoded."""
    sizes = [im.numel() for im in stage.decode(batch)[0]]
    wrong = 0
    with torch.cuda.stream(torch.cuda.Stream()):  # a stage runs on a side stream (prefetch.staged)
        for _ in range(rounds):
            xs = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in sizes]
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)  # some 30 ms of GPU time queued before the reductions
            sums = [x.sum(dtype=torch.int64) for x in xs]
            del xs  # their blocks are free for the next allocation on this stream, in stream order
            stage.decode(batch)
            torch.cuda.synchronize()
            wrong += sum(int(s) != n for s, n in zip(sums, sizes))
    return wrong


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_decoder_never_overwrites_memory_the_stages_stream_still_reads() -> None:
    """nvJPEG's hardware decoder writes without waiting for the caller's stream: the stage decodes on a stream
    of its own (`DeviceStage.decode_stream`), so every reduction queued before a decode sees its own data."""
    preset = PRESETS["default"]
    stage = DeviceStage(preset, "cuda")
    assert decoder_overwrites(stage, host_batch(preset, photos(16, seed=15))) == 0


# ------------------------------------------------------------------- prefetch ------------------------
def _stage(item: int) -> tuple[list[torch.Tensor], int]:
    return [torch.full((2,), float(item))], item * 10


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_staged_gives_every_item_in_order(depth: int) -> None:
    got = [(views[0].tolist(), extra, item) for (views, extra), item in staged(iter(range(7)), _stage, depth=depth,
                                                                              device=torch.device("cpu"))]
    assert got == [([float(i)] * 2, i * 10, i) for i in range(7)]


def test_staged_raises_where_the_source_failed_and_stops_its_thread() -> None:
    def source() -> Iterator[int]:
        yield 0
        yield 1
        raise ValueError("shard 2 is damaged")

    seen = []
    with pytest.raises(ValueError, match="shard 2 is damaged"):
        for _, item in staged(source(), _stage, depth=2, device=torch.device("cpu")):
            seen.append(item)
    assert seen == [0, 1]
    assert not [t for t in threading.enumerate() if t.name == "device-stage"]


def test_leaving_early_closes_the_source_and_the_thread() -> None:
    closed = []

    def source() -> Iterator[int]:
        try:
            yield from range(100)
        finally:
            closed.append(True)

    gen = staged(source(), _stage, depth=2, device=torch.device("cpu"))
    assert next(gen)[1] == 0
    gen.close()
    assert closed == [True]
    assert not [t for t in threading.enumerate() if t.name == "device-stage"]


def test_prefetched_loader_batches_equal_inline_ones(tmp_path: Path) -> None:
    """An image folder through the device stage, prepared 2 batches ahead in the thread and inline."""
    from hypersolid_scale.data import DataConfig, build_train_loader

    for i, data in enumerate(photos(16, seed=15)):
        (tmp_path / f"c{i % 2}").mkdir(exist_ok=True)
        (tmp_path / f"c{i % 2}" / f"{i:02d}.jpg").write_bytes(data)
    cfg = DataConfig(format="imagefolder", path=str(tmp_path), views_on="device", global_batch_size=4, num_workers=0,
                     num_local_views=2, global_crop_size=32, local_crop_size=16, num_classes=2)
    runs = []
    for depth in (0, 2):
        loader = build_train_loader(cfg, rank=0, world_size=1, seed=SEED, device=torch.device("cpu"))
        loader.device_stage.prefetch = depth
        runs.append(list(loader))
    assert len(runs[0]) == len(runs[1]) == 4
    for (va, la), (vb, lb) in zip(*runs):
        assert torch.equal(la, lb) and all(torch.equal(a, b) for a, b in zip(va, vb))


def test_views_are_channels_last_unless_asked_otherwise() -> None:
    batch = host_batch(SMALL, photos(4, seed=16))
    for channels_last, fmt in ((True, torch.channels_last), (False, torch.contiguous_format)):
        views = DeviceStage(SMALL, "cpu", channels_last=channels_last)(batch)
        assert len(views) == SMALL.num_views and all(v.is_contiguous(memory_format=fmt) for v in views)


def test_the_chain_compiles_as_one_graph_and_gives_the_eager_views() -> None:
    """What CUDA runs by default (torch.compile of the chain): one graph, no break (fullgraph), the eager values.
    Traced here with the aot_eager backend: the graph is what inductor would compile, without a C++ build."""
    preset = SMALL
    stage = DeviceStage(preset, "cpu")
    images, params = stage.decode(host_batch(preset, photos(8, seed=17)))
    eager = stage.views_of(images, params)
    aug = stage.photometric
    aug._compiled = torch.compile(aug._chain, fullgraph=True, dynamic=False, backend="aot_eager")
    compiled = stage.views_of(images, params)
    assert aug._compiled is not None  # no fall-back to the eager chain
    for a, b in zip(eager, compiled):
        assert float((a - b).abs().max()) <= 1e-5
