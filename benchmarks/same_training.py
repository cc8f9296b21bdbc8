"""Seeded trainings whose every bit is recorded: the check that a refactor changed no behaviour.

    python -m benchmarks.same_training --out before.json --repo /path/to/old/checkout
    python -m benchmarks.same_training --out after.json
    python -m benchmarks.same_training --compare before.json after.json

Each case trains ``launch/train.py`` (one CPU process, the checkout's own config file) for ``--steps`` steps
with a metric logged every step, then records every logged training loss (read back from the run's MLflow
store, float64 as logged) and a SHA-256 of every tensor of the final checkpoint: the trained weights, the
method's state and the optimizer's moments. Tensor names are compared without the ``method.`` prefix, so a
checkpoint whose heads moved from ``model`` to ``method`` still compares tensor by tensor. ``--compare``
exits 1 and names what differs unless both files hold bit-identical losses and tensors.

The trainings inherit OMP_NUM_THREADS, and the record keeps it (``threads``; null: unset, torch's default):
on the CPU the float reductions depend on the thread count, so compare records made at one count (``--compare``
notes when they were not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from hypersolid_scale.safety import atomic
from hypersolid_scale.tracking.metadata import git_dirty

ROOT = Path(__file__).resolve().parents[1]
# (case, config file, extra overrides). The config files hold the same settings in every version of the
# repository; a version that renamed their keys reads its own spelling of them. The batch is given on the command
# line, in the one spelling every version reads: 64 images in the one process (the configs used to state 64 per
# GPU, and now state the global batch of their 2-process launch, 128).
CASES = (
    ("hypersolid", "configs/quickstart.yaml", ("data.batch_size_per_gpu=64",)),
    ("simclr", "configs/baselines/simclr_quickstart.yaml", ("data.batch_size_per_gpu=64",)),
)


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(
        t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    ).hexdigest()[:20]


def tensor_hashes(ckpt: dict[str, Any]) -> dict[str, str]:
    """``name -> sha`` of the weights (``model`` and ``method`` merged, ``method.`` prefix dropped) and the
    optimizer's per-parameter state (``optimizer/<index>/<key>``)."""
    out: dict[str, str] = {}
    for section in ("model", "method"):
        for name, value in (ckpt.get(section) or {}).items():
            if isinstance(value, torch.Tensor):
                out[name.removeprefix("method.")] = _sha(value)
    for index, state in sorted((ckpt.get("optimizer") or {}).get("state", {}).items()):
        for key, value in sorted(state.items()):
            if isinstance(value, torch.Tensor):
                out[f"optimizer/{index}/{key}"] = _sha(value)
    return out


def run_case(repo: Path, config: str, steps: int, extra: tuple[str, ...], work: Path) -> dict[str, Any]:
    run_dir = work / "run"
    cmd = [
        sys.executable,
        "launch/train.py",
        "--config",
        config,
        f"run_dir={run_dir}",
        f"max_steps={steps}",
        "tracking.log_every_n_steps=1",
        "eval.every_n_epochs=0",
        f"checkpoint.every_n_steps={steps}",
        "data.max_train_samples=4096",  # the former name of data.max_pretrain_samples: older checkouts read it too
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"training failed in {repo} ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
    ckpts = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    ckpt = torch.load(ckpts[-1], map_location="cpu", weights_only=False)
    with sqlite3.connect(run_dir / "mlflow.db") as db:
        losses = [v for _, v in db.execute("SELECT step, value FROM metrics WHERE key='train/loss' ORDER BY step")]
    return {"losses": losses, "tensors": tensor_hashes(ckpt), "step": int(ckpt["step"])}


def record(repo: Path, steps: int) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    dirty = git_dirty(repo)
    out: dict[str, Any] = {
        "commit": commit,
        "dirty": dirty,
        "torch": torch.__version__,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "steps": steps,
        "cases": {},
    }
    for name, config, extra in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            out["cases"][name] = run_case(repo, config, steps, extra, Path(tmp))
            print(
                f"{name}: {len(out['cases'][name]['losses'])} losses, {len(out['cases'][name]['tensors'])} tensors",
                flush=True,
            )
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """What differs between two records (empty: bit-identical)."""
    problems = []
    for name in sorted(set(a["cases"]) | set(b["cases"])):
        ca, cb = a["cases"].get(name), b["cases"].get(name)
        if ca is None or cb is None:
            problems.append(f"{name}: recorded in only one file")
            continue
        if ca["losses"] != cb["losses"]:
            first = next((i for i, (x, y) in enumerate(zip(ca["losses"], cb["losses"])) if x != y), None)
            problems.append(
                f"{name}: losses differ (first at logged step {first}; {len(ca['losses'])} vs "
                f"{len(cb['losses'])} values)"
            )
        ta, tb = ca["tensors"], cb["tensors"]
        if set(ta) != set(tb):
            problems.append(
                f"{name}: tensor names differ: only before {sorted(set(ta) - set(tb))[:5]}, only after "
                f"{sorted(set(tb) - set(ta))[:5]}"
            )
        differ = sorted(k for k in set(ta) & set(tb) if ta[k] != tb[k])
        if differ:
            problems.append(f"{name}: {len(differ)} tensors differ ({', '.join(differ[:5])})")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the record here")
    parser.add_argument("--repo", default=str(ROOT), help="the checkout to train (default: this one)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args(argv)
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        problems = compare(a, b)
        if a.get("threads") != b.get("threads"):  # records older than the field hold none: not flagged
            print(
                f"note: recorded at OMP_NUM_THREADS {a.get('threads')} and {b.get('threads')}; the CPU's float "
                "reductions depend on it"
            )
        for line in problems:
            print(line)
        n = sum(len(c["tensors"]) for c in b["cases"].values())
        print(
            f"{'DIFFERENT' if problems else 'bit-identical'}: {a['commit'][:7]} vs {b['commit'][:7]} "
            f"({', '.join(b['cases'])}; {b['steps']} steps; {n} tensors)"
        )
        return 1 if problems else 0
    if not args.out:
        parser.error("--out is required unless --compare is given")
    result = record(Path(args.repo).resolve(), args.steps)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic.write_text(Path(args.out), json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
