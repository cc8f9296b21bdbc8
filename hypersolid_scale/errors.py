"""Errors a user can fix: bad config key or value, missing or corrupt data or checkpoint, a locked run.

Raise ``UserError`` with one message that says what is wrong, which file or key, and how to fix it. The
entry points (``launch/train.py``, ``launch/eval.py``) print it as one line and exit with ``EXIT_BAD_INPUT``;
the traceback is only shown with ``HS_DEBUG=1``.
"""

from __future__ import annotations

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """A problem with the user's input, not a bug: its message is all the user needs to fix it."""
