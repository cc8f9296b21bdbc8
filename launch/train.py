"""Hypersolid pre-training entry point (thin: everything lives in hypersolid_scale.training.trainer).

    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml optim.lr=3e-4
    srun python launch/train.py --config configs/cifar100.yaml      # one task per GPU

Exit code 75 means "preempted, checkpoint written, requeue me"; 0 means finished; 2 a problem with the input
(a bad config, missing data, an unusable checkpoint, a full disk, an unreachable tracking server, a run_dir
locked by another live training), reported in one line; 1 an internal error (the traceback goes to
<run_dir>/logs/errors.log, and to the terminal with HS_DEBUG=1). Under torchrun / srun the workers stop
when the launcher dies, even by SIGKILL: at once while they start (nothing to save yet), and by checkpointing
and exiting 75 once their process group is up.
"""

import os

_PARENT = os.getppid()  # first thing: the launcher's pid, to notice if it dies before prctl below

import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

# Importing torch and the data stack takes seconds to a minute on a busy node: a preemption signal (Slurm's
# USR1 or TERM) in that window must not kill the job before its first checkpoint, so it is recorded now
# and handed to the trainer, which then checkpoints after one step and exits 75.
_early: list[int] = []
for _sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(_sig, lambda signum, _frame: _early.append(signum))

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent  # noqa: E402  (stdlib only: fast)

# Under torchrun / srun, the launcher's death kills the worker outright while it starts: there is nothing
# to checkpoint yet, and the rendezvous would wait for a launcher that is gone (torchrun hosts its store) for
# dist.timeout_minutes, inside C++ where no Python signal handler runs. Once the process group is up, the
# trainer asks for SIGTERM instead (one step, checkpoint, exit 75: hypersolid_scale.training.trainer). A launcher that
# died before this line leaves nothing to checkpoint for, so the worker just leaves.
if not die_with_parent(signal.SIGKILL, parent=_PARENT):
    print("error: the launcher (torchrun / srun) exited before this worker started; exiting", file=sys.stderr)
    sys.exit(EXIT_ORPHANED)

from hypersolid_scale.safety.errors import run_cli  # noqa: E402
from hypersolid_scale.training import trainer as train  # noqa: E402

_run_dir: list[Path] = []  # known once the config is valid


def _main(argv: Sequence[str]) -> int:
    return train.main(list(argv), early_signals=_early, on_config=lambda cfg: _run_dir.append(Path(cfg.run_dir)))


def _log_file() -> Path | None:
    return _run_dir[0] / "logs" / "errors.log" if _run_dir else None


if __name__ == "__main__":
    sys.exit(run_cli(_main, sys.argv[1:], log_file=_log_file))
