"""The end of a process that ran a torch.distributed process group: the interpreter's exit, less its teardown.

Gloo's worker threads drop their reference to a finished collective (and to its tensors) a moment after the
caller has the result, and ``destroy_process_group`` does not join them. When that moment falls after the
interpreter has started finalizing, the thread cannot take the GIL to release a tensor's Python object: it is
ended inside a C++ destructor and the whole process aborts (``terminate called without an active exception``,
SIGABRT, exit -6) after its work is done and written. Seen on a loaded 2-core machine in about 1 of 30
two-rank gloo runs, in the trainer and in plain ``torch.multiprocessing`` workers alike (a core dump: the
thread in ``ProcessGroupGloo::runLoop`` -> ``~AsyncWork`` -> ``gil_scoped_acquire``, the main thread in
``Py_FinalizeEx``); under torchrun that exit fails a finished training. A process that created a group
(:func:`needs_quick_exit`, called by hypersolid_scale.distributed) therefore leaves through :func:`exit_process`
as a fresh interpreter would, less the teardown of its modules: the non-daemon threads are waited for, the
atexit handlers run (logging's flush, MLflow's), the standard streams are flushed, then ``os._exit``.
A process without a group exits normally. Stdlib only.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import threading
from typing import NoReturn

_quick = False


def needs_quick_exit() -> None:
    """Record that this process created a process group: :func:`exit_process` then skips the teardown."""
    global _quick
    _quick = True


def exit_process(code: int | None) -> NoReturn:
    """``sys.exit(code)``, or for a process that created a process group, :func:`leave_now`. A multiprocessing
    child (a function entry point of torchrun or ``torch.multiprocessing``) exits through its parent's protocol:
    ``SystemExit``, which that protocol turns into its exit code and return value."""
    if not _quick or multiprocessing.parent_process() is not None:
        sys.exit(code)
    leave_now(code)


def leave_now(code: int | None) -> NoReturn:
    """The interpreter's exit less its teardown: :func:`exit_steps`, then ``os._exit``."""
    exit_steps()
    os._exit((code or 0) & 0xFF)


def exit_steps() -> None:
    """What the interpreter does on its way out before the teardown: join the non-daemon threads, run the atexit
    handlers, flush the standard streams."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
