"""MLflow tracking: a real SQLite store, a real `mlflow server` that is killed and restarted, a real kill -9."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from _net import free_port

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

from hypersolid_scale.tracking import (  # noqa: E402
    MAX_PARAM_VALUE_LENGTH,
    Tracker,
    TrackingConfig,
    git_commit,
    make_tracker,
    sync_spool,
)
from hypersolid_scale.tracking.metadata import git_dirty  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
from _warm_python import run_python  # noqa: E402
from conftest import HTTP_ENV  # noqa: E402  (the variables restore_http_env restores)


def steps_of(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """One run on the default store (``<run_dir>/mlflow.db``); other tests reuse its database, since
    creating an MLflow database takes seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = tmp_path_factory.mktemp("default_run")
    tracker = make_tracker(TrackingConfig(run_name="unit"), run_dir, rank=0, tags={"engine": "ddp"})
    tracker.log_params({"loss": {"alpha": 0.9, "backend": "dense"}, "model": {"arch": "small_cnn"},
                        "note": "x" * (MAX_PARAM_VALUE_LENGTH + 100), "views": [2, 6]})
    for step in range(5):
        tracker.log_metrics({"loss": 1.0 / (step + 1), "lr": 1e-3}, step)
    (run_dir / "config.yaml").write_text("loss:\n  alpha: 0.9\n")
    tracker.log_artifact(run_dir / "config.yaml")
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    tracker.log_figure(fig, "plots/loss_curve")
    plt.close(fig)
    tracker.set_tags({"world_size": 2})
    tracker.close()
    return run_dir, tracker


