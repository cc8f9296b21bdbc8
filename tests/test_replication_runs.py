"""The replication driver (benchmarks/replication/run.py): trains and evaluates, skips finished runs, and
resumes a training from its checkpoint instead of starting it again."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _warm_python import run_python

from benchmarks.replication import plan as planmod
from benchmarks.replication import runspec
from benchmarks.replication.commands import EVAL_ARGS, eval_command
from benchmarks.replication.plan import plan
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.methods.registry import method_names
from hypersolid_scale.training.epoch_records import read_epochs, record_epoch

ROOT = Path(__file__).resolve().parents[1]


def _drive(tmp: Path, *args: str) -> str:
    """run.py --quick on tmp's folders (default: the cpu group, 2 at a time); its stdout."""
    where = ["--out", str(tmp / "out"), "--scratch", str(tmp / "scratch"), "--device", "cpu", "--quick"]
    cmd = [sys.executable, "-m", "benchmarks.replication.run", *where, *(args or ("--group", "cpu", "--parallel", "2"))]
    # A bound for a hang only: one call takes ~60-120 s here, and up to 240 s beside other work on 2 cores.
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("group", ["cpu", "gpu"])
def test_every_planned_run_is_a_valid_config(group: str, tmp_path: Path) -> None:
    runs = plan(group, scale=1.0)
    assert len({r.name for r in runs}) == len(runs)
    distinct = {(r.config, r.overrides, r.curve, r.eval_every_steps): r for r in runs}.values()  # seeds aside
    for run, quick in [(r, False) for r in distinct] + [(r, True) for r in plan(group, quick=True)]:
        cfg = load_config(run.config, [f"run_dir={tmp_path / run.name}", *run.train_overrides("cpu", quick)])
        assert cfg.seed == run.seed and cfg.epochs == run.epochs and cfg.max_steps == (1 if run.random_init else 0)
        assert not cfg.tracking.enabled and cfg.method.name == run.method


def test_gpu_plan_shape() -> None:
    runs = plan("gpu", scale=1.0)
    parts = {p: [r for r in runs if r.part == p] for p in ("curve", "tune", "alpha", "backend", "batch")}
    assert [len(v) for v in parts.values()] == [10, 12, 10, 4, 3]
    assert all(r.curve and r.epochs == 20 for r in parts["curve"])
    assert all("data.eval_split=holdout" in r.overrides for r in parts["tune"])
    assert all(r.epochs == 5 for p in ("tune", "alpha", "backend", "batch") for r in parts[p])
    assert plan("gpu", scale=0.1)[0].epochs == 2 and plan("gpu", scale=0.1)[-1].epochs == 1


def _tune_results(knn: dict[str, float]) -> dict[str, dict]:
    """Tuning results by run name, every seed of a value at ``knn[<value's override>]`` held-out kNN@5."""
    return {
        r.name: {"final": {planmod.TUNE_METRIC: knn[r.overrides[0]]}}
        for r in planmod.tune_runs()
        if r.overrides[0] in knn
    }


