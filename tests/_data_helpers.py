"""Helpers of the data tests: real Fashion-MNIST images, shards on disk, probe images, statistics, a
recorder of what each stage of lightly's DINOTransform did, a cap on a loader's batches per epoch."""

from __future__ import annotations

import io
import math
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightly.transforms.dino_transform import DINOTransform
from PIL import Image

from hypersolid_scale.data.augment.transforms import build_pil_multicrop
from hypersolid_scale.data.loading.builtin_sets import fashion_mnist_dir, load_fashion_mnist
from hypersolid_scale.data.formats.webdataset.shard_writer import ShardWriter


def fashion_mnist_or_skip(split: str = "train"):
    try:
        fashion_mnist_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    return load_fashion_mnist(split)


def png_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


def jpg_bytes(arr: np.ndarray, quality: int = 90) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).convert("RGB").save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def write_shard(path: Path, samples: list[tuple[str, str, bytes, int]]) -> None:
    """samples: (key, image ext, image bytes, label), written by the converter's shard writer."""
    with ShardWriter(path) as writer:
        for key, ext, data, label in samples:
            writer.add(key, {ext: data, "cls": str(label).encode()})


def limit_batches(loader: Any, n: int) -> Any:
    """Cap a training loader's batches per epoch at `n` (every rank alike), to keep a test short."""
    assert n >= 1
    loader._len = min(loader._len, n)
    return loader


def probe_images(n: int, size: int, seed: int = 0) -> np.ndarray:
    """(n, size, size, 3) uint8 images whose content reveals the crop and the flip.

    R is a left-to-right ramp and G a top-to-bottom ramp, so the slope of R across a view gives the
    crop width (its sign gives the flip) and the slope of G the crop height; B is noise, so that blur,
    grayscale, jitter and solarization always change the image.
    """
    rng = np.random.default_rng(seed)
    ramp = np.round(255 * (np.arange(size) + 0.5) / size).astype(np.uint8)
    img = np.empty((n, size, size, 3), np.uint8)
    img[..., 0] = ramp[None, None, :]
    img[..., 1] = ramp[None, :, None]
    img[..., 2] = rng.integers(0, 256, (n, size, size), dtype=np.uint8)
    return img


def crop_geometry(view: np.ndarray, source_size: int) -> tuple[float, bool]:
    """(area fraction, flipped) of a (s, s, 3) or (3, s, s) uint8 view of a `probe_images` image."""
    v = view if view.shape[-1] == 3 else np.transpose(view, (1, 2, 0))
    s = v.shape[0]
    inner = slice(2, s - 2) if s >= 12 else slice(0, s)  # resamplers clamp at the borders
    cols = v[:, :, 0].astype(np.float64).mean(axis=0)[inner]
    rows = v[:, :, 1].astype(np.float64).mean(axis=1)[inner]
    j = np.arange(s, dtype=np.float64)[inner]
    slope_x = np.polyfit(j, cols, 1)[0]
    slope_y = np.polyfit(j, rows, 1)[0]
    # R = 255 * x / W and x advances w / s per output pixel: slope = 255 * w / (s * W).
    wf = abs(slope_x) * s / 255.0
    hf = abs(slope_y) * s / 255.0
    return min(wf, 1.0) * min(hf, 1.0), bool(slope_x < 0)


def assert_rate(name: str, observed: np.ndarray, p: float, sigmas: float = 4.5) -> None:
    """A Bernoulli rate within `sigmas` binomial standard deviations of p (exact when p is 0 or 1)."""
    n = len(observed)
    rate = float(np.mean(observed))
    tol = sigmas * math.sqrt(max(p * (1 - p), 1e-12) / n) + (1e-9 if p in (0.0, 1.0) else 0.0)
    assert abs(rate - p) <= tol, f"{name}: rate {rate:.3f} over {n} draws, expected {p} +- {tol:.3f}"


