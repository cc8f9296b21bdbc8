"""Tracking across process deaths and starts: a run killed before its first checkpoint is ended by the next
start, steps redone after a resume are logged once, every run gets its own name, a tracking URI that cannot
work is one clear UserError and a server that does not answer at start is waited out. Real MLflow (a SQLite
store), real SIGKILLs."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

mlflow = pytest.importorskip("mlflow")
from _warm_python import run_python  # noqa: E402
from mlflow import MlflowClient  # noqa: E402

from hypersolid_scale.safety.errors import UserError  # noqa: E402
from hypersolid_scale.tracking import TrackingConfig, make_tracker  # noqa: E402
from hypersolid_scale.tracking.spool import LoggedSteps  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def uri(tmp_path_factory) -> str:
    """One SQLite store for the module: creating an MLflow database takes seconds."""
    return f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"


def history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def statuses_in_spool(run_dir: Path, run_id: str) -> list[str]:
    lines = (run_dir / "tracking" / f"spool-{run_id}.jsonl").read_text().splitlines()
    return [r["status"] for r in map(json.loads, lines) if r["kind"] == "status"]


def test_a_run_killed_before_its_first_checkpoint_is_ended_by_the_next_start(uri, tmp_path, caplog):
    run_dir = tmp_path / "run"
    child = textwrap.dedent(f"""
        import os, signal
        from hypersolid_scale.tracking import TrackingConfig, make_tracker
        # sync_every_s=1h: the steps stay in the spool only, as between two checkpoints.
        tracker = make_tracker(TrackingConfig(tracking_uri={uri!r}, sync_every_s=3600), {str(run_dir)!r}, rank=0)
        print(tracker.run_id, flush=True)
        tracker.log_params({{"optim": {{"lr": 0.001}}}})
        for step in range(10):
            tracker.log_metrics({{"loss": float(step)}}, step)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = run_python(["-c", child], env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO, timeout=120)  # forked warm
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    dead = proc.stdout.split()[0]
    client = MlflowClient(uri)
    assert client.get_run(dead).info.status == "RUNNING" and history(client, dead, "loss") == []

    # No checkpoint carried the dead run's id: training starts again, as a new run.
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    tracker = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0)
    assert tracker.run_id != dead
    run = client.get_run(dead)
    assert run.info.status == "KILLED" and run.info.end_time is not None
    assert history(client, dead, "loss") == [(s, float(s)) for s in range(10)]
    assert run.data.params == {"optim.lr": "0.001"}
    assert any(dead in r.getMessage() and "KILLED" in r.getMessage() for r in caplog.records)
    assert client.get_run(tracker.run_id).info.status == "RUNNING"
    tracker.close()

    # Ended once: a later start finds nothing to end, and the finished run is left alone.
    again = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0)
    again.close()
    assert statuses_in_spool(run_dir, dead) == ["KILLED"]
    assert statuses_in_spool(run_dir, tracker.run_id) == ["FINISHED"]
    assert client.get_run(tracker.run_id).info.status == "FINISHED"

    # The documented hand sync finds everything sent.
    cli = subprocess.run([sys.executable, "-m", "hypersolid_scale.tracking", "sync", str(run_dir)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert (cli.returncode, cli.stdout.strip()) == (0, "sent 0 tracking records; 0 still pending"), cli.stderr


def _killed_before_first_checkpoint(uri: str, run_dir: Path) -> str:
    """A process that tracks 10 steps (held in its spool only) and is SIGKILLed; returns its run id."""
    child = textwrap.dedent(f"""
        import os, signal
        from hypersolid_scale.tracking import TrackingConfig, make_tracker
        tracker = make_tracker(TrackingConfig(tracking_uri={uri!r}, sync_every_s=3600), {str(run_dir)!r}, rank=0)
        print(tracker.run_id, flush=True)
        for step in range(10):
            tracker.log_metrics({{"loss": float(step)}}, step)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = run_python(["-c", child], env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO, timeout=120)  # forked warm
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.split()[0]


def test_the_hand_sync_ends_a_killed_run_unless_a_training_holds_the_run_dir(uri, tmp_path):
    """Nobody trains in that directory again: ``sync`` sends the spool and ends the run, as a next start
    would; while a training holds the directory (it may resume the run) the run is left as it is."""
    from hypersolid_scale.safety.run_lock import acquire_run_lock

    run_dir = tmp_path / "run"
    dead = _killed_before_first_checkpoint(uri, run_dir)
    client = MlflowClient(uri)
    sync = [sys.executable, "-m", "hypersolid_scale.tracking", "sync", str(run_dir)]
    lock = acquire_run_lock(run_dir)  # a live training
    try:
        cli = subprocess.run(sync, cwd=REPO, capture_output=True, text=True, timeout=120)
    finally:
        lock.release()
    assert cli.returncode == 0 and "sent 10 tracking records; 0 still pending" in cli.stdout, cli.stderr
    assert "its runs stay as they are" in cli.stdout, cli.stdout
    assert client.get_run(dead).info.status == "RUNNING" and len(history(client, dead, "loss")) == 10
    cli = subprocess.run(sync, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0 and f"MLflow run {dead} was left RUNNING" in cli.stdout, cli.stdout + cli.stderr
    run = client.get_run(dead)
    assert run.info.status == "KILLED" and run.info.end_time is not None
    assert statuses_in_spool(run_dir, dead) == ["KILLED"]


def test_runs_of_live_trackers_and_resumed_runs_are_not_ended(uri, tmp_path):
    run_dir = tmp_path / "run"
    client = MlflowClient(uri)
    live = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0)
    live.log_metrics({"loss": 1.0}, 1)
    # A second tracker in the same directory while the first is open (same process: its spool is locked).
    other = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0)
    assert client.get_run(live.run_id).info.status == "RUNNING"
    other.close()
    # A tracker that resumes a run created elsewhere (an offline evaluation's) does not own it.
    evaluation = make_tracker(TrackingConfig(tracking_uri=uri), tmp_path / "eval", rank=0, resume_run_id=live.run_id)
    evaluation.log_metrics({"eval/knn": 0.5}, 1)
    assert evaluation.flush()
    del evaluation  # dropped without close: its spool is unlocked, but the run is not its to end
    make_tracker(TrackingConfig(tracking_uri=uri), tmp_path / "eval", rank=0).close()
    assert client.get_run(live.run_id).info.status == "RUNNING"
    # Evaluating the same checkpoint again is new information, not a step redone: it is logged.
    evaluation = make_tracker(TrackingConfig(tracking_uri=uri), tmp_path / "eval", rank=0, resume_run_id=live.run_id)
    evaluation.log_metrics({"eval/knn": 0.7}, 1)
    assert evaluation.flush()
    assert history(client, live.run_id, "eval/knn") == [(1, 0.5), (1, 0.7)]
    del evaluation
    live.close()
    assert client.get_run(live.run_id).info.status == "FINISHED"


def test_steps_redone_after_a_resume_are_logged_once(uri, tmp_path, caplog):
    run_dir = tmp_path / "run"
    client = MlflowClient(uri)
    first = make_tracker(TrackingConfig(tracking_uri=uri, sync_every_s=3600), run_dir, rank=0)
    for step in range(1, 11):
        first.log_metrics({"loss": 1.0 / step, "lr": 0.1}, step)
        if step == 5:
            assert first.flush()  # the checkpoint at step 5: MLflow has 1..5, the spool alone has 6..10
    assert history(client, first.run_id, "loss") == [(s, 1.0 / s) for s in range(1, 6)]
    # "Killed": abandoned without close (kept referenced, so its spool is still locked, as by a live writer).
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    resumed = make_tracker(TrackingConfig(tracking_uri=uri, sync_every_s=3600), run_dir, rank=0,
                           resume_run_id=first.run_id)
    assert client.get_run(first.run_id).info.status == "RUNNING"
    for step in range(6, 13):  # from the checkpoint's step 5 on: 6..10 again, then new steps
        resumed.log_metrics({"loss": 1.0 / step, "lr": 0.1}, step)
    resumed.log_metrics({"eval/knn": 0.5}, 8)  # a key new at an old step is logged
    resumed.close()
    assert history(client, first.run_id, "loss") == [(s, 1.0 / s) for s in range(1, 13)]
    assert history(client, first.run_id, "lr") == [(s, 0.1) for s in range(1, 13)]
    assert history(client, first.run_id, "eval/knn") == [(8, 0.5)]
    assert client.get_run(first.run_id).info.status == "FINISHED"
    del first


def test_logged_steps_match_a_set_of_pairs(tmp_path):
    """The sorted-array index against the obvious set of (key, step), with steps out of order and repeated
    (spools written before steps were deduplicated) and a torn last record."""
    rng = random.Random(1)
    pairs: set[tuple[str, int]] = set()
    lines = [json.dumps({"kind": "open", "uri": "sqlite:///x", "run": "r"})]
    for _ in range(400):
        step = rng.randrange(60)
        keys = rng.sample(["loss", "lr", "eval/knn"], rng.randint(1, 3))
        pairs |= {(k, step) for k in keys}
        lines.append(json.dumps({"kind": "metrics", "step": step, "time": 0, "values": dict.fromkeys(keys, 1.0)}))
        if rng.random() < 0.1:
            lines.append(json.dumps({"kind": "tags", "values": {"loss": "x"}}))
    path = tmp_path / "spool-r.jsonl"
    path.write_text("\n".join(lines) + '\n{"kind": "metrics", "step": 999, "values": {"lo')
    logged = LoggedSteps.scan(path)
    assert len(logged) == len(pairs)
    queries = [(k, s) for k in ("loss", "lr", "eval/knn", "other") for s in range(-2, 70)] + [("loss", 999)]
    assert [q for q in queries if q in logged] == [q for q in queries if q in pairs]
    assert ("loss", 0) not in LoggedSteps.scan(tmp_path / "missing.jsonl")


def test_every_run_gets_its_own_readable_name(uri, tmp_path):
    names = []
    for _ in range(2):
        random.seed(0)  # as training does before the tracker starts
        tracker = make_tracker(TrackingConfig(tracking_uri=uri), tmp_path / "quickstart", rank=0)
        tracker.close()
        names.append(MlflowClient(uri).get_run(tracker.run_id).info.run_name)
    assert names[0] != names[1]
    assert all(name.startswith("quickstart-") for name in names), names
    named = make_tracker(TrackingConfig(tracking_uri=uri, run_name="mine"), tmp_path / "quickstart", rank=0)
    named.close()
    assert MlflowClient(uri).get_run(named.run_id).info.run_name == "mine"


def test_a_tracking_uri_that_cannot_work_is_one_user_error_and_writes_nothing(tmp_path):
    """A configuration mistake (here a URI scheme MLflow does not know) is not waited out like an outage."""
    run_dir = tmp_path / "run"
    with pytest.raises(UserError) as caught:
        make_tracker(TrackingConfig(tracking_uri="foo://bar"), run_dir, rank=0)
    message = str(caught.value)
    assert "foo://bar" in message and "unsupported URI" in message, message
    for fix in ("Fix tracking.tracking_uri", "tracking.tracking_uri=sqlite:///", "tracking.enabled=false"):
        assert fix in message, message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__  # not the client's tracebacks
    assert not run_dir.exists()


def test_server_that_never_answers_at_start_is_waited_out(tmp_path, restore_http_env, caplog):
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "1"
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    with socket.socket() as silent:  # accepts connections (the kernel's backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        server = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        tracker = make_tracker(TrackingConfig(tracking_uri=server), tmp_path / "run", rank=0)
        for step in range(20):
            tracker.log_metrics({"loss": float(step)}, step)
        assert time.monotonic() - start < 5
        assert not tracker.flush()
    (line,) = [r.getMessage() for r in caplog.records]
    assert server in line and "timeout" in line, line
    spool = tmp_path / "run" / "tracking" / f"spool-{tracker.run_id}.jsonl"
    logged = LoggedSteps.scan(spool)
    assert len(logged) == 20 and all(("loss", step) in logged for step in range(20))
    tracker.close()  # nothing listens any more: refused at once
