"""End to end: main([...]) on real data (sklearn digits), MLflow logging and resume, non-finite loss,
SIGKILL-and-resume equality, preemption exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _warm_python import run_python

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.losses import HypersolidLoss
from hypersolid_scale.training.trainer import EXIT_PREEMPTED, NonFiniteLossError, main

REPO = Path(__file__).resolve().parents[1]

# A real dataset and the real model/loss/loader, shrunk until a step takes milliseconds.
TINY = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=2",
        "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "data.num_local_views=2", "data.batch_size_per_gpu=32",
        "data.num_workers=0", "progress=false", "eval.every_n_epochs=0", "dist.device=cpu"]


def _mlflow_runs(run_dir: Path) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve()}/mlflow.db")
    exps = client.search_experiments()
    return [r for e in exps for r in client.search_runs([e.experiment_id])], client


def test_smoke_main_trains_logs_and_resumes_the_same_mlflow_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    args = [*TINY, f"run_dir={run_dir}", "data.max_pretrain_samples=128", "epochs=2", "checkpoint.every_n_steps=3",
            "tracking.log_every_n_steps=1", "eval.every_n_epochs=1", "eval.monitor_max_samples=200", "eval.knn_k=[5]"]
    assert main(args) == 0
    steps = [int(p.stem.split("_")[1]) for p in ck.list_checkpoints(run_dir)]
    assert steps[-1] == 8  # 128 samples / 32 = 4 steps per epoch, 2 epochs
    assert (run_dir / "config.yaml").is_file() and (run_dir / "plots" / "loss.png").is_file()
    first = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert first["mlflow_run_id"] and first["epoch"] == 1 and first["loader"]["batches_done"] == 4

    runs, client = _mlflow_runs(run_dir)
    assert len(runs) == 1 and runs[0].info.run_id == first["mlflow_run_id"]
    data = runs[0].data
    assert data.params["optim.lr"] == "0.001" and data.params["model.arch"] == "small_cnn"
    # The chosen method's section only (config.yaml too): no other method's keys to mistake for this run's.
    assert "method.hypersolid.alpha" in data.params and not any(k.startswith("method.simclr.") for k in data.params)
    assert {"world_size", "engine", "transport"} <= set(data.tags) and data.tags["engine"] == "ddp"
    for key in ("train/loss", "train/alignment", "train/repulsion", "train/active_pairs", "train/lr",
                "train/images_per_s", "train/step_time_s", "train/data_time_s", "train/data_wait_share",
                "loader/data_wait_share", "loader/boundary_stall_s", "loader/steady_wait_share", "train/mem_gb",
                "monitor/knn_k5_weighted"):
        assert key in data.metrics, key
    losses = [m.value for m in client.get_metric_history(runs[0].info.run_id, "train/loss")]
    assert len(losses) == 8 and losses[-1] < losses[0]  # it learns: near-collapsed start, repulsion pushes apart

    # Same run_dir, longer: resumes at step 8 and continues the same MLflow run.
    assert main([a.replace("epochs=2", "epochs=3") for a in args]) == 0
    last = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert last["step"] == 12 and last["mlflow_run_id"] == first["mlflow_run_id"]
    runs, client = _mlflow_runs(run_dir)
    assert len(runs) == 1
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "train/loss")] == list(range(1, 13))


def test_bad_config_fails_before_any_work(tmp_path: Path) -> None:
    run_dir = tmp_path / "never"
    with pytest.raises(ValueError, match="optim.nme"):
        main([*TINY, f"run_dir={run_dir}", "optim.nme=sgd"])
    with pytest.raises(ValueError, match="adamw"):
        main([*TINY, f"run_dir={run_dir}", "optim.name=adam"])
    assert not run_dir.exists()


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # lr 1e30: the first update is finite but huge; the next forward pass overflows the norm term.
    with pytest.raises(NonFiniteLossError, match="non-finite loss at step"):
        main([*TINY, f"run_dir={run_dir}", "optim.lr=1e30", "max_steps=20", "checkpoint.every_n_steps=1"])
    saved = ck.list_checkpoints(run_dir)
    assert saved, "the step before the failure was checkpointed"
    good = ck.load_checkpoint(saved[-1])
    assert good["step"] < 20
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())
    runs, _ = _mlflow_runs(run_dir)
    assert runs[0].info.status == "FAILED"


def test_a_non_finite_step_between_checks_never_reaches_a_checkpoint(tmp_path: Path, monkeypatch) -> None:
    """The check is deferred (no sync per step), but forced before every save: step 5 goes bad, the save at
    step 8 must refuse, and the checkpoint at step 4 stays the newest."""
    real_forward, calls = HypersolidLoss.forward, {"n": 0}

    def poisoned(self, feats):
        calls["n"] += 1
        return real_forward(self, feats * float("nan") if calls["n"] == 6 else feats)  # the 6th step: index 5

    monkeypatch.setattr(HypersolidLoss, "forward", poisoned)
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss at step 5 \(loss=nan.*nonfinite=\d+"):
        main([*TINY, f"run_dir={run_dir}", "max_steps=12", "checkpoint.every_n_steps=4", "checkpoint.keep_last=0",
              "tracking.log_every_n_steps=1000"])
    assert calls["n"] == 8  # trained on until the next forced check, the save at step 8, and raised there
    assert [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir)] == [4]
    good = ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])
    assert all(torch.isfinite(v).all() for v in good["model"].values() if v.is_floating_point())
    runs, _ = _mlflow_runs(run_dir)
    assert runs[0].info.status == "FAILED"


# ----------------------------------------------------------------------------------------------------------
# Subprocess runs: SIGKILL + resume, SIGUSR1 preemption
# ----------------------------------------------------------------------------------------------------------


def _launch(run_dir: Path, extra: list[str]) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(REPO / "launch" / "train.py"), *TINY, f"run_dir={run_dir}", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"run ended (rc={proc.returncode}) before {path.name}:\n{proc.stdout.read()[-3000:]}")
        if time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"timed out waiting for {path}")
        time.sleep(0.02)


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted_run(tmp_path: Path) -> None:
    extra = ["deterministic=true", "max_steps=60", "checkpoint.every_n_steps=5", "checkpoint.keep_last=0",
             "data.batch_size_per_gpu=64"]
    killed = _launch(tmp_path / "killed", extra)
    _wait_for(ck.checkpoint_path(tmp_path / "killed", 5), killed)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    done = [int(p.stem.split("_")[1]) for p in ck.list_checkpoints(tmp_path / "killed")]
    assert max(done) < 60, "the run finished before it could be killed; the test proves nothing"
    rc, out = _finish(_launch(tmp_path / "killed", extra))
    assert rc == 0, out[-3000:]
    assert f"resumed from {ck.checkpoint_path(tmp_path / 'killed', max(done))}" in out
    # The uninterrupted reference in a fork of the warm test server (the killed run above is the real process).
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    straight = run_python([REPO / "launch" / "train.py", *TINY, f"run_dir={tmp_path / 'straight'}", *extra], env=env)
    assert straight.returncode == 0, straight.stdout[-3000:] + straight.stderr[-3000:]

    a = ck.load_checkpoint(ck.list_checkpoints(tmp_path / "straight")[-1])
    b = ck.load_checkpoint(ck.list_checkpoints(tmp_path / "killed")[-1])
    assert a["step"] == b["step"] == 60
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    exp_avg = [s["exp_avg"] for s in a["optimizer"]["state"].values()]
    assert all(torch.equal(x, s["exp_avg"]) for x, s in zip(exp_avg, b["optimizer"]["state"].values()))
    # One MLflow run across the kill.
    first = ck.load_checkpoint(ck.checkpoint_path(tmp_path / "killed", 5))
    assert b["mlflow_run_id"] == first["mlflow_run_id"]


@pytest.mark.slow
def test_sigusr1_finishes_the_step_checkpoints_and_exits_75(tmp_path: Path) -> None:
    proc = _launch(tmp_path / "run", ["max_steps=100000", "checkpoint.every_n_steps=5"])
    _wait_for(ck.checkpoint_path(tmp_path / "run", 5), proc)
    proc.send_signal(signal.SIGUSR1)
    rc, out = _finish(proc, timeout=120)
    assert rc == EXIT_PREEMPTED, out[-3000:]
    last = ck.load_checkpoint(ck.list_checkpoints(tmp_path / "run")[-1])
    assert 5 <= last["step"] < 100000 and "preempted" in out
    # The loader position matches the step: the digits train split gives 44 batches of 32 per epoch.
    assert last["epoch"] * 44 + last["loader"]["batches_done"] == last["step"]


@pytest.mark.slow
def test_sigusr1_during_startup_still_checkpoints_and_exits_75(tmp_path: Path) -> None:
    """A preemption signal that lands while the launcher is still importing must not kill the job."""
    proc = _launch(tmp_path / "run", ["max_steps=100000", "checkpoint.every_n_steps=100000"])
    time.sleep(0.5)  # inside the imports: long before the trainer's own handlers exist
    proc.send_signal(signal.SIGUSR1)
    rc, out = _finish(proc, timeout=300)
    assert rc == EXIT_PREEMPTED, out[-3000:]
    last = ck.load_checkpoint(ck.list_checkpoints(tmp_path / "run")[-1])
    assert last["step"] == 1


def test_launcher_reports_a_bad_config_without_a_traceback(tmp_path: Path) -> None:
    rc, out = _finish(_launch(tmp_path / "run", ["optim.name=lamb"]), timeout=300)
    assert rc == 2
    assert "error: config key 'optim.name' = 'lamb' is not allowed; choose one of: adamw | sgd | lars" in out
    assert "Traceback" not in out


def test_resume_refuses_another_global_batch_and_prefers_the_runs_own_newest_checkpoint(tmp_path: Path) -> None:
    from hypersolid_scale.config.schema import load_config

    run_dir = tmp_path / "run"
    args = [*TINY, f"run_dir={run_dir}", "data.max_pretrain_samples=128", "max_steps=4", "checkpoint.every_n_steps=2",
            "checkpoint.keep_last=0"]
    assert main(args) == 0
    newest = ck.list_checkpoints(run_dir)[-1]
    assert ck.load_checkpoint(newest)["step"] == 4
    # A save killed mid-write leaves a temporary file; a checkpoint.path given at first launch must not win
    # over the run's own newer checkpoints after a requeue.
    stale = newest.with_name(newest.name + ".1234.tmp")
    stale.write_bytes(b"partial")
    cfg = load_config(None, [*args, f"checkpoint.path={ck.list_checkpoints(run_dir)[0]}"])
    assert ck.resolve_resume(cfg)["step"] == 4
    assert not stale.exists()

    # The same checkpoint as if written by 2 processes x 32 (a global batch of 64, derived for a checkpoint that
    # predates `global_batch`): resuming at a global batch of 32 is refused with the way out named.
    state = torch.load(newest, weights_only=True)
    state["world_size"] = 2
    del state["global_batch"]
    ck.atomic_save(state, newest)
    with pytest.raises(ValueError, match=r"global batch of 64 images \(2 process\(es\)\), this run's is 32 .*"
                                         r"checkpoint.resume=force"):
        main([a.replace("max_steps=4", "max_steps=6") for a in args])
    assert main([a.replace("max_steps=4", "max_steps=6") for a in args] + ["checkpoint.resume=force"]) == 0


def _loader_stats_worker(rank: int, port: int, out_dir: str) -> None:
    import json
    from types import SimpleNamespace

    import torch.distributed as dist

    from hypersolid_scale.training.epoch_report import summed_loader_stats

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # Each rank reads its own shards: rank 1 alone met the corrupt samples and the truncated shard.
        stats = {"corrupt_skipped": 3.0 * rank, "lost_samples": 15.0 * rank, "short_shards": 0.0}
        run = SimpleNamespace(loader=SimpleNamespace(stats=stats), device=torch.device("cpu"))
        with open(f"{out_dir}/rank{rank}.json", "w") as f:
            json.dump(summed_loader_stats(run), f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_loader_counters_are_summed_over_ranks_before_logging(tmp_path) -> None:
    import json

    from _net import free_port, spawn

    spawn(_loader_stats_worker, free_port(), str(tmp_path), nprocs=2)
    for rank in range(2):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"corrupt_skipped": 3.0, "lost_samples": 15.0, "short_shards": 0.0}, (rank, got)


def test_an_old_checkpoint_with_a_scheduler_entry_and_dist_backend_still_resumes(tmp_path: Path) -> None:
    """Checkpoints written before dist.backend became dist.transport, with the never-read `scheduler`."""
    run_dir = tmp_path / "run"
    args = [*TINY, f"run_dir={run_dir}", "data.max_pretrain_samples=128", "max_steps=4", "checkpoint.every_n_steps=2",
            "tracking.enabled=false"]
    assert main(args) == 0
    newest = ck.list_checkpoints(run_dir)[-1]
    state = torch.load(newest, weights_only=True)
    assert "scheduler" not in state and state["world_size"] == 1
    state["scheduler"] = {"kind": "constant", "step": 4, "lr": 1e-3}
    state["config"]["dist"]["backend"] = state["config"]["dist"].pop("transport")
    del state["world_size"]
    ck.atomic_save(state, newest)
    assert ck.build_model_from_checkpoint(newest)[1].dist.transport == "auto"
    assert main([a.replace("max_steps=4", "max_steps=6") for a in args]) == 0
    assert ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])["step"] == 6


@pytest.mark.parametrize("every_n_steps, every_n_epochs, calls, expected", [
    # (step, epoch_end, stopping) -> saved?; last_saved starts at 0 (a resumed run at step 0)
    (2, 1, [(0, None, False), (1, None, False), (2, None, False), (2, 0, False), (3, 0, False), (3, None, True)],
     [False, False, True, False, True, False]),
    (0, 2, [(1, None, False), (4, 0, False), (8, 1, False), (9, None, True), (9, None, True)],
     [False, False, True, True, False]),
    (0, 0, [(5, None, False), (5, 0, False), (7, 3, True)], [False, False, True]),
])
def test_one_save_decision_covers_steps_epoch_ends_and_stops(every_n_steps, every_n_epochs, calls, expected,
                                                             monkeypatch) -> None:
    from types import SimpleNamespace

    from hypersolid_scale.training import checkpointer

    saved: list[int] = []
    monkeypatch.setattr(checkpointer, "save", lambda run, step, tracker, wait=True: saved.append(step))
    run = SimpleNamespace(cfg=SimpleNamespace(checkpoint=SimpleNamespace(every_n_steps=every_n_steps,
                                                                        every_n_epochs=every_n_epochs)))
    checkpoint = checkpointer.Checkpointer(run, tracker=None, last_saved=0)
    got = []
    for step, epoch_end, stopping in calls:
        before = len(saved)
        checkpoint(step, epoch_end=epoch_end, stopping=stopping)
        got.append(len(saved) > before)
    assert got == expected
