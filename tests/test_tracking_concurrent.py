"""Trainings that start together on one new MLflow SQLite store (a sweep's first jobs), and a store that cannot
be used when a training starts: tracking never stops a training, and the store ends up with every step once.
The trainings are real processes; every store is a real SQLite one."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from _warm_python import run_python_together
from test_train import TINY as TINY_TRAINER  # the trainer tests' tiny config

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from hypersolid_scale.tracking import TrackingConfig, make_tracker, sync_spool  # noqa: E402
from hypersolid_scale.tracking.client import make_client  # noqa: E402
from hypersolid_scale.tracking.runs import open_run  # noqa: E402
from hypersolid_scale.tracking.spool import read_header  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
ENV.pop("HS_DEBUG", None)

# The real trainer on sklearn digits, shrunk until a step takes milliseconds; every step logged, no monitor.
TINY = [
    *TINY_TRAINER,
    "data.max_pretrain_samples=128",
    "max_steps=6",
    "checkpoint.every_n_steps=3",
    "tracking.enabled=true",
    "tracking.log_every_n_steps=1",
    "tracking.experiment=concurrent",
]


def spooled_steps(run_dir: Path) -> tuple[str, Counter]:
    """The run id of the one spool in ``run_dir`` and the (metric, step) pairs it logged, counted."""
    (spool,) = (run_dir / "tracking").glob("spool-*.jsonl")
    pairs: Counter = Counter()
    for line in spool.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "metrics":
            pairs.update((key, record["step"]) for key in record["values"])
    return spool.stem[len("spool-") :], pairs


def test_four_trainings_starting_together_on_a_new_store_all_log_every_step_once(tmp_path):
    """Without a lock MLflow creates the new store's schema in each of them at once: most fail ("table ...
    already exists", "Online migration expected to match one row"), and the store can be left unusable."""
    uri = f"sqlite:///{tmp_path / 'store' / 'mlflow.db'}"
    (tmp_path / "store").mkdir()
    runs = [tmp_path / f"run{i}" for i in range(4)]
    # Forks of one interpreter that has imported the package: they reach the store within milliseconds of
    # each other, as a sweep's jobs do.
    procs = run_python_together(
        [
            [REPO / "launch" / "train.py", *TINY, f"run_dir={run_dir}", f"tracking.tracking_uri={uri}"]
            for run_dir in runs
        ],
        env=ENV,
        timeout=240,
    )
    for proc in procs:
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        assert "could not start the MLflow run" not in proc.stderr, proc.stderr[-3000:]  # no outage either

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("concurrent")
    found = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
    assert len(found) == 4
    for run_dir in runs:
        run_id, spooled = spooled_steps(run_dir)
        assert run_id in found and found[run_id].info.status == "FINISHED"
        assert {step for key, step in spooled if key == "train/loss"} == set(range(1, 7))
        logged: Counter = Counter()
        for key in {key for key, _ in spooled}:
            logged.update((key, m.step) for m in client.get_metric_history(run_id, key))
        assert logged == spooled  # each (metric, step) once: none missing, none sent twice
        assert found[run_id].data.params["max_steps"] == "6"


# ---------------------------------------------------------------------------------------------------------
# A store that cannot be used at start, deterministically: the run trains, and is created and filled later
# ---------------------------------------------------------------------------------------------------------


def _broken_store(tmp_path: Path) -> tuple[Path, str]:
    """A SQLite store whose file is not a database: MLflow fails to open it, as it does a store left
    half-created."""
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    db.write_bytes(b"not a database\n" * 100)
    return db, f"sqlite:///{db}"


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_a_store_that_cannot_be_opened_at_start_gets_the_run_once_it_can(tmp_path, caplog):
    db, uri = _broken_store(tmp_path)
    run_dir = tmp_path / "run"
    caplog.set_level(logging.INFO, logger="hypersolid_scale.tracking")
    tracker = make_tracker(TrackingConfig(tracking_uri=uri, run_name="late", sync_every_s=0), run_dir, rank=0)
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "could not start the MLflow run" in line and "file is not a database" in line, line
    local_id = tracker.run_id
    tracker.log_params({"optim": {"lr": 0.001}})
    for step in range(1, 6):
        tracker.log_metrics({"loss": 1.0 / step}, step)
    assert not tracker.flush() and tracker.run_id == local_id

    db.unlink()  # the store can be used again (here: created anew)
    for step in range(6, 11):
        tracker.log_metrics({"loss": 1.0 / step}, step)
    tracker.close()
    assert tracker.run_id != local_id
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    client = MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "late"
    assert run.data.params == {"optim.lr": "0.001"} and run.data.tags["hypersolid.local_run_id"] == local_id
    assert history(client, tracker.run_id, "loss") == [(s, 1.0 / s) for s in range(1, 11)]
    first_metric = min(m.timestamp for m in client.get_metric_history(tracker.run_id, "loss"))
    assert run.info.start_time <= first_metric  # the run started when training did, not when it was created
    assert sorted(p.name for p in (run_dir / "tracking").glob("s*")) == [
        f"spool-{tracker.run_id}.jsonl",
        f"synced-{tracker.run_id}.json",
    ]