def test_cpu_plan_parts_order_and_tuning() -> None:
    runs = plan("cpu", results={})
    parts = {p: [r for r in runs if r.part == p] for p in ("cpu", "steps", "random", "tune", "views", "budget")}
    assert [len(v) for v in parts.values()] == [20, 1, 5, 18, 5, 5]
    # Priority order: the first pass, then the floor, the tuning, 2 views, the extra seeds, the 5-epoch runs;
    # the 20-epoch runs wait for the whole (widened) tuning grid.
    order = [part for part, _ in itertools.groupby(r.part for r in runs)]
    # Amendment 3's parts that need no tuned value come last: the diagnosis of the random inits and the batch arms
    # (short runs first), then the 20-epoch baselines (diagnosed).
    assert order == ["cpu", "steps", "random", "tune", "views", "cpu", "budget", "diag", "batch", "long"]
    assert all(r.diagnose for r in runs if r.part == "long")
    assert [r.name for r in runs if r.part == "diag"] == [f"cpu-diag-random-s{s}" for s in range(5)]
    # The widened grid's values (amendment 2) run after the first grid's, each seed-major.
    first = [(r.method, r.overrides[0]) for r in parts["tune"][:12]]
    assert sorted(set(first)) == sorted(
        (m, f"{planmod.CPU_TUNE[m][0]}={v}") for m, g in planmod.FIRST_TUNE.items() for v in g
    )
    assert [r.overrides[0] for r in parts["tune"][12:15]] == [
        "method.hypersolid.alpha=0.95",
        "method.hypersolid.alpha=0.97",
        "method.simclr.temperature=0.05",
    ]
    assert all(r.random_init and r.seed == i for i, r in enumerate(parts["random"]))
    assert all("data.eval_split=holdout" in r.overrides and r.epochs == 1 for r in parts["tune"])
    assert sorted((r.method, r.overrides[0], r.seed) for r in parts["tune"]) == sorted(
        (m, f"{key}={v}", s) for m, (key, vals) in planmod.CPU_TUNE.items() for v in vals for s in range(2)
    )
    assert all(r.overrides == ("data.num_local_views=0",) and r.method == "hypersolid" for r in parts["views"])
    assert {(r.method, r.seed) for r in parts["cpu"]} == {(m, s) for m in runspec.CONFIGS for s in range(5)}
    # Before the tuning is complete only the paper's alpha is planned at 5 epochs, evaluated after 1, 2, 5.
    assert {r.overrides for r in parts["budget"]} == {("method.hypersolid.alpha=0.9",)}
    assert all(r.epochs == 5 and r.eval_epochs == (1, 2, 5) for r in parts["budget"])
    assert planmod.budget_settings({}) == [("hypersolid", 0.9), ("hypersolid", None), ("simclr", None)]


