"""Resuming on another number of processes at the same global batch: no flag, the same global step and sample
position, the run the new process count would have trained (docs/design.md §5); another global batch is refused.

The quickstart network and data of tests/test_world_invariance.py (BatchNorm over the global batch, SGD with
momentum): 4 steps on 2 processes x 64, then 4 more on 1 process x 128, against 8 uninterrupted steps on 1 x 128.

Two checks, because two uninterrupted runs on 2 x 64 and on 1 x 128 are not bit-identical: their rounding
differs, and over 8 steps of 128 images that flips a few ReLU and hinge decisions, which moves the parameters by
about 2e-5 of their norm (and BatchNorm shifts, still tiny after 8 steps, by up to 1e-3 of their own size; the
per-tensor 1e-5 of test_world_invariance.py holds over its 3 steps of 16 images).
* exactness: the resumed run is bit-identical to the same checkpoint resumed as if 1 process had written it
  (the same-world-size resume, bit-exact after a SIGKILL: tests/test_train.py);
* the run on the new count: within 1e-4 of the uninterrupted 1 x 128 run, over all parameters (a resume that
  loses the optimizer's momentum lands 1e-2 away, one that restarts the epoch further still).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from _warm_python import run_processes
from test_torchrun_restart import _assert_bitwise
from test_world_invariance import COMMON

from hypersolid_scale import checkpoint as ck

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
GLOBAL = 128
# 6 global batches per epoch: the resume at step 4 is inside epoch 0, the run ends in epoch 1.
ARGS = [
    *COMMON,
    "dist.engine=ddp",
    "dist.sync_bn=true",
    "data.num_local_views=2",
    f"data.max_pretrain_samples={6 * GLOBAL}",
    "epochs=2",
    "checkpoint.every_n_steps=4",
    "checkpoint.keep_last=0",
]
TOL = 1e-4  # |resumed - uninterrupted| / |uninterrupted| over every parameter (see the module docstring)


def _train(run_dir: Path, nproc: int, steps: int, batch: int | None = None, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        str(REPO / "launch" / "train.py"),
        "--config",
        str(REPO / "configs" / "quickstart.yaml"),
        *ARGS,
        # The same config on any process count (data.global_batch_size); `batch` states another one per GPU.
        f"data.batch_size_per_gpu={batch}" if batch else f"data.global_batch_size={GLOBAL}",
        f"max_steps={steps}",
        f"run_dir={run_dir}",
        *extra,
    ]
    return run_processes(cmd, nproc=nproc, env=ENV, timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout + proc.stderr


def _final(run_dir: Path, world: int) -> dict:
    state = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert (state["step"], state["world_size"], state["global_batch"]) == (8, world, GLOBAL)
    return state


def _note(out: str, ckpt: Path, saved: int, world: int) -> str:
    notes = [line for line in out.splitlines() if line.startswith("note: resuming")]
    assert len(notes) == 1, out[-5000:]
    assert notes[0].startswith(
        f"note: resuming {ckpt}, written by {saved} process(es), on {world} at the same "
        f"global batch of {GLOBAL}: the step (4), the loader position and the optimizer "
        "state carry over; not carried over: the per-rank RNG states"
    ), notes[0]
    assert f"resumed from {ckpt} at step 4" in out
    return notes[0]


def _relative_error(got: dict, ref: dict) -> float:
    """|got - ref| / |ref| over every trained parameter (model and method; not the BatchNorm statistics)."""
    diff = norm = 0.0
    for part in ("model", "method"):
        for k, r in ref[part].items():
            if isinstance(r, torch.Tensor) and r.is_floating_point() and "running_" not in k:
                diff += float((got[part][k].double() - r.double()).square().sum())
                norm += float(r.double().square().sum())
    return (diff / norm) ** 0.5


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Each run once: the uninterrupted 1 x 128 reference, 2 x 64 for 4 steps, a refused and an accepted resume
    of it on 1 process, the same checkpoint resumed as if 1 process had written it, and 1 -> 2 processes."""
    root = tmp_path_factory.mktemp("resize")
    out: dict = {"root": root}
    _ok(_train(root / "reference", 1, 8))
    out["reference"] = _final(root / "reference", 1)
    _ok(_train(root / "resized", 2, 4, None, "checkpoint.every_n_steps=2"))
    # The same in sharded checkpoints (checkpoint/sharded.py): step 2's written while steps 3 and 4 train.
    sharded = ["checkpoint.format=sharded", "checkpoint.async_save=true"]
    _ok(_train(root / "sharded", 2, 4, None, "checkpoint.every_n_steps=2", *sharded))
    out["sharded_out"] = _ok(_train(root / "sharded", 1, 8, None, *sharded))
    four = ck.checkpoint_path(root / "resized", 4)
    out["four"] = ck.load_checkpoint(four)
    # The same checkpoint as if 1 process x 128 had written it, in a run directory of its own.
    same = ck.checkpoint_path(root / "same", 4)
    same.parent.mkdir(parents=True)
    ck.atomic_save({**torch.load(four, weights_only=True), "world_size": 1}, same)
    out["refused"] = _train(root / "resized", 1, 8, batch=64)  # a global batch of 64: refused, nothing changes
    out["resized_out"] = _ok(_train(root / "resized", 1, 8))
    out["same_out"] = _ok(_train(root / "same", 1, 8))
    # 1 -> 2: the reference's checkpoint at step 4, resumed on 2 processes x 64.
    grown = ck.checkpoint_path(root / "grown", 4)
    grown.parent.mkdir(parents=True)
    shutil.copy(ck.checkpoint_path(root / "reference", 4), grown)
    out["grown_out"] = _ok(_train(root / "grown", 2, 8))
    return out


