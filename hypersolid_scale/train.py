"""Hypersolid pre-training entry point, from an installed wheel or a checkout (launch/train.py calls this).

    torchrun --nproc_per_node=2 -m hypersolid_scale.train --config quickstart optim.lr=3e-4
    torchrun --nproc_per_node=2 launch/train.py --config configs/quickstart.yaml      # the same, in a checkout
    srun python -m hypersolid_scale.train --config cifar100                         # one task per GPU

``--config`` is a YAML path or the name of one of the paper's setups that ship with the package
(``quickstart``, ``cifar100``, ``baselines/simclr_cifar10``: configs/ in the repository; a bad name lists them).
Everything else lives in hypersolid_scale.training.trainer.

Exit code 75 means "preempted, checkpoint written, requeue me"; 0 means finished; 2 a problem with the input
(a bad config, missing data, an unusable checkpoint, a full disk, an unreachable tracking server, a run_dir
locked by another live training, a missing [train] extra), reported in one line; 1 an internal error (the
traceback goes to <run_dir>/logs/errors.log, and to the terminal with HS_DEBUG=1). Under torchrun / srun the
workers stop when the launcher dies, even by SIGKILL: at once while they start (nothing to save yet), and by
checkpointing and exiting 75 once their process group is up.

Importing this module does nothing but record the parent pid (stdlib only): :func:`main` does the rest.
"""

import os

_PARENT = os.getppid()  # first thing: the launcher's pid, to notice if it dies before prctl in main()

import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from pathlib import Path  # noqa: E402

from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent  # noqa: E402  (stdlib only: fast)
from hypersolid_scale.safety.process_exit import exit_process  # noqa: E402  (stdlib only)


def _resolve_setup(argv: list[str]) -> list[str]:
    """``--config NAME`` / ``--config=NAME`` with NAME a packaged setup becomes its path (the trainer reads paths)."""
    from hypersolid_scale.config.setups import resolve_config

    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--config" and i + 1 < len(out):
            out[i + 1] = resolve_config(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + resolve_config(arg.removeprefix("--config="))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run one training with the command line ``argv`` (default: sys.argv[1:]); returns the exit code."""
    # Importing torch and the data stack takes seconds to a minute on a busy node: a preemption signal (Slurm's
    # USR1 or TERM) in that window must not kill the job before its first checkpoint, so it is recorded now
    # and handed to the trainer, which then checkpoints after one step and exits 75.
    early: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: early.append(signum))

    # Under torchrun / srun, the launcher's death kills the worker outright while it starts: there is nothing
    # to checkpoint yet, and the rendezvous would wait for a launcher that is gone (torchrun hosts its store) for
    # dist.timeout_minutes, inside C++ where no Python signal handler runs. Once the process group is up, the
    # trainer asks for SIGTERM instead (one step, checkpoint, exit 75: hypersolid_scale.training.trainer). A
    # launcher that died before this line leaves nothing to checkpoint for, so the worker just leaves.
    if not die_with_parent(signal.SIGKILL, parent=_PARENT):
        print("error: the launcher (torchrun / srun) exited before this worker started; exiting", file=sys.stderr)
        return EXIT_ORPHANED

    from hypersolid_scale.safety.errors import run_cli

    run_dir: list[Path] = []  # known once the config is valid

    def _main(args: Sequence[str]) -> int:
        from hypersolid_scale.safety.extras import require

        require("train", "training (hypersolid_scale.train)")
        from hypersolid_scale.training import trainer

        return trainer.main(
            _resolve_setup(list(args)), early_signals=early, on_config=lambda cfg: run_dir.append(Path(cfg.run_dir))
        )

    def _log_file() -> Path | None:
        return run_dir[0] / "logs" / "errors.log" if run_dir else None

    return run_cli(_main, sys.argv[1:] if argv is None else argv, log_file=_log_file)


if __name__ == "__main__":
    exit_process(main())
