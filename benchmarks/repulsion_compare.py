"""Compare a repulsion benchmark run with a reference one (by default the committed results/repulsion.json).

    python -m benchmarks.repulsion_compare NEW.json                       # against results/repulsion.json
    python -m benchmarks.repulsion_compare NEW.json --baseline OLD.json --time-threshold 0.2 --strict

Rows are matched on (backend, M, regime, dtype, device). A row is reported slower when its time grew by more
than ``--time-threshold`` (a fraction: 0.3 = 30 %) and by more than ``--time-floor`` seconds, and heavier when
its peak memory grew by more than ``--mem-threshold`` and by more than ``--mem-floor-mib``: the thresholds
are the noise allowance (one timed repetition above M = 4096, and a CPU shared with other work moves times
by tens of percent). Rows that ran in the reference but are skipped now are listed too. Differences in the
recorded environment (torch, threads, BLAS variables, cores) are printed first: they can explain a change.
Exit status 0, or 1 with ``--strict`` when something got slower or heavier.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.common import RESULTS

DEFAULT_BASELINE = RESULTS / "repulsion.json"
ENV_KEYS = (
    "torch",
    "numpy",
    "faiss",
    "python",
    "threads",
    "interop_threads",
    "cpus",
    "card",
    "device",
    "blas_env",
)
# What results written before common.metadata called these keys.
FORMER_ENV_KEYS = {"cpus": ("cores",), "card": ("gpu", "cpu")}


def _env(meta: dict, key: str) -> Any:
    """``meta``'s value of ``key``, under its former name in an older result."""
    for k in (key, *FORMER_ENV_KEYS.get(key, ())):
        if k in meta:
            return meta[k]
    return "not recorded"


def _key(row: dict) -> tuple:
    return (row.get("backend"), row.get("m"), row.get("regime"), row.get("dtype", "fp32"), row.get("device", "cpu"))


def _device(data: dict) -> str:
    return data.get("meta", {}).get("device", "cpu")


def compare(
    base: dict,
    new: dict,
    *,
    time_threshold: float = 0.3,
    time_floor: float = 0.05,
    mem_threshold: float = 0.2,
    mem_floor_mib: float = 32.0,
) -> dict:
    """Matched rows of two benchmark results, classified. Pure function of the two JSON objects.

    Returns {"slower": [...], "heavier": [...], "faster": [...], "lost": [...], "matched": int,
    "env": [(key, base value, new value), ...]}; each of slower/heavier/faster is a dict with backend, m,
    regime, dtype, the two values and their ratio new / base.
    """
    dev_b, dev_n = _device(base), _device(new)
    rows_b = {_key({"device": dev_b, **r}): r for r in base.get("rows", [])}
    rows_n = {_key({"device": dev_n, **r}): r for r in new.get("rows", [])}
    out: dict = {"slower": [], "heavier": [], "faster": [], "lost": [], "matched": 0, "env": []}
    for key in sorted(set(rows_b) & set(rows_n), key=lambda k: tuple(str(x) for x in k)):
        b, n = rows_b[key], rows_n[key]
        head = dict(zip(("backend", "m", "regime", "dtype", "device"), key))
        if "seconds" in b and "seconds" not in n:
            out["lost"].append({**head, "reason": n.get("skipped", "no time")})
            continue
        if "seconds" not in b or "seconds" not in n:
            continue
        out["matched"] += 1
        tb, tn = float(b["seconds"]), float(n["seconds"])
        ratio = tn / tb if tb > 0 else float("inf")
        item = {**head, "base": tb, "new": tn, "ratio": ratio}
        if tn - tb > time_floor and ratio > 1.0 + time_threshold:
            out["slower"].append(item)
        elif tb - tn > time_floor and ratio < 1.0 / (1.0 + time_threshold):
            out["faster"].append(item)
        if "peak_bytes" in b and "peak_bytes" in n:
            mb, mn = b["peak_bytes"] / 2**20, n["peak_bytes"] / 2**20
            mratio = mn / mb if mb > 0 else float("inf")
            if mn - mb > mem_floor_mib and mratio > 1.0 + mem_threshold:
                out["heavier"].append({**head, "base": mb, "new": mn, "ratio": mratio})
    mb_, mn_ = base.get("meta", {}), new.get("meta", {})
    for k in ENV_KEYS:
        if _env(mb_, k) != _env(mn_, k):
            out["env"].append((k, _env(mb_, k), _env(mn_, k)))
    out["load"] = (mb_.get("load_average_at_start", "not recorded"), mn_.get("load_average_at_start", "not recorded"))
    return out


