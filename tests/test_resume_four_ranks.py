"""A run on 4 ranks (DDP, gloo) resumed from a checkpoint is bit-identical to the uninterrupted run: DDP keeps its
first gradient buckets on more than two ranks (distributed/engines/ddp.py ``keep_first_buckets``). With DDP's
default re-bucketing after the first step, the resumed run's first step sums the gradients in another order, and
the weights two steps later are ~1.5e-8 apart in float32."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from _warm_python import run_processes
from test_torchrun_restart import _assert_bitwise

from hypersolid_scale import checkpoint as ck

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
STEPS, RESUME_AT = 6, 4
ARGS = [
    "--config", str(REPO / "configs" / "quickstart.yaml"), "data.dataset=digits", "data.global_batch_size=32",
    "data.num_local_views=0", "model.small_cnn.width=8", "method.hypersolid.hidden_dim=64",
    "method.hypersolid.out_dim=32", "eval.every_n_epochs=0", "progress=false", "tracking.enabled=false",
    "checkpoint.every_n_steps=2", "checkpoint.keep_last=0", "dist.device=cpu", f"max_steps={STEPS}",
]


def _train(run_dir: Path) -> None:
    proc = run_processes([str(REPO / "launch" / "train.py"), *ARGS, f"run_dir={run_dir}"], nproc=4, env=ENV,
                         timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_four_ranks_resume_bit_identically(tmp_path: Path) -> None:
    _train(tmp_path / "whole")
    resumed = ck.checkpoint_path(tmp_path / "resumed", RESUME_AT)
    resumed.parent.mkdir(parents=True)
    shutil.copy(ck.checkpoint_path(tmp_path / "whole", RESUME_AT), resumed)
    _train(tmp_path / "resumed")
    got = ck.load_checkpoint(ck.checkpoint_path(tmp_path / "resumed", STEPS))
    ref = ck.load_checkpoint(ck.checkpoint_path(tmp_path / "whole", STEPS))
    assert got["world_size"] == ref["world_size"] == 4
    for part in ("model", "method", "optimizer"):
        _assert_bitwise(got[part], ref[part], part)
