"""benchmarks/replication/retrace.py: a committed run's first epochs retrained from its own command and compared
with its result, bit for bit."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.replication import retrace
from benchmarks.replication.runspec import COMMON, QUICK, QUICK_HEADS
from hypersolid_scale.training.epoch_records import EPOCHS_FILE, read_epochs

ROOT = Path(__file__).resolve().parents[1]


def _quick_result(tmp: Path) -> dict:
    """A quick 2-epoch Hypersolid run (4 steps an epoch, 1 thread) trained as the study trains it, and the part of
    its result that retrace reads."""
    run_dir = tmp / "run"
    cmd = [sys.executable, "launch/train.py", "--config", "configs/quickstart.yaml", f"run_dir={run_dir}", "seed=0"]
    cmd += ["epochs=2", *COMMON, "dist.device=cpu", *QUICK, *QUICK_HEADS["hypersolid"]]
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    trained = list(read_epochs(run_dir / EPOCHS_FILE).values())
    return {"run": "quick", "command": shlex.join(cmd), "train_per_epoch": trained}


def test_a_runs_first_epoch_comes_back_bit_for_bit_and_a_difference_is_named(tmp_path: Path) -> None:
    """Retrained from its own command at its thread count, the run's first epoch comes back bit for bit, stopped
    after that epoch (the run has 2); one ulp is a difference, the timings are not compared, a command it cannot
    rerun is refused, and a retraining whose epoch ends at another step than the run's is an error."""
    result = _quick_result(tmp_path)
    (tmp_path / "result.json").write_text(json.dumps(result))
    traced = tmp_path / "retrace.json"
    cmd = [sys.executable, "-m", "benchmarks.replication.retrace", str(tmp_path / "result.json"), "--threads", "1"]
    done = subprocess.run([*cmd, "--out", str(traced)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.rstrip().endswith("(bit for bit)"), done.stdout + done.stderr
    rec = json.loads(traced.read_text())
    assert rec["identical"] and [e["epoch"] for e in rec["per_epoch"]] == [1]
    assert {"loss", "alignment", "repulsion", "lr"} <= set(rec["per_epoch"][0]["equal"])
    ep1 = result["train_per_epoch"][0]
    tampered = {**ep1, "loss": math.nextafter(ep1["loss"], 1.0), "images_per_s": 1.0}
    assert [e["differ"] for e in retrace.compare_epochs([tampered], {1: ep1}, 1)] == [
        {"loss": [tampered["loss"], ep1["loss"]]}
    ]
    with pytest.raises(SystemExit, match="single-process trainings"):
        retrace.retrace_command("python benchmarks/replication/random_init.py --config x.yaml", tmp_path)
    (tmp_path / "off").mkdir()
    off = {**result, "train_per_epoch": [{**ep1, "step": 3}]}
    with pytest.raises(SystemExit, match="epoch 1 ended at step 4, the run's at 3"):
        retrace.retrace(off, ROOT, 1, 1, tmp_path / "off")