def test_default_store_holds_everything(default_run):
    run_dir, tracker = default_run
    assert tracker.tracking_uri == f"sqlite:///{run_dir.resolve()}/mlflow.db"
    client = MlflowClient(tracker.tracking_uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "unit"
    params = run.data.params
    assert params["loss.alpha"] == "0.9" and params["model.arch"] == "small_cnn" and params["views"] == "[2, 6]"
    assert len(params["note"]) == MAX_PARAM_VALUE_LENGTH and params["note"].endswith("[truncated]")
    assert steps_of(client, tracker.run_id, "loss") == [0, 1, 2, 3, 4]
    assert [m.value for m in sorted(client.get_metric_history(tracker.run_id, "loss"), key=lambda m: m.step)] \
        == pytest.approx([1.0, 0.5, 1 / 3, 0.25, 0.2])
    assert run.data.tags["engine"] == "ddp" and run.data.tags["world_size"] == "2"
    assert run.data.tags.get("mlflow.source.git.commit") == git_commit()
    assert {a.path for a in client.list_artifacts(tracker.run_id)} == {"config.yaml", "plots"}
    assert [a.path for a in client.list_artifacts(tracker.run_id, "plots")] == ["plots/loss_curve.png"]
    # Artifacts live inside the run directory, not in ./mlruns of the working directory.
    assert run.info.artifact_uri.startswith((run_dir.resolve() / "mlartifacts").as_uri())
    png = Path(run.info.artifact_uri[len("file://"):]) / "plots" / "loss_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Sent artifacts leave no staged copies behind.
    assert not any(p.is_file() for p in (run_dir / "tracking").glob("artifacts-*/**/*"))


def test_replaying_the_whole_spool_adds_nothing(default_run):
    """Without a watermark everything is resent; MLflow must still hold each step once."""
    run_dir, tracker = default_run
    assert sync_spool(run_dir) == (0, 0)  # all sent already
    for mark in (run_dir / "tracking").glob("synced-*.json"):
        mark.unlink()
    spool = next((run_dir / "tracking").glob("spool-*.jsonl")).read_text().splitlines()
    assert sync_spool(run_dir) == (len(spool) - 1, 0)  # every record but the header, once more
    client = MlflowClient(tracker.tracking_uri)
    assert steps_of(client, tracker.run_id, "loss") == [0, 1, 2, 3, 4]
    assert client.get_run(tracker.run_id).info.status == "FINISHED"


def test_kill_minus_9_then_resume_continues_the_same_run(default_run, tmp_path):
    uri = default_run[1].tracking_uri
    run_dir = tmp_path / "run"
    child = textwrap.dedent(f"""
        import os, signal, sys
        from pathlib import Path
        from hypersolid_scale.tracking import TrackingConfig, make_tracker
        run_dir = Path({str(run_dir)!r})
        # sync_every_s=1h: everything below stays in the spool only, as if the server were away.
        tracker = make_tracker(TrackingConfig(tracking_uri={uri!r}, sync_every_s=3600), run_dir, rank=0)
        print(tracker.run_id, flush=True)
        tracker.log_params({{"optim": {{"lr": 0.001}}}})
        for step in range(20):
            tracker.log_metrics({{"loss": float(step)}}, step)
        (run_dir / "notes.txt").write_text("before the kill")
        tracker.log_artifact(run_dir / "notes.txt")
        # A record torn in the middle of its write by the kill.
        with open(next((run_dir / "tracking").glob("spool-*.jsonl")), "ab") as f:
            f.write(b'{{"kind": "metrics", "step": 99, "ti')
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = run_python(["-c", child], env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=REPO, timeout=120)  # forked warm
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    run_id = proc.stdout.split()[0]
    client = MlflowClient(uri)
    assert client.get_metric_history(run_id, "loss") == []  # only the spool has them

    tracker = make_tracker(TrackingConfig(tracking_uri=uri), run_dir, rank=0, resume_run_id=run_id)
    assert tracker.run_id == run_id
    assert client.get_run(run_id).info.status == "RUNNING"
    for step in range(20, 30):
        tracker.log_metrics({"loss": float(step)}, step)
    tracker.close()

    history = client.get_metric_history(run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(30)]
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"optim.lr": "0.001"}
    assert [a.path for a in client.list_artifacts(run_id)] == ["notes.txt"]
    spool = next((run_dir / "tracking").glob("spool-*.jsonl")).read_bytes()
    assert spool.endswith(b"\n") and all(json.loads(line) for line in spool.splitlines())


def test_bad_input_is_refused_with_clear_errors(default_run, tmp_path):
    uri = default_run[1].tracking_uri
    with pytest.raises(ValueError, match="experiment"):
        make_tracker(TrackingConfig(experiment=" "), tmp_path, rank=0)
    with pytest.raises(ValueError, match="log_every_n_steps"):
        make_tracker(TrackingConfig(log_every_n_steps=0), tmp_path, rank=1)
    with pytest.raises(ValueError, match="does not exist"):
        make_tracker(TrackingConfig(tracking_uri=uri), tmp_path, rank=0, resume_run_id="f" * 32)
    tracker = make_tracker(TrackingConfig(tracking_uri=uri), tmp_path, rank=0)
    for bad in ("loss?", "train//loss", "/loss", ""):
        with pytest.raises(ValueError, match="invalid metric name"):
            tracker.log_metrics({bad: 1.0}, 0)
    with pytest.raises(ValueError, match="must be numbers"):
        tracker.log_metrics({"loss": "low"}, 0)
    with pytest.raises(ValueError, match="step must be an int"):
        tracker.log_metrics({"loss": 1.0}, 0.5)
    with pytest.raises(ValueError, match="no such file"):
        tracker.log_artifact(tmp_path / "missing.png")
    with pytest.raises(ValueError, match="FINISHED, FAILED or KILLED"):
        tracker.close(status="DONE")
    tracker.close(status="FAILED")
    tracker.close()  # a second close is a no-op
    assert MlflowClient(uri).get_run(tracker.run_id).info.status == "FAILED"
    with pytest.raises(RuntimeError, match="closed"):
        tracker.log_metrics({"loss": 1.0}, 1)


def test_a_run_started_with_a_parent_is_its_child(default_run, tmp_path):
    uri, parent = default_run[1].tracking_uri, default_run[1].run_id
    child = make_tracker(TrackingConfig(tracking_uri=uri, parent_run_id=parent), tmp_path / "child", rank=0)
    orphan = make_tracker(TrackingConfig(tracking_uri=uri), tmp_path / "orphan", rank=0)
    for t in (child, orphan):
        t.close()
    client = MlflowClient(uri)
    assert client.get_run(child.run_id).data.tags.get("mlflow.parentRunId") == parent
    assert "mlflow.parentRunId" not in client.get_run(orphan.run_id).data.tags
    with pytest.raises(ValueError, match="parent_run_id='runs/7'.*32 hex digits"):
        make_tracker(TrackingConfig(tracking_uri=uri, parent_run_id="runs/7"), tmp_path / "bad", rank=0)


def test_a_refused_value_is_dropped_alone(default_run, tmp_path, caplog):
    """MLflow refuses to change a logged param (e.g. a forced config change on resume): that one value is
    dropped with a warning, and neither the rest of its batch nor later records are held up."""
    uri = default_run[1].tracking_uri
    tracker = make_tracker(TrackingConfig(tracking_uri=uri, sync_every_s=3600), tmp_path, rank=0)
    tracker.log_params({"optim": {"lr": 0.001}})
    assert tracker.flush()
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    tracker.log_params({"optim": {"lr": 0.002, "weight_decay": 1e-6}})
    tracker.log_metrics({"loss": 1.0}, 0)
    assert tracker.flush()
    tracker.close()
    client = MlflowClient(uri)
    assert client.get_run(tracker.run_id).data.params == {"optim.lr": "0.001", "optim.weight_decay": "1e-06"}
    assert steps_of(client, tracker.run_id, "loss") == [0]
    refusal, summary = (r.getMessage() for r in caplog.records)
    assert "refused a params record" in refusal and "optim.lr" in refusal
    assert "refused 1 logged values" in summary


def test_server_down_at_start_does_not_stop_the_run_and_the_hand_sync_sends_it(default_run, tmp_path, caplog,
                                                                              restore_http_env):
    """Nothing listens at start: the tracker starts at once, under a local run id, says so in one line, and
    keeps everything in its spool; ``sync RUN_DIR URI`` later creates the run (at that URI) and sends it all."""
    server = f"http://127.0.0.1:{free_port()}"
    caplog.set_level(logging.WARNING, logger="hypersolid_scale.tracking")
    start = time.monotonic()
    tracker = make_tracker(TrackingConfig(tracking_uri=server, run_name="offline"), tmp_path, rank=0)
    assert time.monotonic() - start < 10
    (line,) = [r.getMessage() for r in caplog.records]
    assert "could not start the MLflow run" in line and "connection refused" in line and "\n" not in line
    assert f"spool-{tracker.run_id}.jsonl" in line and "training goes on" in line
    local_id = tracker.run_id
    tracker.log_params({"optim": {"lr": 0.001}})
    for step in range(5):
        tracker.log_metrics({"loss": float(step)}, step)
    tracker.close()
    assert tracker.run_id == local_id  # never created

    store = default_run[1].tracking_uri
    assert sync_spool(tmp_path, store) == (8, 0)  # tags, params, 5 steps, status; the run is created first
    (spool,) = (tmp_path / "tracking").glob("spool-*.jsonl")
    run_id = spool.stem[len("spool-"):]
    assert run_id != local_id
    client = MlflowClient(store)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "offline"
    assert run.data.params == {"optim.lr": "0.001"} and run.data.tags["hypersolid.local_run_id"] == local_id
    assert steps_of(client, run_id, "loss") == [0, 1, 2, 3, 4]
    assert sync_spool(tmp_path, store) == (0, 0)


@pytest.mark.parametrize("rank, enabled", [(1, True), (0, False)])
def test_noop_tracker(tmp_path, rank, enabled):
    run_dir = tmp_path / "run"
    tracker = make_tracker(TrackingConfig(enabled=enabled), run_dir, rank=rank)
    assert type(tracker) is Tracker and tracker.run_id is None and tracker.tracking_uri is None
    tracker.log_params({"a": {"b": 1}})
    tracker.log_metrics({"loss": 1.0}, 0)
    tracker.set_tags({"engine": "ddp"})
    tracker.log_artifact(tmp_path / "whatever.txt")
    tracker.log_figure(None, "plot.png")
    assert tracker.flush() is True
    tracker.close()
    assert not run_dir.exists()


def test_git_commit_and_dirty(tmp_path):
    assert git_commit(tmp_path) is None
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert git_commit(tmp_path) == head.strip()
    # git_dirty: tracked changes only (an untracked file leaves the checkout clean).
    (tmp_path / "f").write_text("a")
    assert not git_dirty(tmp_path)
    subprocess.run([*git, "add", "f"], cwd=tmp_path, check=True)
    assert git_dirty(tmp_path)
    subprocess.run([*git, "commit", "-q", "-m", "f"], cwd=tmp_path, check=True)
    assert not git_dirty(tmp_path)
    (tmp_path / "f").write_text("b")
    assert git_dirty(tmp_path)


def test_git_commit_named_by_the_environment(tmp_path, monkeypatch):
    # A copied tree (a GPU machine's) names the commit that was sent; it wins over the copy's .git.
    monkeypatch.setenv("HYPERSOLID_GIT_COMMIT", "a" * 40)
    assert git_commit(tmp_path) == "a" * 40 and git_commit() == "a" * 40
    monkeypatch.setenv("HYPERSOLID_GIT_COMMIT", "main")
    with pytest.raises(ValueError, match="HYPERSOLID_GIT_COMMIT='main' is not a commit id"):
        git_commit()


def test_trainer_imports_and_tracking_off_works_without_mlflow(tmp_path):
    # A process in which `import mlflow` fails, as on a machine without it: the trainer still imports,
    # tracking off gives the no-op tracker, tracking on fails at once with the fix in the message.
    code = textwrap.dedent(f"""
        import sys
        sys.modules["mlflow"] = None  # makes every `import mlflow...` raise ImportError
        import hypersolid_scale.training.trainer
        from hypersolid_scale.tracking import Tracker, TrackingConfig, make_tracker
        assert type(make_tracker(TrackingConfig(enabled=False), {str(tmp_path / "off")!r}, rank=0)) is Tracker
        try:
            make_tracker(TrackingConfig(), {str(tmp_path / "on")!r}, rank=0)
        except ImportError as err:
            assert "tracking.enabled=false" in str(err), err
            print("refused")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "refused"
    assert not (tmp_path / "on").exists()


# ---------------------------------------------------------------------------------------------------
# A real tracking server that goes away mid-run
# ---------------------------------------------------------------------------------------------------


class MlflowServer:
    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> None:
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        cmd = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
               "--backend-store-uri", f"sqlite:///{self.root}/server.db",
               "--artifacts-destination", str(self.root / "artifacts")]
        log = open(self.root / "server.log", "ab")
        # The server's background job runner is not needed here and doubles its start-up time.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        # Own session: kill() takes down the server and any worker it spawned, nothing else.
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server not up after {timeout_s}s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path / "server")
    server.root.mkdir()
    try:
        server.start()
        yield server
    finally:
        server.kill()


