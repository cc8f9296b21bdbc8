"""A photo benchmark set: ImageNet-sized JPEGs cut from real photographs that installed packages ship.

    python -m benchmarks.photo_set --out /tmp/photos [--images 5500] [--sources-npz FILE.npz]

Sources: scikit-learn's two sample photographs (china, flower) and scikit-image's bundled colour photographs
(astronaut, chelsea, coffee, rocket, motorcycle, ...; the files inside the wheel, nothing downloaded). Each
output image is a random crop of one source with an ImageNet-like aspect (4:3, 3:2, 5:4, either way up),
rescaled so that its short side is in [375, 500] px, maybe mirrored, colour-shifted (hue, saturation,
brightness) and JPEG-encoded at a random quality in [85, 95]. Everything is drawn from (--seed, image index),
so the same sources give the same bytes on any machine and any worker count.

--sources-npz: loads the sources from that file when it exists, else collects them from the packages and
saves them there (the files' own PNG/JPEG bytes, a few MB), so a machine without scikit-image rebuilds the
exact same set. The set is written with the project's converter (webdataset shards, an image folder and an
FFCV .beton where ffcv imports); the JPEG bytes go into shards and folder as encoded here, never re-encoded,
so the mean file size is the set's own. OUT/photo_set.json records the count, file sizes, short sides and
qualities.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Callable
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from benchmarks import common
from hypersolid_scale.data.convert.converter import Converter
from hypersolid_scale.data.convert.sources import Item
from hypersolid_scale.safety import atomic

IMAGENET_MEAN_KB = 110.0  # ImageNet-1k train: ~140 GB / 1.28 M JPEGs
SHORT_SIDE = (375, 500)
QUALITY = (85, 95)
ASPECTS = (4 / 3, 3 / 2, 5 / 4)
# scikit-image's bundled colour photographs (grey, texture, microscopy and synthetic images left out).
SKIMAGE_PHOTOS = (
    "astronaut.png",
    "chelsea.png",
    "coffee.png",
    "rocket.jpg",
    "motorcycle_left.png",
    "motorcycle_right.png",
    "hubble_deep_field.jpg",
    "retina.jpg",
)


def collect_sources() -> dict[str, bytes]:
    """name -> the photograph's file bytes, from the installed packages (scikit-image only where it imports)."""
    import sklearn.datasets

    out = {}
    sk_dir = Path(sklearn.datasets.__file__).parent / "images"
    for name in ("china.jpg", "flower.jpg"):
        out[f"sklearn_{name}"] = (sk_dir / name).read_bytes()
    try:
        import skimage.data
    except ImportError:
        print("scikit-image does not import: the set is cut from scikit-learn's 2 photographs only", file=sys.stderr)
        return out
    data_dir = Path(skimage.data.__file__).parent
    for name in SKIMAGE_PHOTOS:
        if (data_dir / name).is_file():  # bundled in the wheel; the others would need a download
            out[f"skimage_{name}"] = (data_dir / name).read_bytes()
    return out


def load_sources(npz: str | None) -> dict[str, bytes]:
    """The sources from `npz` when it exists; else from the packages, then saved to `npz` (when named)."""
    if npz and Path(npz).is_file():
        with np.load(npz) as z:
            return {k: z[k].tobytes() for k in sorted(z.files)}
    sources = collect_sources()
    if npz:
        Path(npz).parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {k: np.frombuffer(v, dtype=np.uint8) for k, v in sources.items()}
        np.savez(npz, **arrays)
    return sources


_SOURCES: list[np.ndarray] = []  # decoded once per pool worker (initializer), RGB uint8
# Unit Gaussian grain, made once per worker from a fixed seed; each image adds a window of it at its own offset.
_GRAIN = np.zeros((0, 0, 3), dtype=np.float32)
GRAIN_SIGMA = (4.0, 10.0)  # grey levels: brings the mean file size near ImageNet's (see make_image)


def _init(blobs: list[bytes]) -> None:
    global _SOURCES, _GRAIN
    _SOURCES = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]
    _GRAIN = np.random.default_rng(12345).standard_normal((1024, 1024, 3), dtype=np.float32)


