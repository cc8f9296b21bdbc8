"""What bad input looks like from the command line, for every entry point (docs/design.md §6, "Errors"): exit code 2,
exactly one ``error:`` line on stderr that holds what is wrong and the fix, no traceback, no torch-internal
advice (``weights_only``)."""

from __future__ import annotations

import subprocess


def assert_one_error_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """Assert that ``proc`` refused its input as a user should see it, its error line holding every needle;
    returns the line for the caller's own checks."""
    everything = proc.stdout + proc.stderr
    assert proc.returncode == 2, f"exit {proc.returncode}:\n{everything[-3000:]}"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert "Traceback" not in everything, everything[-3000:]
    assert "weights_only" not in everything, everything[-3000:]
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]
