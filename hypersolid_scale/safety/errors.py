"""Errors a user can fix, and how the entry points report them.

Raise ``UserError`` (or a subclass) with one message that says what is wrong, which file or key, and how
to fix it. ``run_cli`` wraps an entry point's ``main``: a ``UserError`` becomes one line on stderr,
``error: <message>``, and exit code ``EXIT_BAD_INPUT`` (2); any other exception is a bug and becomes one
line naming its type, with exit code 1. The traceback is printed only with ``HS_DEBUG=1``; it is always
appended to the log file the entry point names (e.g. ``<run_dir>/logs/errors.log``), when there is one.
Under torchrun the printed line is also handed to torchrun as the failure's root cause, and a rank whose
collective fails because another rank stopped says only that (the other rank's line is the cause).

Subclasses also derive from the built-in exception a caller would catch (``ConfigError`` is a
``ValueError``, ``DataError`` and ``CheckpointError`` are ``RuntimeError``), so code that catches those keeps
working.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1
DEBUG_ENV = "HS_DEBUG"


class UserError(Exception):
    """A problem with the user's input, not a bug: its message is all the user needs to fix it.

    ``per_rank``: False when every rank meets the same error (a config), so only rank 0 reports it; True
    when it can be one rank's own (a shard on one node's disk), so every rank reports it with its rank.
    """

    per_rank = False
    reported = False  # set by `report`: the line is out, `run_cli` only sets the exit code


class ConfigError(UserError, ValueError):
    """A bad config file, key or value."""


class DataError(UserError, RuntimeError):
    """Missing, unreadable or corrupt data."""

    per_rank = True


class CheckpointError(UserError, RuntimeError):
    """A missing, truncated, foreign or mismatched checkpoint."""


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0", "false", "False")


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) or 0)


def _rank_prefix() -> str:
    """``[rank r] `` under a launcher (torchrun, srun), where several processes write to one terminal."""
    return f"[rank {_rank()}] " if "RANK" in os.environ or "SLURM_PROCID" in os.environ else ""


def _write_log(log_file: Path | None, text: str) -> None:
    if log_file is None:
        return
    try:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "a") as f:
            f.write(text)
    except OSError:
        pass  # the log is a convenience: failing to write it must not hide the error being reported


# How the collectives report that another rank is gone (gloo, NCCL, the TCP store), as opposed to a failure
# of this rank's own; matched on the text because errors.py sits below torch.distributed.
_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "NCCL communicator was aborted",
    "remote process exited or there was a network error",
    "Broken pipe",
)


def peer_gone(err: BaseException) -> bool:
    """True when ``err`` is a collective failing because another rank stopped (its error is that rank's)."""
    launched_many = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")) or 1) > 1
    names = {cls.__name__ for cls in type(err).__mro__}
    return launched_many and ("DistNetworkError" in names or any(text in str(err) for text in _PEER_GONE))


def tell_launcher(line: str, *, later: int = 0) -> None:
    """Hand our one line to torchrun, which then shows it as the failure's root cause in its own report
    instead of a link to its docs. torchrun names the file in ``TORCHELASTIC_ERROR_FILE`` and shows its
    ``py_callstack``. Written by hand in the library's own layout (``ErrorHandler.record_exception``)
    because that writer stores the Python traceback, which this module keeps off the terminal. A rank
    writes the line it printed, or the line rank 0 printed for an input every rank shares, so the root
    cause torchrun picks (the earliest, in whole seconds) is that line; ``later`` dates an entry that must
    not win a tie (a rank stopped by another's failure, a rank that did not print)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path or os.path.exists(path):  # the first failure wins, as in torch's own handler
        return
    entry = {"message": line, "extraInfo": {"py_callstack": line, "timestamp": str(int(time.time()) + later)}}
    try:
        with open(path, "w") as f:
            json.dump({"message": entry}, f)
    except OSError:
        pass  # only a nicer report from the launcher is lost; our own line is already on stderr


def report(err: UserError) -> None:
    """Print ``err``'s one line now (rank 0 only, unless ``per_rank``) and mark it reported, so that
    ``run_cli`` does not print it again.

    For code that must print before it lets the error go: a launcher stops the remaining workers (SIGTERM)
    as soon as one has exited, and a worker whose handlers no longer catch that signal dies unheard.
    """
    if not err.reported and (err.per_rank or _rank() == 0):
        prefix = _rank_prefix() if err.per_rank else ""
        print(f"{prefix}error: {err}", file=sys.stderr, flush=True)
        tell_launcher(f"{prefix}error: {err}")
    elif not err.reported:
        # The other ranks met the same input: each hands the same line to torchrun, dated a second later, so
        # that the root cause is this line whichever rank torchrun finds first (a rank without an error file
        # is dated when torchrun sees it exit and can win the tie in whole seconds).
        tell_launcher(f"error: {err}", later=1)
    err.reported = True


def run_cli(
    main: Callable[[Sequence[str]], int], argv: Sequence[str], *, log_file: Callable[[], Path | None] | None = None
) -> int:
    """Run ``main(argv)`` and turn exceptions into one line on stderr and an exit code.

    ``log_file`` is called after a failure and returns where the traceback goes (None: nowhere), so an
    entry point can name its run directory once it knows it. With ``HS_DEBUG=1`` the exception propagates
    unchanged (full traceback, Python's exit code 1). Under torchrun every rank fails alike for a bad
    input, so only rank 0 prints a ``UserError`` (unless its ``per_rank``; and not twice, see ``report``); a
    bug is printed by every rank that meets it, with its rank.
    """
    try:
        return main(list(argv))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except SystemExit:
        raise
    except BaseException as err:
        path = log_file() if log_file is not None else None
        _write_log(path, "".join(traceback.format_exception(err)))  # with HS_DEBUG=1 too: the log is the record
        if debug_enabled():
            raise
        where = f"; traceback in {path}" if path is not None else ""
        prefix = _rank_prefix()
        if isinstance(err, UserError):
            report(err)
            return EXIT_BAD_INPUT
        if peer_gone(err):  # not this rank's failure: point at the one that is, and leave torchrun's root cause
            line = (
                f"error: stopped because another rank stopped first; its error line above (and the launcher's "
                f"report) says why{where}"
            )
            print(f"{prefix}{line}", file=sys.stderr)
            tell_launcher(f"{prefix}{line}", later=1)
            return EXIT_INTERNAL
        line = (
            f"error: {type(err).__name__}: {err} (an internal error, not a problem with your input; "
            f"rerun with {DEBUG_ENV}=1 for the traceback{where})"
        )
        print(f"{prefix}{line}", file=sys.stderr)
        tell_launcher(f"{prefix}{line}")
        return EXIT_INTERNAL