def colour_matrix(hue: float, saturation: float, brightness: float) -> tuple[float, ...]:
    """PIL's RGB -> RGB matrix for a hue rotation by `hue` radians about the grey axis, a saturation and a
    brightness factor: one linear map (PIL applies it in C), ~20x faster than an HSV round trip."""
    grey = np.full((3, 3), 1 / 3)
    c, s = np.cos(hue), np.sin(hue)
    # Rodrigues' rotation about the unit grey vector (1, 1, 1) / sqrt(3).
    k = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]]) / np.sqrt(3)
    rot = c * np.eye(3) + s * k + (1 - c) * grey
    m = brightness * (grey + saturation * (rot - grey))
    return tuple(float(v) for row in m for v in (*row, 0.0))


def make_image(seed: int, index: int, attempt: int = 0) -> tuple[bytes, int, int, int]:
    """(JPEG bytes, source index, quality, short side) of image `index`: all draws keyed by (seed, index)."""
    rng = np.random.default_rng([seed, index, attempt])
    src = int(rng.integers(len(_SOURCES)))
    img = _SOURCES[src]
    h, w = img.shape[:2]
    aspect = float(rng.choice(ASPECTS))
    portrait = rng.random() < 0.3  # ImageNet is mostly landscape
    ratio = 1 / aspect if portrait else aspect  # width / height of the crop and the output
    short = int(rng.integers(SHORT_SIDE[0], SHORT_SIDE[1] + 1))
    out_w, out_h = (short, round(short * aspect)) if portrait else (round(short * aspect), short)
    # The largest crop of that aspect, then 30-100 % of its area: sources are 300-1400 px, so most crops are
    # rescaled up a little; different crop boxes make each image distinct.
    cw, ch = (w, w / ratio) if w / h < ratio else (h * ratio, h)
    scale = np.sqrt(rng.uniform(0.3, 1.0))
    cw, ch = max(8, int(cw * scale)), max(8, int(ch * scale))
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    pil = Image.fromarray(img[y0 : y0 + ch, x0 : x0 + cw]).resize((out_w, out_h), Image.Resampling.BICUBIC)
    if rng.random() < 0.5:
        pil = pil.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    pil = pil.convert("RGB", colour_matrix(rng.uniform(-0.5, 0.5), rng.uniform(0.7, 1.3), rng.uniform(0.75, 1.2)))
    # Sensor grain: a camera photo carries noise that an upscaled crop has lost; without it the JPEGs come out
    # at ~60 KB, half ImageNet's ~110 KB, and decode faster than real photographs would.
    gy, gx = int(rng.integers(0, 1024 - out_h + 1)), int(rng.integers(0, 1024 - out_w + 1))
    grain = _GRAIN[gy : gy + out_h, gx : gx + out_w] * rng.uniform(*GRAIN_SIGMA)
    pil = Image.fromarray(np.clip(np.asarray(pil, dtype=np.float32) + grain, 0, 255).astype(np.uint8))
    quality = int(rng.integers(QUALITY[0], QUALITY[1] + 1))
    buf = io.BytesIO()
    pil.save(buf, format="JPEG", quality=quality)
    return buf.getvalue(), src, quality, short


def _make(job: tuple[int, int, int]) -> tuple[bytes, int, int, int]:
    return make_image(*job)


def generate(sources: dict[str, bytes], n: int, seed: int, workers: int) -> list[tuple[bytes, int, int, int]]:
    """n distinct images; a repeat of an earlier image's bytes (never seen, but checked) is drawn again."""
    blobs = [sources[k] for k in sorted(sources)]
    with Pool(max(1, workers), initializer=_init, initargs=(blobs,)) as pool:
        images = pool.map(_make, [(seed, i, 0) for i in range(n)], chunksize=16)
        seen: set[str] = set()
        for i in range(n):
            attempt = 0
            while (digest := hashlib.sha1(images[i][0]).hexdigest()) in seen:
                attempt += 1
                images[i] = pool.apply(make_image, (seed, i, attempt))
            seen.add(digest)
    return images


def _opener(blob: bytes) -> Callable[[], Image.Image]:
    return lambda: Image.open(io.BytesIO(blob))


