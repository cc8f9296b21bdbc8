"""The study's one state file: per run, what is trained (and to which stage), its seconds over every attempt, and
which evaluations are done; beside the runs, what the study itself keeps (the comparison's MLflow parent run).

    {"runs": {"<name>": {"train": "done" | "failed (exit N)", "final_step": S, "resumed_from_step": S | null,
                         "train_s": seconds over every attempt, "last_attempt_s": the last attempt's,
                         "attempt": {"done_s": ..., "current_s": ...}, "trained_to_epoch": E,
                         "threads": [each attempt's OMP_NUM_THREADS, distinct, in the order first used],
                         "evals": {"<key>": {"status": "done" | "failed (exit N)", "eval_s": ...}},
                         "eval_s": the evaluations' seconds}},
     ...}

Rewritten atomically after every change (a kill never leaves half a file); a running training's seconds are
recorded every few seconds, so a study killed with its training loses at most that much of the run's time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypersolid_scale.safety import atomic


class StudyState:
    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        self.data.setdefault("runs", {})

    def run(self, name: str) -> dict[str, Any]:
        return self.data["runs"].setdefault(name, {})

    def save(self) -> None:
        atomic.write_json(self.path, self.data, indent=1, sort_keys=True, newline=False)

    # ---- a training's seconds over its attempts -----------------------------------------------------------
    def start_attempt(self, name: str, threads: str | None = None) -> None:
        """A new attempt, with ``threads`` per process (OMP_NUM_THREADS): the last one's seconds join the finished
        ones. The thread counts are kept because a CPU training's float reductions depend on them: a run resumed at
        another count is not bit-identical to one that was not (docs/design.md §5)."""
        rec = self.run(name)
        got = rec.get("attempt", {})
        rec["attempt"] = {"done_s": round(got.get("done_s", 0.0) + got.get("current_s", 0.0), 2), "current_s": 0.0}
        if threads is not None and threads not in rec.setdefault("threads", []):
            rec["threads"].append(threads)
        self.save()

    def tick_attempt(self, name: str, current_s: float) -> None:
        rec = self.run(name)
        rec["attempt"] = {"done_s": rec.get("attempt", {}).get("done_s", 0.0), "current_s": round(current_s, 2)}

    def end_attempt(self, name: str, seconds: float) -> float:
        """The attempt just ended took ``seconds``; the training's seconds over every attempt."""
        rec = self.run(name)
        total = round(rec.get("attempt", {}).get("done_s", 0.0) + seconds, 2)
        rec["attempt"] = {"done_s": total, "current_s": 0.0}
        rec["train_s"], rec["last_attempt_s"] = total, round(seconds, 2)
        self.save()
        return total

    # ---- evaluations ---------------------------------------------------------------------------------------
    def eval_done(self, name: str, key: str) -> bool:
        return self.run(name).get("evals", {}).get(key, {}).get("status") == "done"

    def record_eval(self, name: str, key: str, status: str, seconds: float) -> None:
        rec = self.run(name)
        evals = rec.setdefault("evals", {})
        evals[key] = {"status": status, "eval_s": round(seconds, 2)}
        rec["eval_s"] = round(sum(e["eval_s"] for e in evals.values()), 2)
        self.save()
