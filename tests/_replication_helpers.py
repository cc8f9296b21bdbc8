"""Synthetic replication-study runs for the report's tests (test_replication_report.py, test_replication_verdicts.py):
run JSON as run.py writes it, a study with known differences between methods, and the verdict a claim gets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.replication import claims, judging

BB = claims.BB


def fake_run(method: str, seed: int, values: dict[str, float], group: str = "cpu") -> dict:
    final = {"epoch": 1, "step": 468, "protocol": "paper", **values}
    return {
        "run": f"{group}-{method}-s{seed}",
        "method": method,
        "seed": seed,
        "group": group,
        "part": group,
        "epochs": 1,
        "card": "cpu",
        "torch": "x",
        "git_commit": "0" * 40,
        "train_s": 1.0,
        "train_s_total": 1.0,
        "eval_s": 2.0,
        "final_step": 468,
        "per_epoch": [final],
        "final": final,
    }


def fake_study(shift: dict[str, float], seeds: int = 5, noise: float = 0.01) -> list[dict]:
    """Every headline and geometry metric ~ 0.5 + noise per seed; ``shift[method]`` added to the baselines'
    K-Means AMI (paired noise: the same seed's noise is shared by every method, as a shared init would)."""
    rng = np.random.default_rng(0)
    keys = [k for k, _ in claims.HEADLINE + claims.GEOMETRY]
    base = {s: {k: 0.5 + noise * rng.standard_normal() for k in keys} for s in range(seeds)}
    runs = []
    for method in claims.METHOD_NAMES:
        for s in range(seeds):
            vals = {k: v + 1e-3 * rng.standard_normal() for k, v in base[s].items()}
            vals[f"{BB}kmeans.ami"] += shift.get(method, 0.0)
            runs.append(fake_run(method, s, vals))
    return runs


def verdict_of(runs: list[dict], claim: str) -> str:
    rows = judging.verdicts([judging.Scope("1 epoch", "after 1 epoch, defaults", judging.compare(runs))])
    return next(r["verdict"] for r in rows if r["claim"] == claim)


KMEANS = "Hypersolid clusters better: K-Means"
OFFSET = next(c.name for c in claims.CLAIMS if c.family == "offset")
INTERP = "Interpolation: different-class paths separated more than same-class ones (peak ratio)"
CLUSTERS = "HDBSCAN finds a cluster count nearer the classes"
PARITY = "kNN and linear probe competitive: no baseline significantly ahead"


def write_runs(results: Path, runs: list[dict]) -> None:
    (results / "cpu").mkdir(parents=True, exist_ok=True)
    for r in runs:
        (results / "cpu" / f"{r['run']}.json").write_text(json.dumps(r))


def as_part(run: dict, name: str, part: str, overrides: tuple[str, ...] = (), **extra) -> dict:
    return {**run, "run": name, "part": part, "overrides": list(overrides), **extra}
