"""Amendment 4 of docs/replication.md: the 100-epoch runs' first 20 epochs are the 20-epoch runs of their settings
and seeds (the number of epochs enters nothing a run computes under the constant learning rate), so the HDBSCAN
diagnosis of those settings reads the 100-epoch runs' epoch-20 checkpoints."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from _warm_python import run_python

from benchmarks.replication import plan as planmod
from benchmarks.replication.plan import plan

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("method", ["hypersolid", "simclr"])
def test_the_100_epoch_runs_first_epochs_are_the_20_epoch_runs(method: str, tmp_path: Path) -> None:
    """Amendment 4: the HDBSCAN diagnosis of the 20-epoch settings reads the 100-epoch run's epoch-20 checkpoint,
    because nothing in a run depends on its number of epochs (the learning rate is constant). Quick copies of the
    planned pair of one seed, one epoch against two: the checkpoints at the end of epoch 1 are bit-identical
    (weights, optimizer, RNG, loader); the paused longer run's evaluations include the diagnosis of that epoch."""
    import torch
    from test_torchrun_restart import _assert_bitwise

    from benchmarks.replication.commands import eval_tasks

    runs = plan("cpu", results=planmod.load_results())
    short, longer = (
        next(r for r in runs if r.part == p and r.method == method and r.seed == 0) for p in ("long", "curve100")
    )
    assert (short.config, short.overrides, short.epochs) == (longer.config, longer.overrides, longer.diagnose_epochs[0])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    ckpts = {}
    for name, run, epochs in (("short", short, 1), ("longer", longer, 2)):
        quick = replace(run, epochs=epochs).train_overrides("cpu", quick=True)
        train = ["launch/train.py", "--config", run.config, f"run_dir={tmp_path / name / 'run'}", *quick]
        done = run_python(train, env=env, cwd=ROOT)
        assert done.returncode == 0, done.stdout + done.stderr
        ckpts[name] = torch.load(tmp_path / name / "run" / "checkpoints" / "step_00000004.pt", weights_only=False)
    assert ckpts["short"]["loader"]["batches_done"] == 4  # the end of epoch 1 (4 quick steps)
    # The configs differ in the number of epochs and the folder only (the config's fingerprint, compared below with
    # the rest, leaves out both).
    configs = [ckpts[n].pop("config") for n in ("short", "longer")]
    differ = {k for k in configs[0] if configs[0][k] != configs[1][k]}
    assert differ == {"epochs", "run_dir"}, differ
    _assert_bitwise(ckpts["longer"], ckpts["short"], "checkpoint")
    staged = replace(longer, epochs=2, eval_epochs=(1, 2), pause_epochs=(1,), diagnose_epochs=(1,))
    for upto, final in ((1, 4), (None, 8)):  # paused at epoch 1, then finished
        tasks, missing = eval_tasks(staged, tmp_path / "longer", final, upto, ["--suite", "knn"], "py", "cpu", True)
        got = [(t.protocol, t.step, t.epoch) for t in tasks]
        assert got[-2:] == [("hdbscan_grid.backbone", 4, 1), ("hdbscan_grid.projector", 4, 1)], got
        assert [g for g in got if g[0] == "knn"] == [("knn", 4 * e, e) for e in (1, 2)[: 2 if upto is None else 1]]
        assert missing == []
