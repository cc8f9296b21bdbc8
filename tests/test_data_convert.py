"""The conversion CLI: image folder / builtin -> shards + manifest; bad files; refuse; resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _data_helpers import fashion_mnist_or_skip, jpg_bytes, png_bytes
from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader, num_classes
from hypersolid_scale.data.convert import main, sha256
from hypersolid_scale.data.webdataset import ShardIndexDataset

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
    assert convert("--folder", str(src), "--out", str(out), "--formats", "webdataset,folder") == 0
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
    assert sorted(p.name for p in (out / "folder" / "train").iterdir()) == ["0_bag", "1_coat", "2_sandal"]


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
    cfg = DataConfig(dataset="webdataset", path=str(out), preset="digits", batch_size_per_gpu=64,
                     num_workers=0, num_local_views=2)
    assert num_classes(cfg) == 10
    loader = build_train_loader(cfg, rank=1, world_size=2, seed=0, device=torch.device("cpu"), epoch_length=2)
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

    from hypersolid_scale.data.builtin import fashion_mnist_dir

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
