"""launch/eval.py end to end on a tiny checkpoint + digits, its errors, and sharded/cached extraction."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from _eval_helpers import FAST_EVAL, TINY_MODEL, make_checkpoint, run_launch_eval
from _net import free_port, spawn

from hypersolid_scale.checkpoint import initial_weights
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data import build_eval_datasets
from hypersolid_scale.eval.app import main
from hypersolid_scale.eval.embed import cached_embeddings, extract_embeddings
from hypersolid_scale.methods import build_method_model
from hypersolid_scale.safety.errors import CheckpointError, ConfigError

# ---------------------------------------------------------------------------------------------- errors


# A missing, truncated or foreign checkpoint file: tests/test_errors_eval.py, through launch/eval.py.


def test_checkpoint_of_another_architecture_is_a_clear_error(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path, model_overrides=["model.small_cnn.width=16"])
    with pytest.raises(CheckpointError, match="(?i)arch") as err:
        main(["--checkpoint", str(path), "--no-mlflow"])
    assert str(path) in str(err.value)
    path = make_checkpoint(tmp_path / "r50", ["model.arch=resnet18"])
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"] = initial_weights(load_config(None, TINY_MODEL))[0]  # small_cnn weights
    torch.save(ckpt, path)
    with pytest.raises(CheckpointError, match="resnet18") as err:
        main(["--checkpoint", str(path), "--no-mlflow"])
    assert str(path) in str(err.value)


def test_model_overrides_and_channel_mismatch_are_refused(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="not allowed"):
        main(["--checkpoint", str(path), "--no-mlflow", "model.arch=resnet50"])
    with pytest.raises(ConfigError, match="eval.suites"):
        main(["--checkpoint", str(path), "--no-mlflow", "--suite", "knn,tsne"])
    rgb = make_checkpoint(tmp_path / "rgb", ["model.in_channels=3"])
    with pytest.raises(ConfigError, match="1-channel images"):
        main(["--checkpoint", str(rgb), "--no-mlflow"])


# ---------------------------------------------------------------------------------------------- end to end


def test_eval_main_quick_without_mlflow(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path)
    out = tmp_path / "report"
    assert main(["--checkpoint", str(path), "--suite", "knn,geometry", "--no-mlflow", "--output-dir", str(out),
                 *FAST_EVAL]) == 0
    report = json.loads((out / "report.json").read_text())
    assert set(report["timings_s"]) == {"embed", "knn", "geometry"} and "mlflow_run_id" not in report["meta"]
    assert {"knn_k20_weighted", "embedding_rank", "interp_gap", "selectivity_21plus"} <= set(report["metrics"])
    assert not (tmp_path / "mlflow.db").exists() and (tmp_path / "eval_cache").is_dir()


@pytest.mark.slow
def test_eval_main_end_to_end_logs_to_the_training_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from mlflow import MlflowClient

    from hypersolid_scale.tracking import TrackingConfig, make_tracker

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    # The training is still running while its checkpoint is evaluated: the evaluation must not end its run.
    train_run = make_tracker(TrackingConfig(tracking_uri=uri, experiment="eval-test"), tmp_path / "run", rank=0)
    train_run.flush()
    path = make_checkpoint(tmp_path / "run", mlflow_run_id=train_run.run_id, tracking_uri=uri)
    assert main(["--checkpoint", str(path), *FAST_EVAL]) == 0
    printed = capsys.readouterr().out
    assert "knn" in printed.lower() and "d'" in printed and "(extracted)" in printed

    out = tmp_path / "run" / "eval" / "step_00000007"
    report = json.loads((out / "report.json").read_text())
    m = report["metrics"]
    assert report["meta"]["n_train"] == 1437 and report["meta"]["n_test"] == 360
    assert report["meta"]["feature_dim"] == 32 and report["meta"]["mlflow_run_id"] == train_run.run_id
    # a random CNN on digits is far above chance (10 %) and below perfect
    assert 30 < m["knn_k5_majority"] < 100 and 30 < m["linear_top1"] < 100
    assert 0 <= m["kmeans_nmi"] <= 1 and 0 <= m["anisotropy"] <= 1 and m["d_prime"] > 0
    assert [r["eps"] for r in report["dbscan"]] == [0.0, 0.01, 0.05, 0.2]
    for name in ("similarity_density", "centroid_cosine", "dbscan_eps", "interpolation_profile"):
        assert (out / f"{name}.png").stat().st_size > 1000
    assert "| geometry | d' |" in (out / "report.md").read_text()

    logged = MlflowClient(uri).get_run(train_run.run_id).data.metrics
    assert logged["eval/knn_k5_majority"] == pytest.approx(m["knn_k5_majority"])
    assert "eval/dbscan_nmi_vs_eps" in logged
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(train_run.run_id, "eval/step_00000007")}
    assert "eval/step_00000007/report.json" in artifacts and "eval/step_00000007/dbscan_eps.png" in artifacts
    assert MlflowClient(uri).get_run(train_run.run_id).info.status == "RUNNING"
    train_run.close()
    assert MlflowClient(uri).get_run(train_run.run_id).info.status == "FINISHED"

    # second evaluation: features come from the cache, numbers are identical; projector features differ
    assert main(["--checkpoint", str(path), "--suite", "knn", "--no-mlflow", *FAST_EVAL]) == 0
    assert "(cache)" in capsys.readouterr().out
    again = json.loads((out / "report.json").read_text())["metrics"]
    assert again["knn_k5_majority"] == m["knn_k5_majority"]
    assert main(["--checkpoint", str(path), "--suite", "knn", "--features", "projector", "--no-mlflow",
                 *FAST_EVAL]) == 0
    assert "(extracted)" in capsys.readouterr().out
    assert json.loads((out / "report.json").read_text())["meta"]["feature_dim"] == 32


@pytest.mark.slow
def test_unknown_training_run_gets_a_new_tagged_run(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    path = make_checkpoint(tmp_path / "run", mlflow_run_id="0" * 32, tracking_uri=uri)
    # K=5000 > the 1437 train images: skipped, and the run is tagged with it
    assert main(["--checkpoint", str(path), "--suite", "knn", *FAST_EVAL, "eval.knn_k=[20,5000]"]) == 0
    report = json.loads((tmp_path / "run" / "eval" / "step_00000007" / "report.json").read_text())
    run = MlflowClient(uri).get_run(report["meta"]["mlflow_run_id"])
    assert run.data.tags["eval.checkpoint"] == str(path.resolve()) and "eval/knn_k20_weighted" in run.data.metrics
    assert run.data.tags["eval.skipped"] == "knn_k5000" and "eval/knn_k5000_weighted" not in run.data.metrics


# ---------------------------------------------------------------------------------------------- extraction


def test_cached_embeddings_hit_and_miss(tmp_path: Path) -> None:
    cfg = load_config(None, TINY_MODEL)
    _, test_ds = build_eval_datasets(cfg.data)
    model = build_method_model(cfg.model, cfg.method)
    kw: dict[str, Any] = dict(cache_dir=tmp_path, batch_size=64, device="cpu")
    x1, y1, hit1 = cached_embeddings(model, test_ds, fingerprint="a", **kw)
    x2, y2, hit2 = cached_embeddings(model, test_ds, fingerprint="a", **kw)
    assert (hit1, hit2) == (False, True) and torch.equal(x1, x2) and torch.equal(y1, y2)
    x3, _, hit3 = cached_embeddings(model, test_ds, fingerprint="b", **kw)
    assert not hit3 and x3.shape == x1.shape
    direct, labels = extract_embeddings(model, test_ds, batch_size=50, device="cpu", progress=False)
    assert torch.allclose(direct, x3, atol=1e-5) and torch.equal(labels, y1)



def _sharded_worker(rank: int, world: int, port: int, out: str) -> None:
    from hypersolid_scale.distributed import cleanup, init_distributed

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    init_distributed(device="cpu", transport="gloo")
    cfg = load_config(None, TINY_MODEL)
    _, test_ds = build_eval_datasets(cfg.data)
    torch.manual_seed(0)
    model = build_method_model(cfg.model, cfg.method)
    feats, labels = extract_embeddings(model, test_ds, batch_size=32, device="cpu", progress=False)
    torch.save({"feats": feats, "labels": labels}, f"{out}/rank{rank}.pt")
    cleanup()


@pytest.mark.slow
def test_sharded_extraction_equals_single_process(tmp_path: Path) -> None:
    spawn(_sharded_worker, 2, free_port(), str(tmp_path), nprocs=2)
    cfg = load_config(None, TINY_MODEL)
    _, test_ds = build_eval_datasets(cfg.data)
    torch.manual_seed(0)
    ref, ref_y = extract_embeddings(build_method_model(cfg.model, cfg.method), test_ds, batch_size=32, device="cpu", progress=False)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert torch.allclose(got["feats"], ref, atol=1e-5) and torch.equal(got["labels"], ref_y)


# ---------------------------------------------------------------------------------------------- skipped metrics


def _eval(tmp_path: Path, suite: str, *overrides: str) -> tuple[int, dict[str, Any], str, list[str]]:
    """(exit code, report.json, report.md, SkippedWarning messages) of one evaluation of a tiny checkpoint."""
    from hypersolid_scale.eval.skips import SkippedWarning

    path = make_checkpoint(tmp_path / "run")
    out = tmp_path / "report"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["--checkpoint", str(path), "--suite", suite, "--no-mlflow", "--output-dir", str(out),
                     *FAST_EVAL, *overrides])
    skip_warnings = [str(w.message) for w in caught if issubclass(w.category, SkippedWarning)]
    return code, json.loads((out / "report.json").read_text()), (out / "report.md").read_text(), skip_warnings


def test_dbscan_radii_over_the_edge_budget_are_skipped_and_the_rest_reported(tmp_path: Path) -> None:
    # eps=0 holds the 360 self pairs only; eps=0.5 and 1.0 hold nearly all 360^2 pairs of a random CNN's features
    code, report, md, warned = _eval(tmp_path, "knn,cluster", "eval.dbscan_eps=[0.0,0.5,1.0]",
                                     "eval.dbscan_max_edges=2000")
    assert code == 0
    assert set(report["skipped"]) == {"dbscan_eps0.5", "dbscan_eps1"}
    assert all("dbscan_max_edges=2000" in why for why in report["skipped"].values())
    assert len(warned) == 1 and "0.5" in warned[0] and "1.0" in warned[0]  # one warning for the whole group
    assert [r["nmi"] is None for r in report["dbscan"]] == [False, True, True]
    assert {"knn_k5_weighted", "kmeans_nmi", "dbscan_best_nmi", "hdbscan_nmi"} <= set(report["metrics"])
    assert "## Skipped" in md and "| dbscan_eps0.5 | its neighbourhood graph exceeds" in md


def test_whole_dbscan_sweep_and_hdbscan_skipped_with_one_warning_each(tmp_path: Path) -> None:
    code, report, md, warned = _eval(tmp_path, "knn,cluster", "eval.dbscan_eps=[0.5]", "eval.dbscan_max_edges=1000",
                                     "eval.hdbscan_min_cluster_size=500")  # more than the 360 test points
    assert code == 0
    assert set(report["skipped"]) == {"dbscan", "hdbscan"} and len(warned) == 2
    assert "dbscan_max_edges=1000" in report["skipped"]["dbscan"]
    assert "min_cluster_size=500" in report["skipped"]["hdbscan"] and "got 360" in report["skipped"]["hdbscan"]
    assert "dbscan" not in report and not any(k.startswith(("dbscan_", "hdbscan_")) for k in report["metrics"])
    assert 0 <= report["metrics"]["kmeans_nmi"] <= 1 and 0 <= report["metrics"]["knn_k5_majority"] <= 100
    assert "| hdbscan | HDBSCAN needs more than" in md


def test_knn_k_over_the_memory_bank_and_probe_without_two_classes_are_skipped(tmp_path: Path) -> None:
    # a memory bank of 12 train images: K=5 runs, K=20 cannot
    code, report, _, warned = _eval(tmp_path, "knn,linear", "eval.max_train_samples=12")
    assert code == 0 and report["meta"]["n_train"] == 12 and report["meta"]["n_test"] == 360
    assert set(report["skipped"]) == {"knn_k20"} and "12 samples of the memory bank" in report["skipped"]["knn_k20"]
    assert len(warned) == 1 and {"knn_k5_majority", "knn_k5_weighted", "linear_top1"} <= set(report["metrics"])
    assert not any(k.startswith("knn_k20") for k in report["metrics"])
    # a single train image: one class, nothing for a probe to separate and no neighbours to vote
    code, report, md, warned = _eval(tmp_path / "one", "knn,linear,cluster", "eval.max_train_samples=1")
    assert code == 0 and set(report["skipped"]) == {"knn_k5", "knn_k20", "linear"}
    assert len(warned) == 2  # one for the two Ks together, one for the probe
    assert "at least 2 classes" in report["skipped"]["linear"] and "| linear |" in md
    assert {"kmeans_nmi", "hdbscan_nmi"} <= set(report["metrics"])


def test_nothing_evaluated_is_an_error_exit_with_the_report_still_written(tmp_path: Path) -> None:
    code, report, md, _ = _eval(tmp_path, "knn", "eval.max_train_samples=3")
    assert code != 0 and report["metrics"] == {} and set(report["skipped"]) == {"knn_k5", "knn_k20"}
    assert "## Skipped" in md and "| knn_k20 | K=20 exceeds the 3 samples" in md


def test_launch_eval_exit_codes(tmp_path: Path) -> None:
    """The script's exit status: 0 with a skipped metric, 3 with a message when nothing ran."""
    path = make_checkpoint(tmp_path / "run")

    def run(*args: str):
        return run_launch_eval("--checkpoint", str(path), "--no-mlflow", "--suite", "knn", *FAST_EVAL, *args)

    ok = run("eval.max_train_samples=10")  # K=20 skipped, K=5 computed
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert "knn_k20: K=20 exceeds" in ok.stdout and "k5_weighted" in ok.stdout
    none = run("eval.max_train_samples=3")
    assert none.returncode == 3  # not 1 (a bug) nor 2 (bad input): the input was fine, the data too small
    assert "nothing could be evaluated" in none.stderr and "Traceback" not in none.stderr
