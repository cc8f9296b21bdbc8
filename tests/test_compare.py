"""launch/compare.py: every method trained at one budget, evaluated alike, summarised over seeds.

The table and figures are checked against numbers recomputed here from the per-run reports; the end-to-end
runs use the real trainer, evaluation and MLflow store (``--quick``), a failing training, and a resume.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from _errors import assert_one_error_line
from _warm_python import run_python

from hypersolid_scale.compare import figures, table
from hypersolid_scale.compare.plan import Training, check_budget, parse_methods, plan, roles, setting_config
from hypersolid_scale.methods import method_names
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.safety.run_lock import acquire_run_lock
from hypersolid_scale.training.epoch_records import read_epochs

REPO = Path(__file__).resolve().parents[1]
METHODS = method_names()
CONFIGS = REPO / "configs"


def _compare(*args: str, timeout: int = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "launch" / "compare.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


# -- plan -------------------------------------------------------------------------------------------------

def test_methods_are_parsed_in_a_fixed_order_and_unknown_ones_refused():
    assert parse_methods("all") == list(METHODS)
    assert parse_methods("swav, hypersolid,swav") == ["hypersolid", "swav"]
    with pytest.raises(ConfigError, match="unknown mocov3.*choose from"):
        parse_methods("simclr,mocov3")


def test_plan_gives_the_multi_seed_methods_their_seeds():
    got = plan(CONFIGS, "quickstart", ["hypersolid", "simclr", "byol"], seeds=3, baseline_seeds=2, overrides=["a=1"])
    assert [(t.method, t.seed) for t in got] == [("hypersolid", 0), ("hypersolid", 1), ("hypersolid", 2),
                                                 ("simclr", 0), ("simclr", 1), ("simclr", 2), ("byol", 0), ("byol", 1)]
    assert got[0].config == CONFIGS / "quickstart.yaml"
    assert got[-1].config == CONFIGS / "baselines" / "byol_quickstart.yaml" and got[-1].overrides == ("a=1",)
    with pytest.raises(ConfigError, match=">= 1 seed"):
        plan(CONFIGS, "quickstart", ["simclr"], seeds=0, baseline_seeds=1, overrides=[])
    # The comparison chooses its subject and references: BYOL studied against DINO, SimCLR a baseline then.
    full = roles("byol", "dino")
    assert full == {"byol", "dino"} and roles("hypersolid", "") == {"hypersolid"}
    got = plan(CONFIGS, "quickstart", ["simclr", "byol"], seeds=2, baseline_seeds=1, overrides=[], full=full)
    assert [(t.method, t.seed) for t in got] == [("simclr", 0), ("byol", 0), ("byol", 1)]
    with pytest.raises(ConfigError, match="--subject/--references: mocov3 is not a method; choose from"):
        roles("hypersolid", "simclr,mocov3")


def test_a_missing_setting_names_the_ones_that_exist(tmp_path):
    (tmp_path / "baselines").mkdir()
    (tmp_path / "tiny.yaml").write_text("seed: 1\n")
    (tmp_path / "baselines" / "simclr_huge.yaml").write_text("method:\n  name: simclr\n")
    with pytest.raises(ConfigError, match=r"no setting 'huge' for byol: neither .*huge.yaml nor .*byol_huge.yaml "
                                          r"exists; the settings are tiny"):
        setting_config(tmp_path, "huge", "byol")
    # a setting of the baselines' files only (e.g. cifar10_lars) keeps working for them
    assert setting_config(tmp_path, "huge", "simclr") == (tmp_path / "baselines" / "simclr_huge.yaml", ())


def test_a_method_without_a_config_of_its_own_trains_on_the_setting_s_config(tmp_path):
    """Its defaults on the setting's config; only the two global views for a method that uses no others."""
    (tmp_path / "baselines").mkdir()
    setting = tmp_path / "quickstart.yaml"
    setting.write_text((CONFIGS / "quickstart.yaml").read_text())
    (tmp_path / "baselines" / "byol_quickstart.yaml").write_text("method:\n  name: byol\n")
    assert setting_config(tmp_path, "quickstart", "hypersolid") == (setting, ())
    assert setting_config(tmp_path, "quickstart", "byol") == (tmp_path / "baselines" / "byol_quickstart.yaml", ())
    two_views = ("method.name=simclr", "data.num_local_views=0")
    assert setting_config(tmp_path, "quickstart", "simclr") == (setting, two_views)
    assert setting_config(tmp_path, "quickstart", "dino") == (setting, ("method.name=dino",))
    got = plan(tmp_path, "quickstart", ["hypersolid", "dino"], 1, 1, ["a=1"])
    assert [(t.method, t.config, t.overrides) for t in got] == [
        ("hypersolid", setting, ("a=1",)), ("dino", setting, ("method.name=dino", "a=1"))]
    budget = check_budget(plan(tmp_path, "quickstart", ["hypersolid", "simclr", "dino"], 1, 1, []), steps=5, nproc=2,
                          out_dir=tmp_path)
    assert budget.views == {"hypersolid": 6, "simclr": 2, "dino": 6}