def report(result: dict, *, time_threshold: float, mem_threshold: float) -> list[str]:
    """Lines to print for :func:`compare`'s result."""
    lines = [
        (
            f"repulsion benchmark vs reference: {result['matched']} rows compared "
            f"(noise allowance: time +{time_threshold:.0%}, peak memory +{mem_threshold:.0%})"
        )
    ]
    for k, vb, vn in result["env"]:
        lines.append(f"  environment differs: {k}: {vb} -> {vn}")
    if result.get("load"):
        lines.append(
            f"  load average (1, 5, 15 min) at the start: {result['load'][0]} -> {result['load'][1]} "
            "(a busy machine slows every row alike)"
        )

    def row(r: dict, unit: str, fmt: str) -> str:
        return (
            f"  {r['backend']:15s} {r['regime']:9s} M={r['m']:<6d} {r['dtype']:4s} "
            f"{r['base']:{fmt}} -> {r['new']:{fmt}} {unit}  x{r['ratio']:.2f}"
        )

    for title, key, unit, fmt in (
        ("SLOWER", "slower", "s", ".3f"),
        ("MORE PEAK MEMORY", "heavier", "MiB", ".0f"),
        ("faster", "faster", "s", ".3f"),
    ):
        items = sorted(result[key], key=lambda r: -r["ratio"] if key != "faster" else r["ratio"])
        if items:
            lines.append(f"{title} ({len(items)}):")
            lines += [row(r, unit, fmt) for r in items]
    if result["lost"]:
        lines.append(f"RAN BEFORE, SKIPPED NOW ({len(result['lost'])}):")
        lines += [f"  {r['backend']:15s} {r['regime']:9s} M={r['m']:<6d} {r['reason'][:80]}" for r in result["lost"]]
    if not (result["slower"] or result["heavier"] or result["lost"]):
        lines.append("nothing slower or heavier than the reference beyond the noise allowance")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__)
    ap.add_argument("new", help="JSON written by benchmarks/repulsion.py")
    ap.add_argument("--baseline", default=str(DEFAULT_BASELINE), help="reference JSON (default: the committed one)")
    ap.add_argument("--time-threshold", type=float, default=0.3, help="allowed relative time increase (0.3 = 30%%)")
    ap.add_argument("--time-floor", type=float, default=0.05, help="ignore time changes below this many seconds")
    ap.add_argument("--mem-threshold", type=float, default=0.2, help="allowed relative peak-memory increase")
    ap.add_argument("--mem-floor-mib", type=float, default=32.0, help="ignore peak-memory changes below this")
    ap.add_argument("--strict", action="store_true", help="exit 1 when something got slower or heavier")
    args = ap.parse_args(argv)
    base, new = (json.loads(Path(p).read_text()) for p in (args.baseline, args.new))
    result = compare(
        base,
        new,
        time_threshold=args.time_threshold,
        time_floor=args.time_floor,
        mem_threshold=args.mem_threshold,
        mem_floor_mib=args.mem_floor_mib,
    )
    print("\n".join(report(result, time_threshold=args.time_threshold, mem_threshold=args.mem_threshold)))
    regressed = bool(result["slower"] or result["heavier"] or result["lost"])
    return 1 if args.strict and regressed else 0


if __name__ == "__main__":
    sys.exit(main())
