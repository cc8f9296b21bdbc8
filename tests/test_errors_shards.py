"""Damaged WebDataset shards are the user's data problem, not a bug: through launch/train.py and
launch/eval.py, one line ``error: ...`` naming the shard (or data.webdataset.max_lost_fraction) and the fix,
exit code 2, no traceback; whether the shard is found bad while the loader is built, while training reads it, in a
DataLoader worker, or on one rank of two."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from _data_helpers import convert_shards, truncate_before_sample
from _errors import assert_one_error_line
from _eval_helpers import make_checkpoint, run_launch_eval
from _net import free_port
from test_errors_train import LAUNCH, REPO, TINY, _train

# TINY's trainer on WebDataset shards of Fashion-MNIST (28 px, one channel: TINY's model fits them).
SHARDS = [*TINY, "data.format=webdataset", "data.dataset=fashion_mnist", "epochs=1", "checkpoint.every_n_steps=0"]
FIX = "python -m hypersolid_scale.data.convert"


def garbage(path: Path) -> Path:
    """Random bytes where a shard should be (a failed copy, a disk error, the wrong file)."""
    path.write_bytes(os.urandom(8192))
    return path


@pytest.fixture
def converted(tmp_path: Path) -> Path:
    """4 train shards of 20 samples and 1 test shard, with the converter's manifest (so training reads a
    shard first when its batches are due, not while the loader is built)."""
    convert_shards(tmp_path / "data", {"train": 80, "test": 20}, shard_size=20)
    return tmp_path / "data"


def test_a_garbage_shard_found_while_counting_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """No manifest: the loader counts the samples of every shard while it is built, and meets the bad one."""
    (tmp_path / "shards").mkdir()
    shard = garbage(tmp_path / "shards" / "shard-000000.tar")
    proc = _train([*SHARDS, f"data.path={shard.parent}", f"run_dir={tmp_path / 'run'}"])
    assert_one_error_line(proc, str(shard), "not a tar archive", FIX)


@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_a_garbage_shard_found_while_training_is_one_line_and_exit_2(converted: Path, tmp_path: Path,
                                                                     workers: int) -> None:
    """The manifest lists it, so training is under way when it is read; with DataLoader workers the error
    crosses a process boundary and must still come out as its own one line."""
    shard = garbage(converted / "train" / "shard-000002.tar")
    proc = _train([*SHARDS, f"data.path={converted}", f"data.num_workers={workers}", f"run_dir={tmp_path / 'run'}"])
    line = assert_one_error_line(proc, str(shard), "not a tar archive", FIX)
    assert "DataLoader worker" not in line


def test_losing_more_than_max_lost_fraction_is_one_line_and_exit_2(converted: Path, tmp_path: Path) -> None:
    truncate_before_sample(converted / "train" / "shard-000001.tar", 5)  # 15 of its 20 samples lost
    args = [*SHARDS, f"data.path={converted}", f"run_dir={tmp_path / 'run'}"]
    assert_one_error_line(_train(args), "data.webdataset.max_lost_fraction=0.01", "shard-000001.tar: 15 lost", FIX)
    # The reference: allowed to lose that much, the same data trains to the end.
    proc = _train([*args, "data.webdataset.max_lost_fraction=0.5"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "shard-000001.tar' holds 5 samples, the manifest lists 20" in proc.stderr


def test_a_damaged_manifest_is_one_line_and_exit_2(converted: Path, tmp_path: Path) -> None:
    manifest = converted / "manifest.json"
    manifest.write_text(manifest.read_text()[:40])  # cut short, as by a full disk or an interrupted copy
    proc = _train([*SHARDS, f"data.path={converted}", f"run_dir={tmp_path / 'run'}"])
    assert_one_error_line(proc, str(manifest), "JSONDecodeError", FIX)


def test_evaluating_on_a_garbage_shard_is_one_line_and_exit_2(converted: Path, tmp_path: Path) -> None:
    shard = garbage(converted / "test" / "shard-000000.tar")
    ckpt = make_checkpoint(tmp_path / "run", ["data.format=webdataset", "data.dataset=fashion_mnist",
                                              f"data.path={converted}"])
    proc = run_launch_eval("--checkpoint", str(ckpt), "--no-mlflow", "--suite", "knn")
    assert_one_error_line(proc, str(shard), "not a tar archive", FIX, "data.path=")


@pytest.mark.slow
def test_a_garbage_shard_of_one_rank_under_torchrun_ends_the_run(converted: Path, tmp_path: Path) -> None:
    """Two ranks, two shards: only one rank reads the garbage one, after training has started. That rank
    prints the line with its rank; the other, waiting for it in a collective, must not hang the run."""
    for extra in ("shard-000002.tar", "shard-000003.tar"):
        (converted / "train" / extra).unlink()  # the manifest still lists them: no counting pass reads shards
    shard = garbage(converted / "train" / "shard-000001.tar")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("HS_DEBUG", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(LAUNCH), *SHARDS, "data.batch_size_per_gpu=8", "dist.timeout_minutes=5",
           f"data.path={converted}/train/shard-{{000000..000001}}.tar",
           f"data.webdataset.manifest={converted}/manifest.json",
           f"run_dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-5000:]
    ours = [line for line in out.splitlines() if line.startswith("[rank ") and "error: cannot read shard" in line]
    assert len(ours) == 1 and ours[0].startswith("[rank ") and str(shard) in ours[0] and FIX in ours[0], out[-5000:]
    assert "hypersolid_scale/" not in out.split(ours[0])[1], out[-5000:]  # no traceback of ours after it
    assert f"traceback : {ours[0]}" in out.split("Root Cause")[1], out[-5000:]  # torchrun names it the cause
    # The other rank's collective fails for want of a peer: it points at the line above, not at a bug of its own.
    assert "another rank stopped first" in out and "an internal error" not in out, out[-5000:]
