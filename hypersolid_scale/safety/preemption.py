"""Preemption signals: SIGUSR1 / SIGTERM ask the run to finish its step, checkpoint and exit 75.

Nothing happens inside the handler: it records the signal, and the training loop reads the record after
every step (every rank votes, see ``step_bookkeeping.StopVote``). A signal that arrived before the trainer was
running (``launch/train.py`` records them during its slow imports) is handed to
:func:`preemption_handlers`, so the run takes one step, checkpoints and exits 75 instead of dying before its
first checkpoint.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: checkpoint written, requeue the job
SIGNALS = (signal.SIGUSR1, signal.SIGTERM)

_received: list[int] = []  # the signals recorded since the handlers were installed (or handed over)


def _on_signal(signum: int, _frame: Any) -> None:
    _received.append(signum)


def stop_requested() -> bool:
    """True once this process got a preemption signal (the loop still votes with the other ranks)."""
    return bool(_received)


@contextmanager
def preemption_handlers(early: Sequence[int] = ()) -> Iterator[None]:
    """Record SIGUSR1 / SIGTERM while training; restore the previous handlers and forget the signals after
    (``main`` may run inside another program, or several times in one test process).

    ``early``: the signals an earlier handler recorded (a live list: it is read once ours are installed, so
    no signal falls between the two handlers).
    """
    previous = {sig: signal.signal(sig, _on_signal) for sig in SIGNALS}
    _received.extend(early)
    try:
        yield
    finally:
        _received.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