@pytest.mark.slow
def test_server_killed_and_restarted_mid_run_loses_nothing(mlflow_server, tmp_path, caplog, restore_http_env):
    for name in HTTP_ENV:
        os.environ.pop(name, None)
    tracker = make_tracker(TrackingConfig(tracking_uri=mlflow_server.uri, sync_every_s=0), tmp_path / "run", rank=0)
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"  # fail fast, we retry ourselves
    tracker.log_params({"loss": {"alpha": 0.9}})
    for step in range(10):
        tracker.log_metrics({"loss": float(step)}, step)
    assert tracker.flush()

    mlflow_server.kill()
    caplog.set_level(logging.INFO, logger="hypersolid_scale.tracking")
    slowest = 0.0
    for step in range(10, 30):
        start = time.monotonic()
        tracker.log_metrics({"loss": float(step)}, step)
        if step == 15:
            tracker.set_tags({"phase": "outage"})
            (tmp_path / "plot.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
            tracker.log_artifact(tmp_path / "plot.png", artifact_path="plots")
        slowest = max(slowest, time.monotonic() - start)
        time.sleep(0.1)  # let the backoff expire now and then, so calls really retry
    assert tracker.flush() is False
    assert slowest < 3.0
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unreachable" in warnings[0].getMessage()

    mlflow_server.start()  # same port, same store
    assert tracker.flush() is True
    assert any("is back" in r.getMessage() for r in caplog.records)
    for step in range(30, 35):
        tracker.log_metrics({"loss": float(step)}, step)
    tracker.close()
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1

    client = MlflowClient(mlflow_server.uri)
    history = client.get_metric_history(tracker.run_id, "loss")
    assert sorted((m.step, m.value) for m in history) == [(s, float(s)) for s in range(35)]
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["phase"] == "outage" and run.data.params == {"loss.alpha": "0.9"}
    assert [a.path for a in client.list_artifacts(tracker.run_id, "plots")] == ["plots/plot.png"]
