"""``python -m hypersolid_scale.eval --checkpoint PATH | --backbone SOURCE:NAME --weights FILE [...]``: the same
as launch/eval.py in a checkout (its docstring has the details; everything lives in hypersolid_scale.eval.app).

Run as ``-m``, the package (hypersolid_scale.eval and its numerical libraries) is imported before this file,
so a launcher that dies in that window is noticed by die_with_parent's pid check rather than by prctl.
"""

import os

_PARENT = os.getppid()  # first thing here: the launcher's pid, to notice if it dies before prctl below

import sys  # noqa: E402

from hypersolid_scale.eval.app import cli  # noqa: E402
from hypersolid_scale.safety.lifeline import EXIT_ORPHANED, die_with_parent  # noqa: E402
from hypersolid_scale.safety.process_exit import exit_process  # noqa: E402

# Under torchrun / srun, the launcher's death ends this worker (SIGTERM's default action: nothing to save).
if not die_with_parent(parent=_PARENT):
    print("error: the launcher (torchrun / srun) exited before this worker started; exiting", file=sys.stderr)
    sys.exit(EXIT_ORPHANED)

exit_process(cli(sys.argv[1:]))
