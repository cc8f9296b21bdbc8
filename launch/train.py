"""Hypersolid pre-training entry point (thin: everything lives in hypersolid_scale.train).

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4
    srun python launch/train.py --config configs/cifar100.yaml      # one task per GPU

Exit code 75 means "preempted, checkpoint written, requeue me"; 0 means finished.
"""

import signal
import sys
from pathlib import Path

# Importing torch and the data stack takes seconds to a minute on a busy node: a preemption signal (Slurm's
# USR1 or TERM) in that window must not kill the job before its first checkpoint, so it is recorded now
# and handed to the trainer, which then checkpoints after one step and exits 75.
_early: list[int] = []
for _sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(_sig, lambda signum, _frame: _early.append(signum))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale import train  # noqa: E402


def run(argv: list[str]) -> int:
    if _early:
        train._STOP["signal"] = _early[0]
    path, overrides = train.parse_args(argv)
    try:
        cfg = train.load_config(path, overrides)
    except ValueError as err:  # a bad config: the message names the key and the fix, a traceback adds nothing
        print(f"error: {err}", file=sys.stderr)
        return 2
    return train.train(cfg)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
