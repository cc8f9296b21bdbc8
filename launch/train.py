"""Hypersolid pre-training entry point (thin: everything lives in hypersolid_scale.train).

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4
    srun python launch/train.py --config configs/cifar100.yaml      # one task per GPU

Exit code 75 means "preempted, checkpoint written, requeue me"; 0 means finished; 2 a bad config or a run_dir
locked by another live training. Under torchrun / srun the workers stop (SIGTERM: checkpoint, exit 75) when
the launcher dies, even by SIGKILL.
"""

import os

_PARENT = os.getppid()  # first thing: the launcher's pid, to notice if it dies before prctl below

import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

# Importing torch and the data stack takes seconds to a minute on a busy node: a preemption signal (Slurm's
# USR1 or TERM) in that window must not kill the job before its first checkpoint, so it is recorded now
# and handed to the trainer, which then checkpoints after one step and exits 75.
_early: list[int] = []
for _sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(_sig, lambda signum, _frame: _early.append(signum))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.lifeline import EXIT_ORPHANED, die_with_parent  # noqa: E402  (stdlib only: fast)

# Under torchrun / srun, the launcher's death sends SIGTERM (recorded above: one step, checkpoint, exit 75);
# a launcher that died before this line leaves nothing to checkpoint for, so the worker just leaves.
if not die_with_parent(signal.SIGTERM, parent=_PARENT):
    print("error: the launcher (torchrun / srun) exited before this worker started; exiting", file=sys.stderr)
    sys.exit(EXIT_ORPHANED)

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
