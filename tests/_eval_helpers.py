"""Helpers for the evaluation application's tests: a tiny checkpoint (no training needed) and a run of
``launch/eval.py`` in a process of its own, the way a user runs it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from _warm_python import run_python

from hypersolid_scale.checkpoint import initial_weights, save_checkpoint
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import load_config, to_dict

ROOT = Path(__file__).resolve().parents[1]
LAUNCH_EVAL = ROOT / "launch" / "eval.py"

TINY_MODEL = ["data.dataset=digits", "model.arch=small_cnn", "model.in_channels=1", "model.small_cnn.width=8",
              "method.hypersolid.num_layers=2", "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "eval.num_workers=0"]
FAST_EVAL = ["eval.linear_weight_decays=[0.001]", "eval.dbscan_eps=[0.0,0.01,0.05,0.2]", "eval.max_pairs=20000",
             "eval.interp_pairs=20", "eval.knn_k=[5,20]", "eval.hdbscan_min_cluster_size=5"]


def make_checkpoint(run_dir: Path, overrides: Sequence[str] = (), *, step: int = 7,
                    model_overrides: Sequence[str] = (), mlflow_run_id: str | None = None,
                    tracking_uri: str | None = None) -> Path:
    """A checkpoint with the contract's keys for a randomly initialised tiny model (no training needed).

    ``model_overrides`` build the *weights* from another model config than the one recorded in the checkpoint.
    """
    cfg = load_config(None, [*TINY_MODEL, f"run_dir={run_dir}", *overrides])
    model, method = initial_weights(load_config(None, [*TINY_MODEL, *model_overrides]) if model_overrides else cfg)
    state = {"model": model, "method": method, "step": step, "epoch": 0, "config": to_dict(cfg),
             "config_fingerprint": fingerprint(cfg), "mlflow_run_id": mlflow_run_id, "tracking_uri": tracking_uri}
    return save_checkpoint(run_dir, state)


def run_launch_eval(*args: str, debug: bool = False, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python launch/eval.py ARGS`` in a process of its own, forked with the package imported (HS_DEBUG set
    only with ``debug``)."""
    env = {k: v for k, v in os.environ.items() if k != "HS_DEBUG"}
    env.update(OMP_NUM_THREADS="1", **({"HS_DEBUG": "1"} if debug else {}))
    return run_python([str(LAUNCH_EVAL), *args], env=env, timeout=timeout, cwd=ROOT)


# A published backbone on digits, kept quick: kNN only, on a few hundred images.
EXTERNAL_FAST = ["--suite", "knn", "data.dataset=digits", "eval.knn_k=[5]", "eval.max_train_samples=300",
                 "eval.max_test_samples=120", "eval.num_workers=0"]