def test_tuned_values_follow_held_out_knn() -> None:
    knn = {"method.hypersolid.alpha=0.5": 80.0, "method.hypersolid.alpha=0.75": 81.0}
    knn |= {"method.simclr.temperature=0.1": 70.0, "method.simclr.temperature=0.2": 72.0}
    # One value of each method missing: nothing is chosen yet.
    assert planmod.tuned("hypersolid", _tune_results(knn)) is None
    knn |= {"method.hypersolid.alpha=0.9": 79.0, "method.simclr.temperature=0.5": 72.0}
    results = _tune_results(knn)
    # The first grid is complete: the 5-epoch part's values are chosen from it; the widened grid is not yet.
    assert planmod.tuned("hypersolid", results, planmod.FIRST_TUNE["hypersolid"]) == 0.75
    assert planmod.tuned("hypersolid", results) is None and not planmod.long_runs(results)
    knn |= {"method.hypersolid.alpha=0.95": 78.0, "method.hypersolid.alpha=0.97": 77.0}
    knn |= {"method.simclr.temperature=0.05": 73.0}
    results = _tune_results(knn)
    assert planmod.tuned("hypersolid", results) == 0.75
    skipped = {**results, "cpu-tune-hypersolid-alpha0.5-s1": {"final": {}}}  # its kNN@5 was not measured
    assert planmod.tuned("hypersolid", skipped) is None
    assert planmod.tuned("simclr", results, planmod.FIRST_TUNE["simclr"]) == 0.2  # a tie: the first listed value
    assert planmod.tuned("simclr", results) == 0.05  # the widened grid moves it
    # The 20-epoch runs: the tuned values over the widened grid, 3 seeds, evaluated after 1, 2, 5, 10, 20.
    long = [r for r in plan("cpu", results=results) if r.part == "long"]
    assert [(r.name, r.epochs, r.eval_epochs) for r in long[:2]] == [
        ("cpu-long-hypersolid-alpha0.75-s0", 20, (1, 2, 5, 10, 20)),
        ("cpu-long-simclr-temperature0.05-s0", 20, (1, 2, 5, 10, 20)),
    ]
    assert len(long) == 12 and {r.method for r in long[6:]} == {"swav", "barlowtwins"}
    assert all(r.overrides == () and r.eval_epochs == (1, 2, 5, 10, 20) for r in long[6:])  # at their defaults
    # Amendment 3, in order after the 20-epoch runs: the short runs (the random inits' diagnosis, the batch arms),
    # lambda 0 at the tuned alpha, the 20-epoch baselines, the 100-epoch curve; amendment 4 diagnoses the 20-epoch
    # Hypersolid and SimCLR settings at the curve's epoch 20 instead of retraining them (part diag: the floor only).
    order = [part for part, _ in itertools.groupby(r.part for r in plan("cpu", results=results))]
    assert order[-6:] == ["long", "diag", "batch", "l2", "long", "curve100"]
    diag = [r for r in plan("cpu", results=results) if r.part == "diag"]
    assert [r.name for r in diag] == [f"cpu-diag-random-s{s}" for s in range(5)]
    l2 = [r for r in plan("cpu", results=results) if r.part == "l2"]
    assert [r.overrides for r in l2] == [("method.hypersolid.alpha=0.75", "method.hypersolid.norm_weight=0")] * 3
    batch = [r for r in plan("cpu", results=results) if r.part == "batch"]
    # Equal epochs (2 each) and equal steps (~936 updates: 64 x 1 epoch, 256 x 4), 3 seeds.
    arms = {(r.overrides[0], r.epochs) for r in batch}
    assert arms == {(f"data.global_batch_size={b}", e) for b, e in ((64, 2), (128, 2), (256, 2), (64, 1), (256, 4))}
    assert len(batch) == 15 and all(r.overrides[1:] == planmod.BATCH_LR for r in batch)
    curve = [r for r in plan("cpu", results=results) if r.part == "curve100"]
    assert [(r.method, r.epochs, r.eval_epochs, r.diagnose_epochs) for r in curve[:2]] == [
        ("hypersolid", 100, (20, 50, 100), (20,)),
        ("simclr", 100, (20, 50, 100), (20,)),
    ]
    assert [(r.name, r.overrides) for r in curve[:2]] == [
        (r.name.replace("long", "curve100"), r.overrides) for r in long[:2]
    ]
    assert len(curve) == 6
    budget = [r for r in plan("cpu", results=results) if r.part == "budget"]
    assert sorted({r.overrides[0] for r in budget}) == [
        "method.hypersolid.alpha=0.75",
        "method.hypersolid.alpha=0.9",
        "method.simclr.temperature=0.2",
    ]
    assert len(budget) == 15 and [r.seed for r in budget[:3]] == [0, 0, 0]  # seed-major
    # Tuned alpha = the paper's: one Hypersolid setting, not two copies of it.
    knn["method.hypersolid.alpha=0.9"] = 90.0
    assert planmod.budget_settings(_tune_results(knn)) == [("hypersolid", 0.9), ("simclr", 0.2)]


def test_quick_plan_is_one_run_of_two_methods() -> None:
    names = [r.name for r in plan("cpu", quick=True)]
    assert len(names) == 2 and len({n.split("-")[1] for n in names}) == 2  # two methods