def assert_same_rate(name: str, a: np.ndarray, b: np.ndarray, sigmas: float = 4.5) -> None:
    pa, pb = float(np.mean(a)), float(np.mean(b))
    p = (pa * len(a) + pb * len(b)) / (len(a) + len(b))
    tol = sigmas * math.sqrt(max(p * (1 - p), 1e-12) * (1 / len(a) + 1 / len(b))) + 1e-9
    assert abs(pa - pb) <= tol, f"{name}: {pa:.3f} (n={len(a)}) vs {pb:.3f} (n={len(b)}), tolerance {tol:.3f}"


def assert_same_mean(name: str, a: np.ndarray, b: np.ndarray, sigmas: float = 4.5) -> None:
    tol = sigmas * math.sqrt(np.var(a) / len(a) + np.var(b) / len(b)) + 1e-3
    assert abs(np.mean(a) - np.mean(b)) <= tol, \
        f"{name}: mean {np.mean(a):.4f} vs {np.mean(b):.4f}, tolerance {tol:.4f}"


def pil_records(preset, images: np.ndarray) -> list[dict]:
    """Run lightly's DINOTransform (instrumented, unchanged) over `images`; one record per view."""
    sink: list[dict] = []
    transform = instrument(build_pil_multicrop(preset), sink)
    for a in images:
        transform(Image.fromarray(a))
    for r in sink:
        r["area"], r["flipped"] = crop_geometry(r.pop("flip_image"), images.shape[1])
        # The probe images reveal the flip: what the content shows is what the stage drew.
        assert r["flipped"] == r["flip"]
        for key in ("jitter", "gray", "blur", "solarize"):
            assert r[key] or not r[key + "_changed"], f"{key} changed the image without being drawn"
    return sink


def assert_pil_statistics_match(records: list[dict], other: dict[str, dict[str, np.ndarray]], preset) -> None:
    """Compare the PIL path's per-view-type rates/areas with another path's, and with the preset."""
    probs = {"global_0": (preset.blur_probs[0], 0.0), "global_1": (preset.blur_probs[1], preset.solarize_prob),
             "local": (preset.blur_probs[2], 0.0)}
    for view, (blur_p, sol_p) in probs.items():
        mine = [r for r in records if r["view"] == view]
        pil = {k: np.array([r[k] for r in mine]) for k in ("area", "flipped", "jitter", "gray", "blur", "solarize")}
        for key, p in (("flipped", preset.hflip_prob), ("jitter", preset.cj_prob), ("gray", preset.gray_prob),
                       ("blur", blur_p), ("solarize", sol_p)):
            assert_rate(f"PIL {view} {key}", pil[key], p)
            assert_rate(f"other {view} {key}", other[view][key], p)
            assert_same_rate(f"{view} {key}", pil[key], other[view][key])
        assert_same_mean(f"{view} crop area", pil["area"], other[view]["area"])
        lo, hi = preset.global_crop_scale if view != "local" else preset.local_crop_scale
        assert lo - 0.03 <= pil["area"].mean() <= hi


def convert_shards(out: Path, splits: dict[str, int], shard_size: int) -> dict:
    """Real Fashion-MNIST images written by the product's converter (shards + manifest.json) under `out`.

    splits: {split: number of samples}. The label of a sample is its index in the split (so tests can
    tell which samples came through); num_classes = the largest split's size.
    """
    from hypersolid_scale.data.convert.converter import Converter
    from hypersolid_scale.data.convert.sources import Item

    images = fashion_mnist_or_skip().images
    n_max = max(splits.values())
    items = {split: [Item(f"{split}_{i:05d}", i, (lambda a=images[i]: Image.fromarray(a))) for i in range(n)]
             for split, n in splits.items()}
    conv = Converter(str(out), formats=["webdataset"], shard_size=shard_size, image_format="png", quality=90,
                     mode="keep", resize=None, resume=False, ffcv_mode="raw")
    assert not conv.check_output()
    return conv.run([str(i) for i in range(n_max)], items, "test")


def member_offsets(path: Path) -> list[tuple[str, int, int, int]]:
    """(name, header offset, data offset, size) of every member of a tar file, in order."""
    with tarfile.open(path) as tar:
        return [(m.name, m.offset, m.offset_data, m.size) for m in tar.getmembers()]