def test_a_locked_store_at_start_gets_the_run_once_it_is_released(tmp_path, caplog):
    db = tmp_path / "mlflow.db"
    holder = sqlite3.connect(db, isolation_level=None)  # another process's long write transaction
    holder.execute("BEGIN EXCLUSIVE")
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    try:
        tracker = make_tracker(TrackingConfig(tracking_uri=f"sqlite:///{db}"), tmp_path / "run", rank=0)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    (line,) = [r.getMessage() for r in caplog.records]
    assert "could not start the MLflow run" in line and "database is locked" in line, line
    for step in range(3):
        tracker.log_metrics({"loss": float(step)}, step)
    tracker.close()
    client = MlflowClient(f"sqlite:///{db}")
    assert client.get_run(tracker.run_id).info.status == "FINISHED"
    assert history(client, tracker.run_id, "loss") == [(0, 0.0), (1, 1.0), (2, 2.0)]


def test_a_run_resumed_before_and_after_its_store_could_be_used_is_one_run(tmp_path):
    """A checkpoint written while the run was not created holds its local id: resuming from it continues the
    same run, before the store answers and after, and an evaluation elsewhere finds it by its tag."""
    db, uri = _broken_store(tmp_path)
    run_dir = tmp_path / "run"
    first = make_tracker(TrackingConfig(tracking_uri=uri, sync_every_s=3600), run_dir, rank=0)
    for step in range(1, 11):
        first.log_metrics({"loss": 1.0 / step}, step)
        if step == 5:
            assert not first.flush()  # the checkpoint at step 5
            checkpoint_id = first.run_id
    del first  # killed at step 10: its spool is unlocked, its run still to be created

    db.unlink()
    resumed = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0, resume_run_id=checkpoint_id)
    run_id = resumed.run_id
    assert run_id != checkpoint_id  # created at once, the store answers now
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    for step in range(6, 13):  # 6..10 again, redone after the checkpoint
        resumed.log_metrics({"loss": 1.0 / step}, step)
    resumed.close()
    assert history(client, run_id, "loss") == [(s, 1.0 / s) for s in range(1, 13)]

    again = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0, resume_run_id=checkpoint_id)
    assert again.run_id == run_id
    again.log_metrics({"loss": 1.0 / 13}, 13)
    again.close()
    elsewhere = make_tracker(
        TrackingConfig(tracking_uri=uri), tmp_path / "eval", rank=0, resume_run_id=checkpoint_id, attach=True
    )
    assert elsewhere.run_id == run_id
    elsewhere.close(None)
    assert history(client, run_id, "loss") == [(s, 1.0 / s) for s in range(1, 14)]
    assert [r.info.run_id for r in client.search_runs([client.get_run(run_id).info.experiment_id])] == [run_id]


def test_a_run_created_by_a_try_that_died_before_the_rename_is_not_created_twice(tmp_path):
    db, uri = _broken_store(tmp_path)
    run_dir = tmp_path / "run"
    tracker = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0)
    tracker.log_metrics({"loss": 1.0}, 1)
    tracker.close()  # the store is still unusable: everything stays in the spool
    db.unlink()
    (spool,) = (run_dir / "tracking").glob("spool-*.jsonl")
    header = read_header(spool)
    created = open_run(make_client(uri), uri, header["pending"], header["run"])  # and then the process died
    assert sync_spool(run_dir) == (3, 0)  # tags, the step, the status
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_run(created).info.experiment_id])
    assert run.info.run_id == created and run.info.status == "FINISHED"
    assert history(client, created, "loss") == [(1, 1.0)]
