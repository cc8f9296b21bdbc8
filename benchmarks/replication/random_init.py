"""A random-init run of the replication study: ``launch/train.py`` with the given arguments (one step, so
that a checkpoint with the run's config exists), then that checkpoint's weights replaced by the run's initial
ones (``checkpoint.random_init_checkpoint``: the same seed, the same code path) as ``step_00000000.pt``; the
trained step's checkpoints are removed, so that the driver evaluates step 0 and nothing else.

    python -m benchmarks.replication.random_init <launch/train.py arguments, with run_dir=...>
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str]) -> int:
    run_dir = next((Path(a.split("=", 1)[1]) for a in argv if a.startswith("run_dir=")), None)
    if run_dir is None:
        raise SystemExit("random_init.py: no run_dir=... among the arguments")
    init = run_dir / "checkpoints" / "step_00000000.pt"
    if init.exists():  # written by an attempt stopped before the driver recorded it: nothing to train again
        print(f"random-init weights already written: {init}", flush=True)
        return 0
    rc = subprocess.run([sys.executable, "launch/train.py", *argv], cwd=ROOT).returncode
    if rc != 0:
        return rc
    from hypersolid_scale.checkpoint import atomic_save, load_checkpoint, random_init_checkpoint

    ckpts = sorted((run_dir / "checkpoints").glob("step_*.pt"))
    trained = [p for p in ckpts if p.name != "step_00000000.pt"]
    if not trained:
        raise SystemExit(f"random_init.py: the training wrote no checkpoint under {run_dir}")
    atomic_save(random_init_checkpoint(load_checkpoint(trained[-1])), init)
    for p in trained:
        p.unlink()
    print(f"random-init weights (the run's initial ones): {init}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