def test_two_processes_resumed_on_one_at_the_same_global_batch_continue_exactly(runs: dict) -> None:
    root = runs["root"]
    four = runs["four"]
    assert (four["world_size"], four["global_batch"], four["loader"]["batches_done"]) == (2, GLOBAL, 4)
    note = _note(runs["resized_out"], ck.checkpoint_path(root / "resized", 4), saved=2, world=1)
    assert "keyed augmentations do not draw from them" in note and "WebDataset" not in note
    assert "note: resuming" not in runs["same_out"]
    resized, same, reference = _final(root / "resized", 1), _final(root / "same", 1), runs["reference"]
    for key in ("model", "method", "optimizer", "loader"):
        _assert_bitwise(resized[key], same[key], key)
    assert resized["loader"] == reference["loader"] and resized["epoch"] == reference["epoch"] == 1
    error = _relative_error(resized, reference)
    assert error < TOL, f"2 x 64 resumed on 1 x 128 is {error:.2e} away from 8 steps on 1 x 128"


def test_sharded_checkpoints_hold_the_same_state_and_resume_the_same_run(runs: dict) -> None:
    """Two processes save asynchronously, each its part; read whole (as evaluation does) a folder holds what the
    single file holds at the same step; resumed on one process, the run ends bit-identical to the file's."""
    root = runs["root"]
    for step in (2, 4):
        folder = ck.load_checkpoint(root / "sharded" / "checkpoints" / f"step_{step:08d}.dcp")
        file = ck.load_checkpoint(ck.checkpoint_path(root / "resized", step))
        for key in ("model", "method", "loader", "rng", "step", "global_batch"):
            _assert_bitwise(folder[key], file[key], f"step {step} {key}")
    # What evaluation opens: the model built from the folder, with a fingerprint of its files for the caches.
    from hypersolid_scale.eval.source import checkpoint_source

    folder_path = root / "sharded" / "checkpoints" / "step_00000004.dcp"
    source = checkpoint_source(folder_path, [])
    _assert_bitwise(source.model.state_dict(), checkpoint_source(ck.checkpoint_path(root / "resized", 4), []).model
                    .state_dict(), "evaluated model")
    assert source.weights_id != checkpoint_source(root / "sharded" / "checkpoints" / "step_00000002.dcp", []).weights_id
    _note(runs["sharded_out"], folder_path, saved=2, world=1)
    sharded, resized = _final(root / "sharded", 1), _final(root / "resized", 1)
    for key in ("model", "method", "loader"):
        _assert_bitwise(sharded[key], resized[key], key)


def test_one_process_resumed_on_two_at_the_same_global_batch(runs: dict) -> None:
    root = runs["root"]
    _note(runs["grown_out"], ck.checkpoint_path(root / "grown", 4), saved=1, world=2)
    grown = _final(root / "grown", 2)
    assert grown["loader"] == runs["reference"]["loader"]
    error = _relative_error(grown, runs["reference"])
    assert error < TOL, f"1 x 128 resumed on 2 x 64 is {error:.2e} away from 8 steps on 1 x 128"


def test_another_global_batch_is_refused_in_one_line(runs: dict) -> None:
    proc = runs["refused"]
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        f"was trained with a global batch of {GLOBAL} images (2 process(es)), this run's is 64 (1 process(es))"
        in errors[0]
    ), errors[0]
    assert "checkpoint.resume=force" in errors[0]