def _first_member_of_sample(path: Path, k: int) -> tuple[int, int, int]:
    """(header offset, data offset, size) of the first member of a shard's k-th sample."""
    keys: list[str] = []
    for name, header, data, size in member_offsets(path):
        key = name.split(".")[0]
        if key not in keys:
            keys.append(key)
            if len(keys) == k + 1:
                return header, data, size
    raise ValueError(f"{path} has fewer than {k + 1} samples")


def truncate_before_sample(path: Path, k: int) -> None:
    """Cut a shard at the header of its k-th sample's first member: samples 0..k-1 stay whole."""
    header, _, _ = _first_member_of_sample(path, k)
    path.write_bytes(path.read_bytes()[:header])


def truncate_inside_sample(path: Path, k: int) -> None:
    """Cut a shard in the middle of the data of its k-th sample's first member."""
    _, data, size = _first_member_of_sample(path, k)
    path.write_bytes(path.read_bytes()[:data + size // 2])


# ------------------------------------------------------------------ what lightly's stages did -------
class _Stage:
    """Runs one stage of a view transform and records what it drew and whether it changed the image.

    The stage's own first random draw (torch.rand(1) for torchvision's random transforms,
    np.random.random_sample() for lightly's blur/solarization) is peeked by saving and restoring the
    generator state, so the recorded decision is exactly the one the stage then makes.
    """

    def __init__(self, inner: Any, key: str, sink: list[dict], view: str | None, keep: bool) -> None:
        self.inner, self.key, self.sink, self.view, self.keep = inner, key, sink, view, keep

    def _applied(self) -> bool | None:
        if self.key in ("blur", "solarize"):
            state = np.random.get_state()
            u = float(np.random.random_sample())
            np.random.set_state(state)
            return u < self.inner.prob
        if self.key in ("flip", "jitter", "gray"):
            state = torch.get_rng_state()
            u = float(torch.rand(1))
            torch.set_rng_state(state)
            return u < self.inner.p if self.key != "jitter" else not self.inner.p < u
        return None

    def __call__(self, img: Any) -> Any:
        applied = self._applied()
        out = self.inner(img)
        if self.view is not None:  # first stage of a view: open a new record
            self.sink.append({"view": self.view})
        changed = np.asarray(out).shape != np.asarray(img).shape or not np.array_equal(
            np.asarray(out), np.asarray(img))
        self.sink[-1][self.key] = applied
        self.sink[-1][self.key + "_changed"] = bool(changed)
        if self.keep:
            self.sink[-1][self.key + "_image"] = np.asarray(out).copy()
        return out


def instrument(transform: DINOTransform, sink: list[dict]) -> DINOTransform:
    """Wrap crop/flip/jitter/grayscale/blur/solarize of every view so that each call appends a record.

    Each record: {"view": "global_0"|"global_1"|"local"; "flip", "jitter", "gray", "blur", "solarize":
    bool applied; "<stage>_changed": bool, the output differs from the input; "flip_image": the view
    after crop+flip (uint8 array)}. The wrapped stages run unchanged.
    """
    names = ["global_0", "global_1"] + ["local"] * (len(transform.transforms) - 2)
    seen: set[int] = set()
    for view_transform, name in zip(transform.transforms, names):
        if id(view_transform) in seen:  # lightly shares one object between all local views
            continue
        seen.add(id(view_transform))
        stages = view_transform.transform.transforms
        # By class name: lightly picks torchvision's v1 or v2 transforms depending on the version.
        keys = {"RandomResizedCrop": "crop", "RandomHorizontalFlip": "flip", "RandomApply": "jitter",
                "RandomGrayscale": "gray", "GaussianBlur": "blur", "RandomSolarization": "solarize"}
        for i, stage in enumerate(stages):
            key = keys.get(type(stage).__name__)
            if key is not None:
                stages[i] = _Stage(stage, key, sink, name if key == "crop" else None, keep=key == "flip")
    return transform

