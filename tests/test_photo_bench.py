"""The photo benchmark set (benchmarks/photo_set.py) and the photo loader benchmark's JSON (photo_loaders.py)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from benchmarks import photo_set

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sources_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sources") / "photo_sources.npz"
    photo_set.load_sources(str(path))  # collects from the packages and saves
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, sources_npz: Path) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("set") / "photos"
    return out, photo_set.build(str(out), 40, seed=3, workers=2, sources_npz=str(sources_npz), ffcv=False)


def shard_jpegs(out: Path) -> dict[str, bytes]:
    data = {}
    for shard in sorted((out / "train").glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar.getmembers():
                if m.name.endswith(".jpg"):
                    f = tar.extractfile(m)
                    assert f is not None
                    data[m.name] = f.read()
    return data


def quantization_of(quality: int) -> dict:
    buf = io.BytesIO()
    Image.new("RGB", (16, 16)).save(buf, format="JPEG", quality=quality)
    return Image.open(buf).quantization


def test_sources_npz_round_trip(sources_npz: Path) -> None:
    again = photo_set.load_sources(str(sources_npz))
    assert again == photo_set.collect_sources()  # identical bytes, every photograph
    assert {"sklearn_china.jpg", "sklearn_flower.jpg"} <= set(again)
    assert sources_npz.stat().st_size < 8_000_000


def test_set_properties(built: tuple[Path, dict]) -> None:
    out, manifest = built
    jpegs = shard_jpegs(out)
    assert len(jpegs) == manifest["images"] == 40
    assert len({hashlib.sha1(b).hexdigest() for b in jpegs.values()}) == 40  # distinct images
    folder = sorted((out / "imagefolder" / "train").rglob("*.jpg"))
    assert sorted(p.read_bytes() for p in folder) == sorted(jpegs.values())  # stored as encoded, both outputs
    sizes = []
    for name, blob in jpegs.items():
        img = Image.open(io.BytesIO(blob))
        assert img.format == "JPEG" and img.mode == "RGB"
        w, h = img.size
        assert 375 <= min(w, h) <= 500, (name, img.size)
        assert 1.2 <= max(w, h) / min(w, h) <= 1.55, (name, img.size)  # 5:4 .. 3:2
        quality = manifest["qualities"][name.split("_")[0] + ".jpg"]  # the key: <stem>_<hash>.jpg
        assert 85 <= quality <= 95
        assert img.quantization == quantization_of(quality), name  # encoded at the recorded quality
        sizes.append(len(blob) / 1000)
    assert manifest["mean_kb"] == pytest.approx(float(np.mean(sizes)))
    assert sum(manifest["short_side_histogram"].values()) == 40
    assert len(set(manifest["qualities"].values())) > 3


def test_same_seed_same_bytes(built: tuple[Path, dict], sources_npz: Path) -> None:
    sources = photo_set.load_sources(str(sources_npz))
    photo_set._init([sources[k] for k in sorted(sources)])
    out, manifest = built
    jpegs = shard_jpegs(out)
    first = next(k for k in jpegs if k.startswith("photo000005"))
    assert photo_set.make_image(3, 5)[0] == jpegs[first]  # one process here, two in the build
    assert photo_set.make_image(4, 5)[0] != jpegs[first]


def test_photo_loaders_pil_row(tmp_path: Path, sources_npz: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.photo_loaders",
        "--device=cpu",
        "--images=64",
        "--set-images=48",  # smaller than --images: the row goes on into the next epoch
        "--batch=16",
        "--workers=1",
        "--local-views=2",
        "--rows",
        "pil",
        "device",
        f"--sources-npz={sources_npz}",
        f"--cache={tmp_path / 'cache'}",
        f"--out={tmp_path / 'out'}",
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    data = json.loads((tmp_path / "out" / "photo_loaders.json").read_text())
    assert {"command", "card", "torch", "git_commit", "set_mean_kb", "imagenet_mean_kb", "workers"} <= set(data["meta"])
    rows = {r["row"]: r for r in data["results"]}
    pil = rows["pil"]
    assert pil["setup"] == "2x224+2x96" and pil["images"] >= 64 and pil["epochs_started"] >= 2
    assert pil["images_per_s"] > 0 and pil["host_cpu_ms_per_image"] > 0
    # The PIL path decodes and crops in the worker: that is where its CPU goes.
    assert pil["workers_cpu_ms_per_image"] > pil["main_cpu_ms_per_image"]
    assert "images_per_s" in rows["device"] or rows["device"]["skipped"] == "data.views_on not available"
    assert (tmp_path / "out" / "photo_loaders.png").is_file()
