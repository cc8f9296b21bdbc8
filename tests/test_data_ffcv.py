"""FFCV: .beton from the conversion CLI, multi-crop loader statistics against the PIL path, bad files.

Slow: FFCV compiles every pipeline with numba on first use (minutes on a busy 2-core machine).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _data_helpers import (
    assert_pil_statistics_match,
    crop_geometry,
    limit_batches,
    pil_records,
    png_bytes,
    probe_images,
)
from PIL import Image

from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader, num_classes, resolve_preset
from hypersolid_scale.data.convert import main as convert
from hypersolid_scale.data.loading.protocol import TrainLoader
from hypersolid_scale.data.formats.ffcv import FFCVOptions
from hypersolid_scale.data.formats.ffcv.loader import FFCV_IMPORT_ERROR, check_beton

pytestmark = [
    pytest.mark.slow,
    # The keyed crop decoder reads its epoch key in numba object mode (see data/formats/ffcv/crop.py): expected.
    pytest.mark.filterwarnings("ignore:Code running in object mode"),
    pytest.mark.skipif(FFCV_IMPORT_ERROR is not None, reason=f"FFCV is not installed: {FFCV_IMPORT_ERROR}"),
]
CPU = torch.device("cpu")
N, SIZE = 192, 64


@pytest.fixture(scope="module")
def probe_dataset(tmp_path_factory) -> Path:
    """Probe images (ramps reveal crop and flip) in a 2-class folder, converted to .beton + shards."""
    root = tmp_path_factory.mktemp("ffcv")
    images = probe_images(N, SIZE)
    for i, img in enumerate(images):
        d = root / "photos" / ("a" if i % 2 else "b")
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:04d}.png").write_bytes(png_bytes(img))
    assert convert(["--folder", str(root / "photos"), "--out", str(root / "out"), "--formats", "ffcv,webdataset",
                    "--ffcv-mode", "raw"]) == 0
    return root / "out"


def cfg_for(path: Path, **kw) -> DataConfig:
    base = dict(format="ffcv", path=str(path), preset="default", global_crop_size=32, local_crop_size=16,
                num_local_views=2, batch_size_per_gpu=32, num_workers=1, ffcv=FFCVOptions(order="random"))
    base.update(kw)
    return DataConfig(**base)


def test_ffcv_views_have_the_statistics_of_the_pil_path(probe_dataset: Path) -> None:
    cfg = cfg_for(probe_dataset)
    preset = resolve_preset(cfg)
    loader = build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU)
    assert len(loader) == N // 32 and num_classes(cfg) == 2
    # FFCV's loader is what the trainer asks of every format's (the other formats: test_data_formats.py)
    assert isinstance(loader, TrainLoader) and loader.device_stage is None and loader.world_size_invariant
    views = ["global_0", "global_1", "local", "local"]
    other: dict = {v: {k: [] for k in ("area", "flipped", "jitter", "gray", "blur", "solarize")} for v in views}
    for raw, labels, indices in loader.raw_batches():
        assert [tuple(v.shape) for v in raw] == [(32, 3, 32, 32)] * 2 + [(32, 3, 16, 16)] * 2
        assert all(v.dtype == torch.uint8 for v in raw) and labels.dtype == torch.int64
        for i, v in enumerate(raw):
            for img in v.cpu().numpy():
                area, flipped = crop_geometry(img, SIZE)
                other[views[i]]["area"].append(area)
                other[views[i]]["flipped"].append(flipped)
        rec: dict = {}
        out = loader.augment(raw, indices, 0, record=rec)
        for i, v in enumerate(out):
            assert v.dtype == torch.float32 and v.device == CPU and v.shape == raw[i].shape
            for key in ("jitter", "gray", "blur", "solarize"):
                other[views[i]][key].append(rec[key][i].numpy())
            # Normalisation: a view with no photometric change is exactly (x / 255 - mean) / std.
            plain = ~(rec["jitter"][i] | rec["gray"][i] | rec["blur"][i] | rec["solarize"][i])
            mean = torch.tensor(preset.mean).view(1, 3, 1, 1)
            std = torch.tensor(preset.std).view(1, 3, 1, 1)
            expect = (raw[i][plain].float() / 255 - mean) / std
            torch.testing.assert_close(v[plain], expect, atol=1e-5, rtol=0)
    merged = {v: {k: np.concatenate([np.atleast_1d(np.asarray(x)) for x in vals]) for k, vals in d.items()}
              for v, d in other.items()}
    merged["local"] = merged["local"]  # both local views share one entry
    assert_pil_statistics_match(pil_records(preset, probe_images(N, SIZE, seed=1)), merged, preset)


def test_ffcv_full_batches_and_eval_dataset(probe_dataset: Path) -> None:
    cfg = cfg_for(probe_dataset, num_local_views=0, preset="cifar", global_crop_size=None, local_crop_size=None)
    loader = limit_batches(build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU), 2)
    batches = list(loader)
    assert len(batches) == 2
    views, labels = batches[0]
    assert [tuple(v.shape) for v in views] == [(32, 3, 32, 32)] * 2 and set(labels.tolist()) <= {0, 1}
    train, test = build_eval_datasets(cfg_for(probe_dataset, preset="cifar", eval_split="holdout"))
    x, y = train[0]
    assert tuple(x.shape) == (3, 32, 32) and isinstance(y, int) and len(train) + len(test) == N


def test_truncated_or_missing_beton_gives_a_clear_error(probe_dataset: Path, tmp_path) -> None:
    good = probe_dataset / "train.beton"
    assert check_beton(str(good)) == N
    for keep in (0.5, 0.99):
        bad = tmp_path / f"cut{keep}.beton"
        data = good.read_bytes()
        bad.write_bytes(data[: int(len(data) * keep)])
        with pytest.raises(ValueError, match=f"{bad.name}.*truncated"):
            check_beton(str(bad))
    shutil.copy(bad, tmp_path / "train.beton")
    with pytest.raises(ValueError, match="truncated"):
        build_train_loader(cfg_for(tmp_path), rank=0, world_size=1, seed=0, device=CPU)
    with pytest.raises(FileNotFoundError, match="nothing.beton"):
        check_beton(str(tmp_path / "nothing.beton"))


def _ddp_worker(rank: int, world: int, beton: str, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        cfg = cfg_for(Path(beton), preset="cifar", num_local_views=0, global_crop_size=None,
                      local_crop_size=None, batch_size_per_gpu=16)
        loader = build_train_loader(cfg, rank=rank, world_size=world, seed=3, device=CPU)
        labels = [lab.tolist() for _, lab in loader]
        torch.save({"len": len(loader), "labels": labels}, f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ffcv_under_ddp_gives_each_rank_its_own_equal_share(tmp_path) -> None:
    """Under a real process group: same batch count on both ranks, disjoint samples (label = sample index)."""
    from hypersolid_scale.data.formats.ffcv.beton_writer import write_beton

    images = probe_images(100, 40)
    write_beton(str(tmp_path / "ids.beton"), [lambda a=a: a for a in images], list(range(100)), num_workers=1,
                page_size=1 << 21)
    torch.multiprocessing.spawn(_ddp_worker, args=(2, str(tmp_path / "ids.beton"), f"file://{tmp_path}/init",
                                                   str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["len"] == r1["len"] == 50 // 16 == len(r0["labels"]) == len(r1["labels"])
    s0 = {x for b in r0["labels"] for x in b}
    s1 = {x for b in r1["labels"] for x in b}
    assert len(s0) == len(s1) == 48 and not s0 & s1


# ----------------------------------------------------------------------------- writing large images --
def raw_images_in(beton: Path) -> list[np.ndarray]:
    """The images of a raw-mode .beton, read straight from the file (FFCV stores raw RGB bytes as they are)."""
    from ffcv.reader import Reader

    meta = Reader(str(beton)).metadata["f0"]  # the first field, "image"
    data = np.memmap(beton, dtype=np.uint8, mode="r")
    return [np.array(data[m["data_ptr"]:m["data_ptr"] + 3 * int(m["height"]) * int(m["width"])]).reshape(
        int(m["height"]), int(m["width"]), 3) for m in meta]


def test_raw_images_larger_than_a_default_page_are_written_whole(tmp_path) -> None:
    """1700 x 1700 raw is 8,670,000 bytes, over FFCV's default 8 MiB page (as 2400 x 2400 is): a worker once
    failed on it and the command waited forever; now the page is sized to the largest image."""
    rng = np.random.default_rng(0)
    sources = {}
    for name, side in (("big0", 1700), ("big1", 1700), ("small", 64)):
        img = Image.fromarray(rng.integers(0, 256, (24, 24, 3), np.uint8)).resize((side, side), Image.BILINEAR)
        (tmp_path / "src" / name).mkdir(parents=True)
        img.save(tmp_path / "src" / name / "x.png")
        sources[name] = np.asarray(img)
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "hypersolid_scale.data.convert", "--folder", str(tmp_path / "src"),
                          "--out", str(out), "--formats", "ffcv", "--ffcv-mode", "raw"], capture_output=True,
                         text=True, timeout=300)  # a hang fails here
    assert run.returncode == 0, run.stderr[-2000:]
    assert not list(out.rglob("*.tmp")) and check_beton(str(out / "train.beton")) == 3
    stored = raw_images_in(out / "train.beton")
    for got, want in zip(stored, (sources["big0"], sources["big1"], sources["small"])):
        np.testing.assert_array_equal(got, want)


@pytest.mark.timeout(300)  # the old writer waited forever here
def test_a_failing_writer_worker_stops_the_write_with_its_error(tmp_path) -> None:
    from hypersolid_scale.data.formats.ffcv.beton_writer import write_beton
    from hypersolid_scale.safety.errors import DataError

    def load(i: int) -> np.ndarray:
        if i == 150:  # a file that changed or vanished after the conversion pass checked it
            raise OSError(f"image {i} cannot be read")
        return np.full((8, 8, 3), i % 256, np.uint8)

    dest = tmp_path / "x.beton"
    with pytest.raises(RuntimeError, match="FFCV writer worker failed: OSError: image 150 cannot be read"):
        write_beton(str(dest), [lambda i=i: load(i) for i in range(300)], [0] * 300, num_workers=2,
                    max_pixels=64, max_side=8)
    assert sorted(tmp_path.iterdir()) == []  # neither the file nor its .tmp
    # A page given explicitly that cannot hold the largest image: refused before anything is written.
    with pytest.raises(DataError, match="page size 2097152 cannot hold an image of 1000000 pixels"):
        write_beton(str(dest), [lambda: np.zeros((1000, 1000, 3), np.uint8)], [0], page_size=1 << 21)
    assert sorted(tmp_path.iterdir()) == []


_RSS_SCRIPT = """
import resource, sys
import hypersolid_scale.data.formats.ffcv.beton_writer  # FFCV, numba, torch: ~850 MB of RSS before any image
from hypersolid_scale.data.convert import main
peak = lambda who: resource.getrusage(who).ru_maxrss / 1024
start = peak(resource.RUSAGE_SELF)
main(["--folder", sys.argv[1], "--out", sys.argv[2], "--formats", "ffcv", "--ffcv-mode", "jpg"])
print(start, peak(resource.RUSAGE_SELF), peak(resource.RUSAGE_CHILDREN))
"""


def test_writing_a_beton_streams_the_images(tmp_path) -> None:
    """32 images of 1200 x 1200 (4.3 MB each decoded, 138 MB in all): the process and its FFCV writer workers
    (forked, so they start at the parent's RSS) hold one image at a time, not all."""
    rng = np.random.default_rng(0)
    for i in range(32):
        (tmp_path / "src" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (24, 24, 3), np.uint8)).resize((1200, 1200), Image.BILINEAR).save(
            tmp_path / "src" / f"c{i % 2}" / f"{i}.jpg", quality=90)
    run = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(tmp_path / "src"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    start, end, workers = (float(x) for x in run.stdout.strip().splitlines()[-1].split())
    assert end - start < 64 and workers - start < 96, run.stdout
    assert check_beton(str(tmp_path / "out" / "train.beton")) == 32