def test_the_budget_is_images_seen_and_needs_one_global_batch(tmp_path):
    trainings = plan(CONFIGS, "quickstart", ["hypersolid", "dino", "simclr"], 1, 1, [])
    budget = check_budget(trainings, steps=50, nproc=2, out_dir=tmp_path)
    assert (budget.global_batch, budget.images_seen) == (128, 6400)
    assert budget.views == {"hypersolid": 6, "dino": 6, "simclr": 2}
    odd = Training("simclr", 0, CONFIGS / "baselines" / "simclr_quickstart.yaml", ("data.batch_size_per_gpu=32",))
    with pytest.raises(ConfigError, match=r"global batches differ \(hypersolid 128, simclr 64\)"):
        check_budget([trainings[0], odd], steps=50, nproc=2, out_dir=tmp_path)
    with pytest.raises(ConfigError, match="not simclr"):  # a config that trains another method than its name
        check_budget([Training("simclr", 0, CONFIGS / "quickstart.yaml")], steps=5, nproc=1, out_dir=tmp_path)
    with pytest.raises(ConfigError, match="no_such_key"):  # a bad override fails before anything trains
        check_budget([Training("simclr", 0, odd.config, ("no_such_key=1",))], steps=5, nproc=1, out_dir=tmp_path)


# -- table and figures ------------------------------------------------------------------------------------

def _report(knn: float, nmi: list[float | None], skip_hdbscan: bool = False) -> dict:
    metrics = {"knn_k20_weighted": knn, "linear_top1": knn + 1, "kmeans_nmi": 0.5, "anisotropy": 0.9}
    skipped = {}
    if skip_hdbscan:
        skipped["hdbscan"] = "too few points"
    else:
        metrics["hdbscan_nmi"] = 0.3
    sweep = [{"eps": 0.005 * i, "nmi": v, "ari": 0.0} for i, v in enumerate(nmi)]
    return {"metrics": metrics, "skipped": skipped, "dbscan": sweep}


def test_the_table_is_mean_and_sample_std_over_seeds_with_skips_explained():
    reports = {"hypersolid": [_report(80.0, [0.1, 0.5, 0.3]), _report(83.0, [0.3, 0.2, None]),
                              _report(86.5, [0.2, 0.2, 0.1])],
               "simclr": [_report(90.0, [0.4, 0.1], skip_hdbscan=True)]}
    summary = table.summarise(reports)
    hs = summary["hypersolid"]["knn_k20_weighted"]
    assert hs.mean == pytest.approx((80.0 + 83.0 + 86.5) / 3)
    assert hs.std == pytest.approx(statistics.stdev([80.0, 83.0, 86.5]))
    assert summary["simclr"]["knn_k20_weighted"].std is None  # one seed: no spread to report
    assert "hdbscan_nmi" not in summary["simclr"] and "hdbscan_nmi" in summary["hypersolid"]
    skipped = table.skipped_reasons(reports)
    assert skipped["simclr"]["hdbscan_nmi"] == "too few points"
    md = table.markdown(summary, {"hypersolid": {"seeds": 3, "train_s": [10.0, 12.0, 14.0]}}, skipped)
    hs_row = [line for line in md.splitlines() if line.startswith("| hypersolid")][-1]  # the metrics table
    assert f"{hs.mean:.2f} ± {hs.std:.2f}" in hs_row and "12 ± 2" in md
    simclr_row = [line for line in md.splitlines() if line.startswith("| simclr")][-1]
    assert "**90.00**" in simclr_row and "skipped" in simclr_row  # the best kNN in bold; HDBSCAN skipped
    assert "simclr, hdbscan_nmi: skipped (too few points)" in md
    # DBSCAN curves over the radii every seed computed; the mean and std of the NMI per radius.
    eps, mean, std = figures.dbscan_curves(reports)["hypersolid"]
    assert list(eps) == [0.0, 0.005]
    assert list(mean) == pytest.approx([0.2, 0.3]) and std[0] == pytest.approx(statistics.stdev([0.1, 0.3, 0.2]))


def test_the_figures_are_written(tmp_path):
    reports = {"hypersolid": [_report(80.0, [0.0, 0.4, 0.1, 0.0, 0.0]), _report(82.0, [0.0, 0.3, 0.2, 0.0, 0.0])],
               "byol": [_report(70.0, [0.0, 0.2, 0.0, 0.0, 0.0])]}
    summary = table.summarise(reports)
    for path in (figures.plot_dbscan(reports, tmp_path / "d.png", "t"), figures.plot_bars(summary, tmp_path / "b.png", "t")):
        assert path is not None and path.stat().st_size > 5000 and path.read_bytes()[:4] == b"\x89PNG"
    assert figures.plot_dbscan({"byol": [{"metrics": {}, "dbscan": []}]}, tmp_path / "none.png", "t") is None


