"""How the replication report writes numbers: one formatter for every table and the evidence text."""

from __future__ import annotations

from typing import Any

from benchmarks.replication.stats import Interval


def fmt(v: float) -> str:
    a = abs(v)
    if a >= 1 and float(v).is_integer():  # counts (clusters, pairs) and whole means of them
        return str(int(v))
    return f"{v:.2f}" if a >= 10 else f"{v:.3f}" if a >= 0.01 or v == 0 else f"{v:.2e}"


def fmt_cell(values: dict[str, Any], key: str) -> str:
    """``values[key]`` formatted for a table cell, "–" where that metric is missing or not a number."""
    v = values.get(key)
    return fmt(v) if isinstance(v, (int, float)) else "–"


def fmt_interval(i: Interval, signed: bool = False) -> str:
    f = (lambda v: ("+" if v > 0 else "") + fmt(v)) if signed else fmt
    if i.lo is None or i.hi is None:
        return f"{f(i.mean)} (n = 1)"
    return f"{f(i.mean)} [{fmt(i.lo)}, {fmt(i.hi)}] (n = {i.n})"
