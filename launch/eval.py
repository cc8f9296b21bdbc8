"""Evaluate a checkpoint or a published backbone:
``python launch/eval.py --checkpoint PATH | --backbone SOURCE:NAME --weights FILE [--suite ...] [data.key=value ...]``.

Under ``torchrun --nproc_per_node=N`` the embedding extraction is sharded over the N processes.
Everything else lives in ``hypersolid_scale.eval.app``. Workers end when their launcher dies. A bad input
(checkpoint, override, data) is one ``error:`` line and exit 2 (``HS_DEBUG=1`` shows the traceback); exit 3
means every requested metric was skipped.
"""

import os

_PARENT = os.getppid()  # first thing: the launcher's pid, to notice if it dies before prctl below

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent  # noqa: E402  (stdlib only: fast)

# Under torchrun / srun, the launcher's death ends this worker (SIGTERM's default action: nothing to save).
if not die_with_parent(parent=_PARENT):
    print("error: the launcher (torchrun / srun) exited before this worker started; exiting", file=sys.stderr)
    sys.exit(EXIT_ORPHANED)

from hypersolid_scale.eval.app import cli  # noqa: E402
from hypersolid_scale.safety.process_exit import exit_process  # noqa: E402

if __name__ == "__main__":
    exit_process(cli(sys.argv[1:]))
