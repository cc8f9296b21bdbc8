"""WebDataset shards streamed over http, pipe: and fsspec; truncated shards checked against the manifest; the
loss limit; shard checksums; a corrupt sample in the evaluation dataset."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from _data_helpers import member_offsets, truncate_before_sample, truncate_inside_sample
from test_data_webdataset import CPU, converted, loader, make_shards  # noqa: F401 (a fixture)

from hypersolid_scale.data import DataConfig, build_eval_datasets, build_train_loader, num_classes
from hypersolid_scale.data.formats.webdataset import WebDatasetOptions
from hypersolid_scale.data.formats.webdataset.stream import ShardIndexDataset
from hypersolid_scale.data.formats.webdataset.urls import shard_key, split_urls
from hypersolid_scale.safety.errors import DataError

SHARDS = "shard-{000000..000003}.tar"


@pytest.fixture
def http_server() -> Iterator[Callable[[Path], str]]:
    """Serve a directory over http on 127.0.0.1 (a `python -m http.server` subprocess on a free port)."""
    procs: list[subprocess.Popen] = []

    def serve(root: Path) -> str:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                                 "--directory", str(root)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(proc)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return f"http://127.0.0.1:{port}"
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the test http server did not start")
                time.sleep(0.05)

    yield serve
    for proc in procs:
        proc.kill()
        proc.wait()


def epoch(ld) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    # With num_workers=0 the transforms draw from the main process's global generators: same start.
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean stream warns about nothing
        return list(ld)


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b) > 0
    for (va, la), (vb, lb) in zip(a, b):
        assert torch.equal(la, lb)
        assert all(torch.equal(x, y) for x, y in zip(va, vb))


def test_url_patterns_and_shard_names() -> None:
    assert split_urls("d/{a,b}.tar,e.tar::f-{1..2}.tar") == ["d/a.tar", "d/b.tar", "e.tar", "f-1.tar", "f-2.tar"]
    assert split_urls("http://[::1]:8000/s-{0..1}.tar") == ["http://[::1]:8000/s-0.tar", "http://[::1]:8000/s-1.tar"]
    assert shard_key("pipe:aws s3 cp s3://bucket/train/shard-000123.tar -") == ("train", "shard-000123.tar")
    assert shard_key("https://host:8443/x/test/shard-000001.tar?sig=1") == ("test", "shard-000001.tar")
    assert shard_key("pipe:cat data.bin") is None


def test_http_and_pipe_stream_the_same_batches_as_local_files(converted, http_server) -> None:
    manifest = str(converted / "manifest.json")
    base = http_server(converted)
    kw = dict(rank=1, world_size=2, num_workers=2)
    local = epoch(loader(str(converted / "train"), **kw))
    assert len(local) == 80 // 32
    http = loader(f"{base}/train/{SHARDS}", manifest=manifest, **kw)
    assert http.num_samples == 80
    assert_same_batches(local, epoch(http))
    piped = loader(f"pipe:cat {converted}/train/{SHARDS}", manifest=manifest, **kw)
    assert_same_batches(local, epoch(piped))
    # Without a manifest the count comes from one streamed pass, announced.
    with pytest.warns(UserWarning, match="set data.webdataset.manifest"):
        counted = loader(f"{base}/train/{SHARDS}", rank=1, world_size=2, num_workers=0)
    assert counted.num_samples == 80
    # The evaluation dataset streams remote shards once and then reads them at random.
    remote = ShardIndexDataset(f"{base}/test/shard-000000.tar", mode="L", manifest=manifest)
    near = ShardIndexDataset(str(converted / "test"), mode="L")
    assert len(remote) == len(near) == 20 and remote.stats["lost_samples"] == 0
    for i in (0, 7, 19):
        assert remote[i][1] == near[i][1] and np.array_equal(np.asarray(remote[i][0]), np.asarray(near[i][0]))
    # The config entry points: data.path / data.test_path as URLs, data.webdataset.manifest for counts and
    # classes.
    cfg = DataConfig(format="webdataset", path=f"{base}/train/{SHARDS}", test_path=f"{base}/test/shard-000000.tar",
                     webdataset=WebDatasetOptions(manifest=manifest), preset="fashion_mnist", batch_size_per_gpu=16, num_workers=0,
                     num_local_views=1)
    assert num_classes(cfg) == 80
    assert len(list(build_train_loader(cfg, rank=0, world_size=1, seed=0, device=CPU))) == 5
    train, test = build_eval_datasets(cfg)
    assert (len(train), len(test)) == (80, 20) and tuple(test[0][0].shape) == (1, 28, 28)


def test_fsspec_urls(converted) -> None:
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    for p in sorted((converted / "train").glob("*.tar")):
        fs.pipe(f"/wds/train/{p.name}", p.read_bytes())
    manifest = str(converted / "manifest.json")
    mem = loader(f"memory://wds/train/{SHARDS}", manifest=manifest)
    assert_same_batches(epoch(loader(str(converted / "train"))), epoch(mem))
    try:
        import s3fs  # noqa: F401
    except ImportError:  # without a backend: a clear error saying what to install, or how to pipe instead
        with pytest.raises(RuntimeError, match=r"shard-000000.tar.*pip install s3fs.*pipe:aws s3 cp"):
            list(loader("s3://bucket/train/shard-000000.tar", manifest=manifest))


def test_missing_or_unreadable_remote_shard_is_named(converted, http_server) -> None:
    manifest = str(converted / "manifest.json")
    base = http_server(converted)
    gone = f"{base}/train/shard-000009.tar"  # 404
    with pytest.raises(RuntimeError, match="cannot read shard .*shard-000009.tar"):
        loader(f"{base}/train/shard-000000.tar,{gone}")  # counting reads it
    # Listed in the manifest, so nothing reads it before the stream does.
    gone = f"pipe:cat {converted}/elsewhere/train/shard-000000.tar"
    with pytest.raises(DataError, match=f"cannot read shard '{gone}'.*exit 1.*leave it out of data.path"):
        list(loader(gone, manifest=manifest, num_workers=0))
    (converted / "train" / "shard-000003.tar").write_bytes(b"\x00garbage" * 700)
    with pytest.raises(RuntimeError, match="cannot read shard .*shard-000003.tar"):
        list(loader(f"{base}/train/{SHARDS}", manifest=manifest, num_workers=0))


@pytest.mark.slow  # torch takes ~10 s to shut down DataLoader workers after one of them raised
def test_unreadable_shard_is_named_from_a_dataloader_worker(converted) -> None:
    gone = f"pipe:cat {converted}/elsewhere/train/shard-000000.tar"
    with pytest.raises(DataError, match=f"^cannot read shard '{gone}'") as err:
        list(loader(gone, manifest=str(converted / "manifest.json"), num_workers=2))
    assert "\n" not in str(err.value)  # the worker's own one-line message, not its traceback


def labels_by_shard(batches: list) -> list[int]:
    return sorted(set(torch.cat([lab for _, lab in batches]).tolist()))


@pytest.mark.parametrize("workers", [0, 2])
def test_shard_truncated_at_a_member_boundary_warns_and_counts(converted, workers: int) -> None:
    truncate_before_sample(converted / "train" / "shard-000001.tar", 5)  # 15 of its 20 samples gone
    ld = loader(str(converted / "train"), num_workers=workers, max_lost_fraction=1.0)
    with pytest.warns(UserWarning, match=r"shard-000001.tar' holds 5 samples, the manifest lists 20: 15 of"):
        batches = list(ld)
    assert len(batches) == len(ld) == 80 // 16  # the other shards fill the epoch
    seen = labels_by_shard(batches)
    assert set(range(20, 25)) <= set(seen) and not set(range(25, 40)) & set(seen)
    assert ld.stats["short_shards"] >= 1 and ld.stats["lost_samples"] == 15 * ld.stats["short_shards"]
    assert ld.stats["truncated_shards"] == 0
    # The evaluation dataset checks the same way.
    with pytest.warns(UserWarning, match="shard-000001.tar' holds 5 samples"):
        ds = ShardIndexDataset(str(converted / "train"), mode="L")
    assert len(ds) == 65 and ds.stats["lost_samples"] == 15 and ds.stats["short_shards"] == 1
    # Without a manifest, the missing end-of-archive marker still gives it away (how much is gone: unknown).
    (converted / "manifest.json").unlink()
    ld = loader(str(converted / "train"), num_workers=workers)
    with pytest.warns(UserWarning, match="shard-000001.tar' ends without the tar end-of-archive marker"):
        list(ld)
    assert ld.stats["short_shards"] >= 1 and ld.stats["lost_samples"] == 0


@pytest.mark.parametrize("where", ["local", "pipe"])
def test_shard_truncated_inside_a_member_keeps_the_samples_before_the_break(converted, where: str) -> None:
    truncate_inside_sample(converted / "train" / "shard-000002.tar", 7)
    urls = str(converted / "train") if where == "local" else f"pipe:cat {converted}/train/{SHARDS}"
    ld = loader(urls, manifest=str(converted / "manifest.json"), max_lost_fraction=1.0)
    with pytest.warns(UserWarning, match=r"shard-000002.tar' breaks after 7 samples .*13 of its 20 samples"):
        batches = list(ld)  # training goes on
    assert len(batches) == len(ld) == 5
    seen = set(labels_by_shard(batches))
    assert set(range(40, 47)) <= seen and not set(range(47, 60)) & seen
    assert ld.stats["truncated_shards"] >= 1 and ld.stats["lost_samples"] == 13 * ld.stats["truncated_shards"]
    if where == "local":
        with pytest.warns(UserWarning, match="shard-000002.tar"):
            ds = ShardIndexDataset(str(converted / "train"), mode="L")
        assert len(ds) == 67 and ds.stats["truncated_shards"] == 1 and ds.stats["lost_samples"] == 13
        assert sorted(label for *_, label in ds.items) == [*range(47), *range(60, 80)]


def test_losing_more_than_max_lost_fraction_is_an_error(converted) -> None:
    truncate_before_sample(converted / "train" / "shard-000001.tar", 5)
    with pytest.raises(DataError, match=r"lost 15 samples in epoch 0.*max_lost_fraction=0.01.*shard-000001.tar: "
                                           r"15 lost \(short\).*raise data.webdataset.max_lost_fraction"):
        with pytest.warns(UserWarning):
            list(loader(str(converted / "train"), num_workers=2))
    ok = loader(str(converted / "train"), max_lost_fraction=0.5)
    with pytest.warns(UserWarning):
        assert len(list(ok)) == 5
    with pytest.raises(ValueError, match=r"data.webdataset.max_lost_fraction must be in \[0, 1\]"):
        DataConfig(format="webdataset", path="x", webdataset=WebDatasetOptions(max_lost_fraction=1.5)).validate()


def test_verify_shards_compares_the_sha256(converted) -> None:
    intact = loader(str(converted / "train"), verify_shards=True, num_workers=2)
    epoch(intact)  # matching hashes warn about nothing, and are not computed again
    assert intact.stats["checksum_mismatches"] == 0 and intact._verified
    shard = converted / "train" / "shard-000000.tar"
    name, _, data, size = next(m for m in member_offsets(shard) if m[0].endswith(".cls"))
    raw = bytearray(shard.read_bytes())
    raw[data:data + size] = b"9" * size  # same size and sample count, different bytes
    shard.write_bytes(bytes(raw))
    assert epoch(loader(str(converted / "train")))  # not verified: nothing to say
    ld = loader(str(converted / "train"), verify_shards=True)
    with pytest.warns(UserWarning, match="shard-000000.tar' has sha256 .* the manifest lists"):
        list(ld)
    assert ld.stats["checksum_mismatches"] >= 1 and ld.stats["lost_samples"] == 0
    with pytest.warns(UserWarning, match="shard-000000.tar' has sha256"):
        ds = ShardIndexDataset(str(converted / "train"), verify=True)
    assert ds.stats["checksum_mismatches"] == 1


def test_corrupt_sample_in_the_eval_dataset_is_skipped_and_counted(tmp_path) -> None:
    make_shards(tmp_path, [10, 10], corrupt={0: 2})  # samples 0 (truncated JPEG) and 1 (not an image)
    ds = ShardIndexDataset(str(tmp_path), mode="L")
    assert len(ds) == 20
    with pytest.warns(UserWarning, match="skipping sample 0"):
        img, label = ds[0]  # the next decodable sample fills the slot
    assert label == ds.items[2][-1] == 0 and ds.stats["corrupt_skipped"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loader_ = torch.utils.data.DataLoader(ShardIndexDataset(str(tmp_path), mode="L", transform=np.asarray),
                                              batch_size=5, num_workers=2)
        labels = torch.cat([y for _, y in loader_])
        counted = loader_.dataset.stats["corrupt_skipped"]
    assert len(labels) == 20 and counted == 3  # ds[0] meets both broken samples, ds[1] the second one
