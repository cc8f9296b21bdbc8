"""Process-level safety, the lowest layer: the user-error classes and ``run_cli`` (``errors``), workers that
die with their launcher (``lifeline``), preemption signals turned into a flag the loop reads
(``preemption``), one writer per run directory (``run_lock``).

Nothing here imports the rest of the package, and this file imports nothing: the entry points import
``safety.lifeline`` before anything heavy.
"""