def test_runs_train_evaluate_skip_and_resume(tmp_path: Path) -> None:
    """A random-init run evaluates its step-0 weights and nothing else; a run with eval_epochs is evaluated at
    each of those epochs (quick: 2 epochs of 4 steps); --runs picks runs by name, and a run with
    eval_every_steps is evaluated at each such checkpoint (quick: every 2 of its 4 steps, the last at the end of
    its one epoch), the entries labelled with their fraction of the epoch. One invocation for the five, 2 at a
    time. A second invocation runs nothing again. (Each method's checkpoint through the evaluation command:
    the paper-protocol test below.)"""
    one_epoch = "cpu-hypersolid-s0-steps"
    staged = "cpu-curve100-hypersolid-alpha0.9-s0"  # quick: 2 epochs, paused after the first
    runs = f"cpu-random-s0,cpu-budget-hypersolid-alpha0.9-s0,{one_epoch},cpu-diag-random-s0,{staged}"
    drive = lambda: _drive(tmp_path, "--group", "cpu", "--runs", runs, "--parallel", "2")  # noqa: E731
    said = drive()
    out = tmp_path / "out" / "cpu"
    init = json.loads((out / "cpu-random-s0.json").read_text())
    assert init["part"] == "random" and init["final_step"] == 0
    assert [(e["epoch"], e["step"]) for e in init["per_epoch"]] == [(0, 0)]
    ckpts = tmp_path / "scratch" / "cpu" / "cpu-random-s0" / "run" / "checkpoints"
    assert [p.name for p in ckpts.glob("step_*.pt")] == ["step_00000000.pt"]
    assert "random_init.py" in init["command"] and "max_steps=1" in init["command"]
    # Amendment 3's diagnosis of the same initial weights: the HDBSCAN grid on both feature kinds, no protocol.
    diag = json.loads((out / "cpu-diag-random-s0.json").read_text())
    assert diag["per_epoch"] == [] and set(diag["hdbscan_grid"]) == {"backbone", "projector"}
    assert re.search(
        r"done cpu-diag-random-s0: .*, 0 evaluation\(s\), no kNN metric, the HDBSCAN diagnosis of "
        r"its (backbone and projector|projector and backbone) features\n",
        said,
    ), said
    rows = diag["hdbscan_grid"]["projector"]["rows"]
    assert diag["hdbscan_grid"]["backbone"]["step"] == 0 and {r["norm"] for r in rows} == {"raw", "centred"}
    # The staged run paused after epoch 1 (SIGTERM at its checkpoint), was evaluated there, then trained to the end
    # after the other runs: one entry per evaluated epoch, its training time summed over both attempts.
    curve = json.loads((out / f"{staged}.json").read_text())
    assert curve["complete"] and [(e["epoch"], e["step"]) for e in curve["per_epoch"]] == [(1, 4), (2, 8)]
    state = json.loads((tmp_path / "scratch" / "cpu" / "state.json").read_text())["runs"]
    assert state[staged]["trained_to_epoch"] == 1 and state[staged]["train"] == "done"
    assert curve["train_s_attempts"] > curve["train_s_total"] and curve["final_step"] == 8
    assert curve["resumed_from_step"] >= 4  # the second stage from the checkpoint the pause's SIGTERM left
    # Both attempts at the driver's thread count, recorded once (a CPU run's weights depend on it).
    assert curve["threads"] == [os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // 2))]
    # Amendment 4: its diagnosed epoch (quick: the first, where it paused) has the HDBSCAN grid of both kinds.
    assert {k: v["step"] for k, v in curve["hdbscan_grid"].items()} == {"backbone": 4, "projector": 4}
    # (A training resumed after a kill, its seconds and epoch statistics summed over the attempts: the study
    # engine's, tested once, by test_compare's stopped comparison.)
    assert all(0 <= r["noise_fraction"] <= 1 and sum(r["sizes"]) + r["sizes_rest"] <= r["n"] for r in rows)
    budget = json.loads((out / "cpu-budget-hypersolid-alpha0.9-s0.json").read_text())
    assert [(e["epoch"], e["step"]) for e in budget["per_epoch"]] == [(1, 4), (2, 8)]
    # The training's own epoch means (epochs.jsonl) beside each evaluation and for every epoch.
    assert [(t["epoch"], t["steps"]) for t in budget["train_per_epoch"]] == [(1, 4), (2, 4)]
    assert all(0 < e["train.alignment"] < 2 and 0 <= e["train.active_fraction"] <= 1 for e in budget["per_epoch"])
    assert init["final"]["knn_k20_weighted"] != budget["final"]["knn_k20_weighted"]
    first = json.loads((out / f"{one_epoch}.json").read_text())
    assert first["part"] == "steps" and [(e["epoch"], e["step"]) for e in first["per_epoch"]] == [(0.5, 2), (1.0, 4)]
    assert all(0 <= e["knn_k20_weighted"] <= 100 for e in first["per_epoch"])
    assert sorted(p.stem for p in out.glob("[!_]*.json")) == sorted(runs.split(","))  # only the runs named
    assert first["final_step"] == 4 and first["resumed_from_step"] is None  # 128 images / 32 = 4 steps
    assert first["final"] == first["per_epoch"][-1] and first["card"] == "cpu" and first["wall_s"] > 0
    assert first["train_s_attempts"] == first["train_s_total"]  # one attempt
    assert json.loads((out / "_skipped.json").read_text())["skipped"] == []

    # Second invocation: every result exists, nothing runs again.
    names = runs.split(",")
    stamps = {n: (out / f"{n}.json").stat().st_mtime_ns for n in names}
    home = tmp_path / "scratch" / "cpu" / one_epoch
    log = home / "train.log"
    log_stamp = log.stat().st_mtime_ns
    text = drive()
    assert all(f"skip {n}: result exists" in text for n in names)
    assert stamps == {n: (out / f"{n}.json").stat().st_mtime_ns for n in names}
    assert log.stat().st_mtime_ns == log_stamp


def test_budget_skips_what_cannot_finish_and_says_so(tmp_path: Path) -> None:
    _drive(tmp_path, "--group", "gpu", "--budget-s", "5")
    skipped = json.loads((tmp_path / "out" / "gpu" / "_skipped.json").read_text())["skipped"]
    assert sorted(s["run"] for s in skipped) == sorted(r.name for r in plan("gpu", quick=True))
    assert all(s["reason"].startswith("budget") for s in skipped)
    assert not list((tmp_path / "out" / "gpu").glob("[!_]*.json")) and not (tmp_path / "scratch").exists()


def test_an_unknown_run_name_is_refused() -> None:
    where = ["--out", "/nonexistent/out", "--scratch", "/nonexistent/scratch", "--quick"]
    bad = subprocess.run(
        [sys.executable, "-m", "benchmarks.replication.run", "--group", "cpu", *where, "--runs", "cpu-x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "--runs: no run cpu-x in the cpu group" in bad.stderr


@pytest.mark.parametrize("method", method_names())
def test_the_drivers_paper_protocol_evaluates_every_methods_checkpoint(method: str, tmp_path: Path) -> None:
    """The evaluation command run.py gives a checkpoint (eval_command with EVAL_ARGS, the paper's protocol),
    on a 2-step checkpoint of each registered method: exit 0, the backbone's kNN@5 and the projector half (the
    method's own projection head) measured. A baseline's checkpoint once stopped this command with exit code 2
    (it asked for Hypersolid's projector), which the driver's quick mode (kNN only) never ran."""
    config = runspec.CONFIGS.get(method, f"configs/baselines/{method}_quickstart.yaml")
    quick = [*runspec.QUICK, *runspec.QUICK_HEADS.get(method, ())]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    train = ["launch/train.py", "--config", config, f"run_dir={tmp_path / 'run'}", *runspec.COMMON, "max_steps=2"]
    trained = run_python([*train, *quick], env=env, cwd=ROOT)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002.pt"
    cmd = eval_command(sys.executable, ckpt, tmp_path / "eval", "cpu", EVAL_ARGS, quick=True)
    assert cmd[1] == "launch/eval.py" and "--protocol" in cmd
    done = run_python(cmd[1:], env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert 0 <= report["metrics"]["protocol.backbone.raw.knn_k5_majority"] <= 100
    assert not [s for s in report.get("skipped", []) if "protocol.projector" in str(s)], report.get("skipped")
    assert 0 <= report["metrics"]["protocol.projector.raw.knn_k5_majority"] <= 100
    assert 0 <= report["metrics"]["protocol.exclusion.same_class_frac"] <= 1


def test_epoch_records_combine_a_resumed_epoch_and_skip_a_torn_line(tmp_path: Path) -> None:
    """epochs.jsonl: an epoch stopped at step 3 and resumed to step 8 is one epoch, its means weighted by steps;
    a run resumed from an earlier checkpoint repeats steps, and the later record of those steps wins; a line cut
    by a crash is skipped."""
    path = tmp_path / "epochs.jsonl"
    record_epoch(path, 0, 4, 4, {"loss": 1.0})
    record_epoch(path, 1, 7, 3, {"loss": 2.0})  # epoch 2, steps 5-7, then stopped
    record_epoch(path, 1, 8, 1, {"loss": 6.0})  # resumed: step 8
    record_epoch(path, 2, 12, 4, {"loss": 9.0})  # epoch 3 ...
    record_epoch(path, 2, 12, 4, {"loss": 5.0})  # ... repeated from the epoch-2 checkpoint: this one counts
    with path.open("a") as f:
        f.write('{"epoch": 4, "step": 16, "ste')
    got = read_epochs(path)
    assert sorted(got) == [1, 2, 3]
    assert (got[2]["steps"], got[2]["step"], got[2]["loss"]) == (4, 8, pytest.approx((3 * 2.0 + 6.0) / 4))
    assert (got[3]["steps"], got[3]["loss"]) == (4, 5.0)
    assert read_epochs(tmp_path / "missing.jsonl") == {}


def test_the_driver_deletes_the_checkpoints_that_nothing_will_read(tmp_path: Path) -> None:
    """A 100-epoch run checkpoints every 100 steps and keeps them (checkpoint.keep_last=0); while it trains, the
    driver deletes all but its evaluated epochs' ends (20, 50, 100), its pause's and the newest two. A run evaluated
    every N steps keeps every one."""
    from benchmarks.replication.run import engine, parse_args
    from hypersolid_scale.study.engine import Task

    eng = engine(parse_args(["--group", "cpu", "--quick", "--scratch", str(tmp_path), "--out", str(tmp_path)]))
    runs = {r.part: r for r in plan("cpu")}
    per_epoch, steps = 10, [*range(100, 601, 100), 200, 500, 610]  # 10 steps an epoch: epoch 20 is step 200
    for run in (runs["curve100"], runs["steps"]):
        ckpts = eng.study.run_dir(run) / "checkpoints"
        ckpts.mkdir(parents=True)
        eng.study.train_log(run).write_text(f"[hypersolid] {per_epoch} steps/epoch, ...\n")
        for step in steps:
            (ckpts / f"step_{step:08d}.pt").write_bytes(b"")
        eng.active[object()] = Task(run, "train", [], eng.study.train_log(run))  # type: ignore[index]
    assert runs["curve100"].eval_epochs == (20, 50, 100) and runs["curve100"].pause_epochs == (50,)
    eng.every_tick()
    left = lambda run: sorted(int(p.stem[5:]) for p in (eng.study.run_dir(run) / "checkpoints").glob("*.pt"))  # noqa: E731
    assert left(runs["curve100"]) == [200, 500, 600, 610]  # epochs 20 and 50, the newest two (600, 610)
    assert runs["steps"].eval_every_steps and left(runs["steps"]) == sorted(set(steps))


def test_a_restarted_study_takes_every_run_to_a_stage_before_any_goes_on(tmp_path: Path) -> None:
    """The 100-epoch runs pause at 50: started again with one of them paused there (its state's trained_to_epoch),
    the driver queues the runs that have not reached 50 first, in plan order, and that one's second stage last."""
    from benchmarks.replication.run import engine, parse_args

    eng = engine(parse_args(["--group", "cpu", "--scratch", str(tmp_path), "--out", str(tmp_path / "out")]))
    curve = [r for r in plan("cpu") if r.part == "curve100"]
    assert [r.pause_epochs for r in curve] == [(50,)] * 6
    eng.state.run(curve[1].name)["trained_to_epoch"] = 50  # SimCLR seed 0, second in the plan, paused at 50
    eng.queue_plan(curve)
    assert [t.run.name for t in eng.trains] == [r.name for r in (curve[0], *curve[2:], curve[1])]
    assert [t.pause_epoch for t in eng.trains] == [50] * 5 + [0]  # the last goes on to 100


@pytest.mark.skipif(not Path("/proc/self/autogroup").exists(), reason="no autogroup scheduling on this kernel")
def test_a_niced_study_runs_in_a_session_whose_autogroup_is_niced_too(tmp_path: Path) -> None:
    """cpu.sh with HS_NICE=1: nice 19 inside a session of its own whose autogroup has nice 19, so that it yields
    the CPU to work started in other sessions (with autogroups the scheduler shares the CPU between sessions
    first: a process niced in its own session took half of the 2 cores from the test suite); the caller's own
    autogroup is left as it was. The study's python is a script that records where it runs."""
    record = tmp_path / "where.txt"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\n{{ cat /proc/self/autogroup; ps -o ni= -o sid= -p $$; }} > {record}\n")
    fake.chmod(0o755)
    # "/autogroup-<n> nice <k>", or nothing in the kernel's default autogroup (a process whose ancestors never
    # started a session, e.g. a container's first process and what it starts)
    mine = Path("/proc/self/autogroup").read_text()
    env = {**os.environ, "HS_NICE": "1", "PYTHON": str(fake), "HS_REPLICATION_SCRATCH": str(tmp_path / "scratch")}
    done = subprocess.run(["bash", "benchmarks/replication/cpu.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and "cpu group started" in done.stdout, done.stdout + done.stderr
    pid = int((tmp_path / "scratch" / "cpu.pid").read_text())
    for _ in range(100):  # until the fake python has written its record
        if record.exists() and len(record.read_text().splitlines()) == 2:
            break
        time.sleep(0.05)
    autogroup, ps = record.read_text().splitlines()
    nice, sid = ps.split()
    assert autogroup.endswith(" nice 19") and nice == "19", (autogroup, ps)
    assert int(sid) == pid != os.getsid(0)  # its own session: the pid file names the session's leader
    assert Path("/proc/self/autogroup").read_text() == mine and autogroup.split()[:1] != mine.split()[:1]


def test_the_study_s_checkpoints_default_to_a_folder_git_ignores_and_a_reboot_keeps(tmp_path: Path) -> None:
    """The run folders (the checkpoints a 20- or 100-epoch run resumes from, over several sittings) default to
    runs/replication_scratch in the checkout, for run.py and cpu.sh alike: not under /tmp, which many systems
    clear at boot, and ignored by git. cpu.sh is run from a copy of the checkout's layout with a stand-in python
    that records its arguments."""
    from benchmarks.replication.run import parse_args

    scratch = Path(parse_args(["--group", "cpu"]).scratch)
    assert scratch == ROOT / "runs" / "replication_scratch"
    step = scratch / "cpu" / "cpu-long-x-s0" / "run" / "checkpoints" / "step_00000001.pt"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(step)], cwd=ROOT)
    assert ignored.returncode == 0, f"{step} is not ignored by git"
    copy = tmp_path / "checkout" / "benchmarks" / "replication"
    copy.mkdir(parents=True)
    (copy / "cpu.sh").write_text((ROOT / "benchmarks" / "replication" / "cpu.sh").read_text())
    record, fake = tmp_path / "argv.txt", tmp_path / "python"
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {record}\n')
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("HS_REPLICATION_SCRATCH", "HS_NICE")}
    done = subprocess.run(["bash", str(copy / "cpu.sh")], env={**env, "PYTHON": str(fake)}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stdout + done.stderr
    for _ in range(100):  # until the stand-in has written its record
        if record.exists() and "--scratch" in record.read_text():
            break
        time.sleep(0.05)
    argv = record.read_text().splitlines()
    assert argv[argv.index("--scratch") + 1] == str(tmp_path / "checkout" / "runs" / "replication_scratch")
