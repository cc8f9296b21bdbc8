"""A run's epoch records: each finished epoch's means of every step statistic, one JSON line in
``<run_dir>/epochs.jsonl`` (written by rank 0 at the epoch's end, and for the epoch so far beside each checkpoint
written mid-epoch, training/epoch_end.py), and reading them back (the replication driver puts them beside its
evaluations). Stdlib only: a reader need not import the trainer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["EPOCHS_FILE", "read_epochs", "record_epoch"]

# One JSON line per finished epoch in the run directory (and one per mid-epoch checkpoint: the epoch so far): the
# epoch's mean of every statistic the method's step reports (loss terms, active pairs, ...), whether or not a
# tracking server is on (docs/training.md).
EPOCHS_FILE = "epochs.jsonl"


def record_epoch(path: Path, epoch: int, step: int, steps: int, mean: dict[str, float]) -> None:
    """Append the means of the ``steps`` steps ending at ``step`` (0-based ``epoch``, written 1-based) to
    ``path``: one line, flushed and fsynced (a crash leaves at most a partial last line, which read_epochs
    skips)."""
    rec = {"epoch": epoch + 1, "step": step, "steps": steps, **{k: float(v) for k, v in mean.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_epochs(path: Path) -> dict[int, dict[str, float]]:
    """The means of each epoch in ``path`` (1-based epochs), over every step recorded for it.

    A run stopped and resumed mid-epoch writes one record per part (steps (step - steps, step]); a run that
    resumed from an earlier checkpoint repeats steps, and the later record of those steps wins. The parts'
    means are combined weighted by their steps. An unreadable line (a crash mid-write) is skipped."""
    parts: dict[int, list[dict[str, float]]] = {}
    if not path.is_file():
        return {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not (isinstance(rec, dict) and isinstance(rec.get("epoch"), int) and rec.get("steps", 0) > 0):
            continue
        lo = rec["step"] - rec["steps"]
        kept = [r for r in parts.get(rec["epoch"], []) if r["step"] <= lo or r["step"] - r["steps"] >= rec["step"]]
        parts[rec["epoch"]] = [*kept, rec]
    out: dict[int, dict[str, float]] = {}
    for epoch, recs in sorted(parts.items()):
        n = sum(r["steps"] for r in recs)
        keys = [k for k in recs[-1] if k not in ("epoch", "step", "steps") and all(k in r for r in recs)]
        out[epoch] = {
            "epoch": epoch,
            "step": max(r["step"] for r in recs),
            "steps": n,
            **{k: sum(r[k] * r["steps"] for r in recs) / n for k in keys},
        }
    return out