class _AsIsConverter(Converter):
    """The project's converter, but the JPEG bytes are stored as they are (no decode + re-encode), and the .beton
    is written on all cores and not hashed: FFCV's writer takes 2 processes by default, and the GPU suite
    rebuilds the set on a 16-core machine within its time limit."""

    beton_workers = os.cpu_count() or 2
    hash_outputs = False

    def __init__(self, out: str, data: dict[str, bytes], **kw: object) -> None:
        super().__init__(out, **kw)  # type: ignore[arg-type]
        self.data = data

    def encode(self, it: Item) -> bytes:
        return self.data[it.name]

    def rgb(self, it: Item) -> Callable[[], np.ndarray]:
        return lambda: np.asarray(self.open_checked(it).convert("RGB"))


def build(
    out: str,
    n: int,
    seed: int = 0,
    workers: int | None = None,
    sources_npz: str | None = None,
    ffcv: bool | None = None,
) -> dict:
    """Write the set into `out` (refuses a non-empty `out`, as the converter does); returns the manifest.
    `ffcv`: also write OUT/train.beton (None: where ffcv imports)."""
    t0 = time.perf_counter()
    sources = load_sources(sources_npz)
    names = sorted(sources)
    images = generate(sources, n, seed, workers or os.cpu_count() or 1)
    gen_s = time.perf_counter() - t0
    data = {f"photo{i:06d}.jpg": img[0] for i, img in enumerate(images)}
    items = [Item(name, src, _opener(blob)) for (name, blob), (_, src, _, _) in zip(data.items(), images)]
    formats = ["webdataset", "imagefolder"]
    if ffcv is not False:
        try:
            import ffcv as _  # noqa: F401

            formats.append("ffcv")
        except Exception:  # ImportError, or a missing system library (OSError)
            if ffcv:
                raise
    conv = _AsIsConverter(
        out,
        data,
        formats=formats,
        shard_size=128,  # many shards: 8 workers each get several (no idle tail)
        image_format="jpg",
        quality=90,
        mode="RGB",
        resize=None,
        resume=False,
        ffcv_mode="jpg",
    )
    conv.check_output()
    conv.run([Path(k).stem for k in names], {"train": items}, "photo_set (benchmarks/photo_set.py)")
    kb = np.array([len(b) for b, *_ in images]) / 1000
    qualities = np.array([img[2] for img in images])
    shorts = np.array([img[3] for img in images])
    manifest = {
        "images": n,
        "seed": seed,
        "sources": {k: len(v) for k, v in sources.items()},
        "formats": formats,
        "mean_kb": float(kb.mean()),
        "median_kb": float(np.median(kb)),
        "imagenet_mean_kb": IMAGENET_MEAN_KB,
        "short_side_range": [int(shorts.min()), int(shorts.max())],
        "short_side_histogram": dict(
            zip(
                [f"{a}-{a + 25}" for a in range(375, 500, 25)],
                np.histogram(shorts, bins=range(375, 501 + 24, 25))[0].tolist(),
            )
        ),
        "quality_range": [int(qualities.min()), int(qualities.max())],
        "qualities": {name: int(q) for name, q in zip(data, qualities)},
        "generate_s": gen_s,
        "total_s": time.perf_counter() - t0,
    }
    atomic.write_text((Path(out) / "photo_set.json"), json.dumps(manifest, indent=1))
    return manifest


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    p.add_argument("--out", required=True, help="empty or missing folder for the set")
    p.add_argument("--images", type=int, default=5500, help="a little over the 5,120 a loader benchmark times")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=None, help="generating processes (default: all cores)")
    p.add_argument("--sources-npz", default=None, help="load the source photographs from here, or save them here")
    p.add_argument("--no-ffcv", action="store_true", help="no .beton (default: written where ffcv imports)")
    args = p.parse_args(argv)
    m = build(args.out, args.images, args.seed, args.workers, args.sources_npz, ffcv=False if args.no_ffcv else None)
    print(
        f"wrote {args.out}: {m['images']} images from {len(m['sources'])} photographs, mean {m['mean_kb']:.1f} KB "
        f"(median {m['median_kb']:.1f}; ImageNet ~{IMAGENET_MEAN_KB:.0f} KB), short sides {m['short_side_range']}, "
        f"in {m['total_s']:.1f} s ({m['generate_s']:.1f} s generating)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
