"""The conversion CLI: image folder / builtin -> shards + manifest; bad files; refuse; resume."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from _data_helpers import fashion_mnist_or_skip, jpg_bytes, limit_batches, png_bytes
from PIL import Image

from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader, num_classes
from hypersolid_scale.data.convert import main
from hypersolid_scale.data.loading.common import sha256
from hypersolid_scale.data.formats.webdataset.stream import ShardIndexDataset

CLASSES = ("coat", "sandal", "bag")


def photo_folder(root: Path) -> Path:
    """root/<class>/*.{png,jpg} from real Fashion-MNIST images, plus two broken files."""
    data = fashion_mnist_or_skip()
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        picks = data.images[data.labels == (4, 5, 8)[c]][:7]
        for i, img in enumerate(picks):
            if i % 2:
                (root / name / f"img{i}.jpg").write_bytes(jpg_bytes(img))
            else:
                (root / name / f"img{i}.png").write_bytes(png_bytes(img))
    good = jpg_bytes(data.images[0])
    (root / "bag" / "truncated.jpg").write_bytes(good[: len(good) // 3])
    (root / "coat" / "notes.jpg").write_bytes(b"this is a text file")
    return root


def convert(*args: str) -> int:
    return main([*args, "--shard-size", "4"])


def test_folder_to_shards_with_manifest_and_bad_files(tmp_path, capsys) -> None:
    src, out = photo_folder(tmp_path / "photos"), tmp_path / "out"
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset,imagefolder") == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["classes"] == sorted(CLASSES) and m["num_classes"] == 3
    assert m["splits"]["train"]["per_class"] == {"bag": 7, "coat": 7, "sandal": 7}
    assert m["splits"]["train"]["count"] == 21
    assert sorted(Path(b["name"]).name for b in m["bad_files"]) == ["notes.jpg", "truncated.jpg"]
    assert "truncated.jpg" in capsys.readouterr().err  # listed, never silent
    shards = m["splits"]["train"]["shards"]
    assert [s["count"] for s in shards] == [4, 4, 4, 4, 4, 1]
    for s in shards:
        assert sha256(out / "train" / s["name"]) == s["sha256"]
    ds = ShardIndexDataset(str(out / "train"))
    assert len(ds) == 21 and sorted({label for *_, label in ds.items}) == [0, 1, 2]
    assert not list(out.rglob("*.tmp"))
    # The image-folder output keeps the label order.
    assert sorted(p.name for p in (out / "imagefolder" / "train").iterdir()) == ["0_bag", "1_coat", "2_sandal"]


def test_existing_output_is_refused_or_resumed_never_corrupted(tmp_path) -> None:
    src, out = photo_folder(tmp_path / "photos"), tmp_path / "out"
    convert("--folder", str(src), "--out", str(out), "--formats", "webdataset")
    manifest = json.loads((out / "manifest.json").read_text())
    before = {p.name: sha256(p) for p in (out / "train").iterdir()}
    with pytest.raises(SystemExit, match="already holds a complete conversion"):
        convert("--folder", str(src), "--out", str(out), "--formats", "webdataset")
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset", "--resume") == 0
    assert {p.name: sha256(p) for p in (out / "train").iterdir()} == before
    # What an interrupted run leaves: finished shards, their progress record, no manifest; one finished
    # shard was damaged afterwards and one was never written.
    shards = manifest["splits"]["train"]["shards"]
    (out / "manifest.json").unlink()
    (out / "train" / shards[-1]["name"]).unlink()
    (out / ".progress.json").write_text(json.dumps({"train": shards[:-1]}))
    damaged = out / "train" / shards[1]["name"]
    damaged.write_bytes(damaged.read_bytes()[:100])
    with pytest.raises(SystemExit, match="--resume"):
        convert("--folder", str(src), "--out", str(out), "--formats", "webdataset")
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset", "--resume") == 0
    assert {p.name: sha256(p) for p in (out / "train").iterdir()} == before
    assert json.loads((out / "manifest.json").read_text()) == manifest


def test_builtin_dataset_to_shards_then_train_and_eval(tmp_path) -> None:
    out = tmp_path / "digits"
    assert main(["--builtin", "digits", "--out", str(out), "--formats", "webdataset", "--shard-size", "500"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert (m["splits"]["train"]["count"], m["splits"]["test"]["count"]) == (1437, 360)
    cfg = DataConfig(format="webdataset", path=str(out), preset="digits", batch_size_per_gpu=64,
                     num_workers=0, num_local_views=2)
    assert num_classes(cfg) == 10
    loader = limit_batches(build_train_loader(cfg, rank=1, world_size=2, seed=0, device=torch.device("cpu")), 2)
    views, labels = next(iter(loader))
    assert [tuple(v.shape) for v in views] == [(64, 1, 16, 16)] * 2 + [(64, 1, 8, 8)] * 2
    assert 0 <= int(labels.min()) and int(labels.max()) <= 9
    train, test = build_eval_datasets(cfg)
    assert (len(train), len(test)) == (1437, 360) and tuple(test[0][0].shape) == (1, 16, 16)


def test_bad_arguments_are_rejected(tmp_path) -> None:
    with pytest.raises(SystemExit):
        main(["--folder", str(tmp_path), "--out", str(tmp_path / "o"), "--formats", "parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no class subfolders"):
        main(["--folder", str(tmp_path / "empty"), "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # nothing written for a bad source


def test_torchvision_root_to_shards(tmp_path) -> None:
    """A torchvision FashionMNIST root (the layout its downloader writes), made from the Debian idx files."""
    import gzip

    from hypersolid_scale.data.loading.builtin_sets import fashion_mnist_dir

    fashion_mnist_or_skip()
    raw = tmp_path / "tv" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for gz in fashion_mnist_dir().glob("*-ubyte.gz"):
        (raw / gz.name[:-3]).write_bytes(gzip.decompress(gz.read_bytes()))
    out = tmp_path / "out"
    assert main(["--torchvision", "FashionMNIST", "--root", str(tmp_path / "tv"), "--out", str(out),
                 "--formats", "webdataset", "--limit", "40", "--shard-size", "16"]) == 0
    m = json.loads((out / "manifest.json").read_text())
    assert m["classes"][0] == "T-shirt/top"
    assert (m["splits"]["train"]["count"], m["splits"]["test"]["count"]) == (40, 40)
    img, label = ShardIndexDataset(str(out / "test"), mode="L")[0]
    assert img.size == (28, 28) and label == int(fashion_mnist_or_skip("test").labels[0])


# ----------------------------------------------------------------------------- image size limit --
def claimed_size_jpeg(side: int, real: int = 48) -> bytes:
    """A valid `real` x `real` JPEG whose frame header (SOF) is patched to claim `side` x `side`: libjpeg
    decodes it without error, filling the rest, so it would decode to side^2 pixels."""
    data = bytearray(jpg_bytes(np.random.default_rng(0).integers(0, 256, (real, real, 3), dtype=np.uint8)))
    i = 2
    while data[i + 1] not in (0xC0, 0xC1, 0xC2):  # walk the marker segments to the frame header
        i += 2 + struct.unpack(">H", data[i + 2:i + 4])[0]
    data[i + 5:i + 9] = struct.pack(">HH", side, side)
    return bytes(data)


def test_images_over_max_side_are_listed_counted_and_skipped(tmp_path) -> None:
    src, out = photo_folder(tmp_path / "photos"), tmp_path / "out"
    (src / "coat" / "bomb.jpg").write_bytes(claimed_size_jpeg(9000))
    assert Image.open(src / "coat" / "bomb.jpg").size == (9000, 9000)
    wide = np.zeros((20, 40), np.uint8)  # 800 px: under PIL's pixel limit of 32^2, over the side limit
    (src / "bag" / "wide.png").write_bytes(png_bytes(wide))
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset") == 0
    m = json.loads((out / "manifest.json").read_text())
    too_large = sorted(Path(b["name"]).name for b in m["bad_files"] if b["reason"] == "too_large")
    assert too_large == ["bomb.jpg"] and m["bad_counts"] == {"too_large": 1, "undecodable": 2}
    assert m["splits"]["train"]["count"] == 22  # 21 photos and the wide one
    bomb = next(b for b in m["bad_files"] if b["reason"] == "too_large")
    assert "9000 x 9000 px, over --max-side 8192" in bomb["error"]
    # A lower limit: the side check rejects by the longer side, whatever the pixel count.
    assert convert("--folder", str(src), "--out", str(tmp_path / "o32"), "--formats", "webdataset",
                   "--max-side", "32") == 0
    m = json.loads((tmp_path / "o32" / "manifest.json").read_text())
    errors = {Path(b["name"]).name: b["error"] for b in m["bad_files"] if b["reason"] == "too_large"}
    assert sorted(errors) == ["bomb.jpg", "wide.png"] and "40 x 20 px, over --max-side 32" in errors["wide.png"]
    assert "9000 x 9000 px, over --max-side 32" in errors["bomb.jpg"] and m["splits"]["train"]["count"] == 21
    assert Image.MAX_IMAGE_PIXELS == _PIL_DEFAULT_LIMIT  # the process-wide setting is put back
    with pytest.raises(SystemExit):
        main(["--folder", str(src), "--out", str(tmp_path / "o0"), "--max-side", "0"])


_PIL_DEFAULT_LIMIT = Image.MAX_IMAGE_PIXELS

# Run in a fresh interpreter: peak RSS (ru_maxrss) only grows, so it must start from the converter's own
# imports. Rejected bombs first (each would decode to 243 MB), then 200 images of 512 x 512 (150 MB if held).
_MEMORY_SCRIPT = """
import resource, sys
from pathlib import Path
import numpy as np
from PIL import Image
src, bombs, out = (Path(a) for a in sys.argv[1:4])
from hypersolid_scale.data.convert import main
peak = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
start = peak()
main(["--folder", str(bombs), "--out", str(out / "bombs"), "--formats", "webdataset"])
after_bombs = peak()
# JPEG out: PNG's encoder took 0.1 s of the 0.11 s each image costs; the decoding whose memory is measured
# is the same.
main(["--folder", str(src), "--out", str(out / "photos"), "--formats", "webdataset,imagefolder", "--shard-size", "64",
      "--image-format", "jpg"])
print(start, after_bombs, peak(), sorted(m for m in ("torch", "ffcv") if m in sys.modules))
"""


@pytest.mark.slow  # writing and converting 200 images
def test_memory_stays_bounded_while_converting(tmp_path) -> None:
    rng = np.random.default_rng(0)
    for i in range(200):
        d = tmp_path / "src" / f"class{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        small = Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8))
        small.resize((512, 512), Image.BILINEAR).save(d / f"{i:03d}.jpg", quality=85)
    (tmp_path / "bombs" / "a").mkdir(parents=True)
    for i in range(3):
        (tmp_path / "bombs" / "a" / f"bomb{i}.jpg").write_bytes(claimed_size_jpeg(9000 + i))  # 81+ Mpx each
    (tmp_path / "bombs" / "a" / "ok.jpg").write_bytes(jpg_bytes(np.zeros((64, 64, 3), np.uint8)))
    run = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path / "src"), str(tmp_path / "bombs"),
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    start, after_bombs, end, heavy = run.stdout.strip().splitlines()[-1].split(" ", 3)
    # Rejected from the header: decoding one would take 243 MB (3 bytes x 81 Mpx).
    assert float(after_bombs) - float(start) < 64, run.stdout
    bombs = json.loads((tmp_path / "out" / "bombs" / "manifest.json").read_text())
    assert bombs["bad_counts"]["too_large"] == 3 and bombs["splits"]["train"]["count"] == 1
    # 200 images of 512 x 512 (0.75 MB each decoded): one at a time, not all.
    assert float(end) - float(after_bombs) < 64, run.stdout
    assert heavy == "[]"  # no torch / FFCV for webdataset and folder outputs (~700 MB of RSS on import)
    m = json.loads((tmp_path / "out" / "photos" / "manifest.json").read_text())
    assert m["splits"]["train"]["count"] == 200 and len(m["splits"]["train"]["shards"]) == 4


def test_an_interrupted_run_resumes_without_decoding_finished_shards_again(tmp_path, monkeypatch) -> None:
    from hypersolid_scale.data.convert.converter import Converter

    src = photo_folder(tmp_path / "photos")
    convert("--folder", str(src), "--out", str(tmp_path / "whole"), "--formats", "webdataset,imagefolder")
    reference = json.loads((tmp_path / "whole" / "manifest.json").read_text())
    decoded: list[str] = []
    real = Converter.open_checked

    def stop_at_the_15th(self, it):
        decoded.append(it.name)
        if len(decoded) == 15:
            raise KeyboardInterrupt  # killed with one sample in the fourth shard
        return real(self, it)

    monkeypatch.setattr(Converter, "open_checked", stop_at_the_15th)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        convert("--folder", str(src), "--out", str(out), "--formats", "webdataset,imagefolder")
    progress = json.loads((out / ".progress.json").read_text())["train"]
    assert [s["count"] for s in progress] == [4, 4, 4] and not (out / "manifest.json").exists()
    assert [Path(b["name"]).name for s in progress for b in s["bad"]] == ["truncated.jpg"]  # bag's last file
    assert not list((out / "train").glob("*.tmp"))  # the interrupted shard was not left behind
    decoded.clear()
    monkeypatch.setattr(Converter, "open_checked", lambda self, it: decoded.append(it.name) or real(self, it))
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset,imagefolder", "--resume") == 0
    assert len(decoded) == 23 - progress[-1]["consumed"]  # only the images after the finished shards
    assert json.loads((out / "manifest.json").read_text()) == reference
    for d in ("train", "imagefolder"):
        assert sorted(str(p.relative_to(out)) for p in (out / d).rglob("*")) == \
            sorted(str(p.relative_to(tmp_path / "whole")) for p in (tmp_path / "whole" / d).rglob("*"))
    for s in reference["splits"]["train"]["shards"]:
        assert sha256(out / "train" / s["name"]) == s["sha256"]


# ----------------------------------------------------------------------------- nothing converted --
def noise_folder(root: Path, sides: dict[str, int]) -> Path:
    """root/<class>/<name>.png of random noise, `sides[name]` px square; class by name order."""
    rng = np.random.default_rng(1)
    for i, (name, side) in enumerate(sorted(sides.items())):
        (root / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"c{i % 2}" / f"{name}.png").write_bytes(png_bytes(rng.integers(0, 256, (side, side, 3), np.uint8)))
    return root


def test_a_split_without_any_good_image_is_an_error_that_leaves_no_output(tmp_path) -> None:
    from hypersolid_scale.safety.errors import DataError

    src = noise_folder(tmp_path / "big", {"a": 40, "b": 48, "c": 40})
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"no image of split 'train' was converted: all 3 were rejected \(3 over "
                       r"--max-side 32, 0 undecodable; .*raise --max-side"):
        main(["--folder", str(src), "--out", str(out), "--formats", "webdataset,imagefolder", "--max-side", "32"])
    assert not out.exists()  # nothing that looks like a (valid, empty) conversion
    broken = tmp_path / "broken"
    for name in ("x", "y"):
        (broken / name).mkdir(parents=True)
        (broken / name / "f.jpg").write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"all 2 were rejected \(0 over --max-side 8192, 2 undecodable"):
        main(["--folder", str(broken), "--out", str(out), "--formats", "webdataset"])
    assert not out.exists()
    # From the command line: exit 2 and one error line, after the list of rejected files.
    run = subprocess.run([sys.executable, "-m", "hypersolid_scale.data.convert", "--folder", str(src), "--out",
                          str(out), "--formats", "webdataset", "--max-side", "32"], capture_output=True, text=True,
                         timeout=300)
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert run.returncode == 2 and len(errors) == 1 and "no image of split 'train'" in errors[0], run.stderr
    assert run.stderr.count("bad image skipped") == 3 and not out.exists()


def test_a_later_split_without_good_images_keeps_the_earlier_shards_for_resume(tmp_path) -> None:
    from hypersolid_scale.safety.errors import DataError

    noise_folder(tmp_path / "src" / "train", {"a": 16, "b": 16, "c": 16})
    noise_folder(tmp_path / "src" / "test", {"a": 40, "b": 40})
    out = tmp_path / "out"
    with pytest.raises(DataError, match="no image of split 'test' was converted: all 2 were rejected"):
        main(["--folder", str(tmp_path / "src"), "--out", str(out), "--formats", "webdataset", "--max-side", "32",
              "--shard-size", "2", "--split", "train,test"])
    assert not (out / "manifest.json").exists() and not (out / "test").exists()
    assert sorted(p.name for p in (out / "train").iterdir()) == ["shard-000000.tar", "shard-000001.tar"]
    assert main(["--folder", str(tmp_path / "src"), "--out", str(out), "--formats", "webdataset", "--shard-size",
                 "2", "--split", "train", "--resume"]) == 0


# ----------------------------------------------------------------------------- FFCV page size --
def test_ffcv_page_size_holds_the_largest_raw_image() -> None:
    from hypersolid_scale.data.formats.ffcv.beton_writer import MAX_PAGE, page_size_for
    from hypersolid_scale.safety.errors import DataError

    for h, w in [(32, 32), (512, 512), (513, 513), (1673, 1673), (2400, 2400), (8192, 8192), (6000, 8000)]:
        floor = 1 << 21 if h * w <= 512 * 512 else 1 << 23
        reference = max(floor, 1 << (3 * h * w - 1).bit_length())  # smallest power of two >= the raw size
        assert page_size_for(h * w, max(h, w)) == reference, (h, w)
    assert page_size_for(2400 * 2400, 2400) == 1 << 25 > 2400 * 2400 * 3  # the 17,280,000 bytes of 2400 x 2400
    assert page_size_for(26754 ** 2, 26754) == MAX_PAGE
    with pytest.raises(DataError, match=r"30000 px\) is over what FFCV stores.*--resize N.*--max-side"):
        page_size_for(30000 ** 2, 30000)
    with pytest.raises(DataError, match="sides up to 65535"):
        page_size_for(70000 * 4, 70000)