# -- the command ------------------------------------------------------------------------------------------

def test_bad_input_is_one_error_line(tmp_path):
    def _compare(*args: str) -> subprocess.CompletedProcess:  # nothing trains: forked with the package imported
        return run_python([REPO / "launch" / "compare.py", *args], env={**os.environ, "OMP_NUM_THREADS": "1"},
                          cwd=REPO)

    assert_one_error_line(_compare("--methods", "simclr,moco", "--out", str(tmp_path / "a")), "moco", "choose from")
    assert_one_error_line(_compare("--setting", "mnist", "--methods", "simclr", "--out", str(tmp_path / "b")),
                          "no setting 'mnist' for simclr", "quickstart")
    assert_one_error_line(_compare("--methods", "simclr", "--out", str(tmp_path / "c"), "optim.lr=fast"), "optim.lr")
    lock = acquire_run_lock(tmp_path / "held")
    try:
        assert_one_error_line(_compare("--quick", "--methods", "simclr", "--out", str(tmp_path / "held")),
                              "in use by another comparison", "pid=")
    finally:
        lock.release()


@pytest.mark.slow
def test_quick_comparison_stopped_by_sigterm_resumed_end_to_end_then_a_failing_training_named(tmp_path):
    # Two methods, not --quick's seven: every method trains through the one training step and is evaluated by
    # the one evaluation (each baseline's training is tested in test_baselines_train.py); what this test adds
    # is the comparison around them. One seed each (the mean and std over seeds: the table's own test above);
    # BYOL's is the evaluation the third start redoes. One process per training (python launch/train.py, no
    # torchrun) in the first two starts; the third runs its one training on 2 processes (torchrun). The evaluations on 300 images per
    # split (--quick alone would take 1000). Three starts of one comparison: the first is stopped by SIGTERM a
    # few steps into its first training, the second resumes that training from the checkpoint saved at the
    # stop and finishes, the third adds a method whose training fails (its config names a missing image
    # folder): that failure is named, and the comparison still redoes the one removed evaluation (of a method
    # after it in the order) and writes the table of the others.
    import re
    import signal
    import time

    out = tmp_path / "cmp"
    methods = ["hypersolid", "byol"]
    steps, batch = 16, 32  # long enough to be stopped a few steps in, well before the end
    # A global batch of 32 (the configs' 128 would take 4x each step's time on one process).
    quick = ["--quick", "--methods", ",".join(methods), "--seeds", "1", "--nproc", "1", "--eval-samples", "300",
             "--out", str(out), "--steps", str(steps), f"data.global_batch_size={batch}"]
    proc = subprocess.Popen([sys.executable, str(REPO / "launch" / "compare.py"), *quick], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = out / "logs" / "hypersolid-seed0.train.log"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:  # until the first training is a few steps in
        done = [int(n) for n in re.findall(rf"(\d+)/{steps} \[", log.read_text(errors="replace"))] if log.exists() else []
        if done and max(done) >= 3:
            break
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode == 130, output[-3000:]
    stopped = sorted((out / "runs" / "hypersolid-seed0" / "checkpoints").glob("step_*.pt"))
    assert stopped and stopped[-1].name < f"step_{steps:08d}.pt", stopped  # the trainer saved where it stopped
    killed = json.loads((out / "state.json").read_text())

    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{out}/mlflow.db")
    assert client.get_run(killed["parent_run_id"]).info.status == "KILLED"

    proc = _compare(*quick)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"resumed from {stopped[-1]}" in log.read_text()
    # The study engine's record of the resumed training: where it resumed, its seconds over both attempts; the
    # trainer's epoch statistics are the stopped part's and the resumed part's, one epoch of all the steps.
    resumed = json.loads((out / "state.json").read_text())["runs"]["hypersolid-seed0"]
    assert resumed["resumed_from_step"] == int(stopped[-1].stem[5:]) and resumed["final_step"] == steps
    assert resumed["train_s"] > resumed["last_attempt_s"] > 0
    epochs = read_epochs(out / "runs" / "hypersolid-seed0" / "epochs.jsonl")
    assert list(epochs) == [1] and epochs[1]["steps"] == steps and epochs[1]["step"] == steps
    got = json.loads((out / "compare.json").read_text())["methods"]
    assert list(got) == methods
    state = json.loads((out / "state.json").read_text())
    for method, row in got.items():
        seeds = 1
        assert row["seeds"] == seeds and row["images_seen"] == steps * batch and len(row["train_s"]) == seeds
        for _label, key, _spec in table.METRICS:  # every column computed (or skipped with its reason)
            assert key in row["metrics"] or key in json.loads((out / "compare.json").read_text())["skipped"].get(
                method, {}), (method, key)
        # The table's numbers are those of the evaluation reports.
        knn = [json.loads((out / "eval" / f"{method}-seed{s}" / "report.json").read_text())["metrics"]
               ["knn_k20_weighted"] for s in range(seeds)]
        assert row["metrics"]["knn_k20_weighted"]["values"] == knn
        result = json.loads((out / "results" / f"{method}-seed0.json").read_text())  # the engine's result per run
        assert result["metrics"]["knn_k20_weighted"] == knn[0] and result["train_s"] == state["runs"][
            f"{method}-seed0"]["train_s"] and "launch/train.py" in result["command"]
        assert (row["metrics"]["knn_k20_weighted"]["std"] is None) == (seeds == 1)
        for s in range(seeds):
            assert (out / "runs" / f"{method}-seed{s}" / "checkpoints" / f"step_{steps:08d}.pt").exists()
    for png in ("dbscan_nmi_vs_eps.png", "metrics.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    md = (out / "compare.md").read_text()
    assert f"{steps * batch} images seen per training" in md and md.count("| hypersolid |") == 2

    runs = client.search_runs([client.get_experiment_by_name("compare").experiment_id])
    assert state["parent_run_id"] == killed["parent_run_id"]  # the stopped comparison's run, finished
    parent = [r for r in runs if r.info.run_id == state["parent_run_id"]]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == state["parent_run_id"]]
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert parent[0].data.metrics["hypersolid.knn_k20_weighted_mean"] == pytest.approx(
        got["hypersolid"]["metrics"]["knn_k20_weighted"]["mean"])
    assert {a.path for a in client.list_artifacts(state["parent_run_id"])} >= {
        "compare.md", "compare.json", "dbscan_nmi_vs_eps.png", "metrics.png"}
    assert sorted(r.info.run_name for r in children) == sorted(
        f"{m}-seed0" for m in methods)
    assert all("eval/knn_k20_weighted" in r.data.metrics and "train/loss" in r.data.metrics for r in children)

    # Again on the same directory, with one evaluation removed and a third method (VICReg, before BYOL in the
    # order) whose config loads but has no data at run time: its training exits 2 with its one error line, on 2
    # processes. Only the removed evaluation and that training run; the failure is named and ends the exit 1.
    (out / "eval" / "byol-seed0" / "report.json").unlink()
    configs = tmp_path / "configs"
    (configs / "baselines").mkdir(parents=True)
    (configs / "quickstart.yaml").write_text((CONFIGS / "quickstart.yaml").read_text())
    (configs / "baselines" / "byol_quickstart.yaml").write_text(
        (CONFIGS / "baselines" / "byol_quickstart.yaml").read_text())
    (configs / "baselines" / "vicreg_quickstart.yaml").write_text(
        (CONFIGS / "baselines" / "vicreg_quickstart.yaml").read_text().replace(
            "format: builtin", "format: imagefolder\n  path: /nonexistent/images"))
    third = list(quick)
    del third[third.index("--nproc"):third.index("--nproc") + 2]
    third[third.index("--methods") + 1] = "hypersolid,byol,vicreg"
    again = _compare(*third, "--nproc", "2", "--configs", str(configs))
    assert again.returncode == 1, again.stdout[-3000:] + again.stderr[-3000:]
    # torchrun exits 1 when a worker exits 2; the worker's own error line is what the user reads.
    assert "FAILED vicreg-seed0: training failed (exit 1): error: image folder '/nonexistent/images' does " \
           "not exist" in again.stdout, again.stdout[-3000:]
    assert "--nproc_per_node=2" in (out / "logs" / "vicreg-seed0.train.log").read_text()
    after = json.loads((out / "state.json").read_text())
    assert after["parent_run_id"] == state["parent_run_id"]
    assert after["runs"]["vicreg-seed0"]["train"] == "failed (exit 1)"
    assert "evals" not in after["runs"]["vicreg-seed0"]  # not evaluated after its training failed
    for name, rec in state["runs"].items():
        assert after["runs"][name]["train_s"] == rec["train_s"], name  # no training ran again
        assert (after["runs"][name]["eval_s"] != rec["eval_s"]) == (name == "byol-seed0"), name
    table_after = json.loads((out / "compare.json").read_text())["methods"]
    assert list(table_after) == methods  # the failed method has no row; the others keep theirs
    assert table_after["byol"]["metrics"]["knn_k20_weighted"]["values"] == got["byol"]["metrics"][
        "knn_k20_weighted"]["values"]  # the same checkpoint, the same kNN
    assert client.get_run(state["parent_run_id"]).info.status == "FAILED"
