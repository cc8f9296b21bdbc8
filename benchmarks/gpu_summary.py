"""Collect the parts of benchmarks/gpu_suite.sh into DIR/summary.json (+ DIR/cuda_tests.png).

    python -m benchmarks.gpu_summary --out DIR --device cuda --quick 0 --command "..." --started EPOCH_S

summary.json: card, torch, date, command, and per part: ``status`` (ok | partial | failed | skipped), rc, seconds,
its numbers (the part's own JSON, inlined), and for a failed part the tail of its log. A part with no
numbers always carries a ``skipped`` reason.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, cast

from benchmarks import common
from hypersolid_scale.safety import atomic

PARTS: dict[str, Any] = {
    "cuda_tests": None,
    "repulsion": "repulsion.json",
    "ring_hop": "ring_hop.json",
    "train_throughput": "train_throughput.json",
    "loaders": "loaders.json",
    # Two benchmarks in one part: its results are {"loaders": ..., "trainer": ...}, each where written.
    "photo": {"loaders": "photo_loaders.json", "trainer": "photo_trainer.json"},
    "speed": "gpu_speed.json",
}


def junit_counts(path: Path) -> dict[str, Any]:
    """passed / failed / errors / skipped counts and the failed tests' messages, from pytest's junit XML."""
    root = ET.parse(path).getroot()
    counts: dict[str, Any] = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            counts["failed" if "failure" in kinds else "errors"] += 1
            node = cast(ET.Element, case.find("failure") if "failure" in kinds else case.find("error"))
            counts["failures"].append(
                {"test": name, "message": (node.get("message") or "")[:500], "tail": (node.text or "")[-1500:]}
            )
        elif "skipped" in kinds:
            counts["skipped"] += 1
            skipped = cast(ET.Element, case.find("skipped"))
            counts.setdefault("skip_reasons", {})[name] = (skipped.get("message") or "")[:200]
        else:
            counts["passed"] += 1
    return counts


def log_tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def collect(out: Path) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    for name, result in PARTS.items():
        status_file = out / f"{name}.status.json"
        if not status_file.is_file():
            parts[name] = {"status": "skipped", "skipped": "the part did not run (no status file)"}
            continue
        entry: dict[str, Any] = json.loads(status_file.read_text())
        data = None
        try:
            if name == "cuda_tests":
                data = junit_counts(out / "cuda_tests.xml")
            elif isinstance(result, dict):
                data = {k: json.loads((out / f).read_text()) for k, f in result.items() if (out / f).is_file()} or None
            elif result is not None and (out / result).is_file():  # None: cuda_tests, read above
                data = json.loads((out / result).read_text())
        except (OSError, ValueError, ET.ParseError) as err:
            entry["parse_error"] = f"{type(err).__name__}: {err}"
        if data is not None:
            entry["results"] = data
        ran = data is not None and (name != "cuda_tests" or sum(data[k] for k in ("passed", "failed", "errors")) > 0)
        if entry["rc"] == 0 and ran:
            entry["status"] = "ok"
        elif entry["rc"] == 0 or (name == "cuda_tests" and entry["rc"] == 5):
            # pytest exit 5: nothing selected; all tests skipped (no GPU) also lands here.
            entry["status"] = "skipped"
            reasons = sorted(set((data or {}).get("skip_reasons", {}).values()))
            entry["skipped"] = "; ".join(reasons)[:500] or "no CUDA test ran"
        else:
            why = "timed out" if entry.get("timed_out") else f"exit code {entry['rc']}"
            # The benchmarks write their JSON as they go: numbers from before the cut are kept.
            entry["status"] = "partial" if ran and name != "cuda_tests" else "failed"
            entry["skipped"] = f"{'cut short' if ran else 'failed'} ({why}); see error_tail"
            entry["error_tail"] = log_tail(out / f"{name}.log")
        if name == "cuda_tests" and data is not None and data["failed"] + data["errors"] > 0:
            entry["status"] = "failed"
            entry["error_tail"] = log_tail(out / f"{name}.log")
        parts[name] = entry
    return parts


def plot_tests(parts: dict[str, Any], path: Path) -> None:
    counts = parts.get("cuda_tests", {}).get("results", {})
    keys = ["passed", "failed", "errors", "skipped"]
    with common.figure(path, 100, figsize=(5, 3)) as (_, ax):
        ax.bar(keys, [counts.get(k, 0) for k in keys], color=["tab:green", "tab:red", "tab:orange", "tab:gray"])
        ax.set_title("pytest -m cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", default="0")
    ap.add_argument("--command", default="")
    ap.add_argument("--started", type=float, default=time.time())
    args = ap.parse_args(argv)
    out = Path(args.out)
    summary: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": args.command,
        "device": args.device,
        "quick": args.quick == "1",
        "host": platform.node(),
        "seconds_total": time.time() - args.started,
    }
    try:
        import torch

        summary["torch"] = torch.__version__
        summary["card"] = common.card() if torch.cuda.is_available() else None
        summary["cuda"] = torch.version.cuda
    except Exception as err:  # noqa: BLE001 - the summary is written whatever broke
        summary["torch"] = f"unavailable: {err}"
    summary["parts"] = collect(out)
    atomic.write_text((out / "summary.json"), json.dumps(summary, indent=1, default=str))
    try:
        plot_tests(summary["parts"], out / "cuda_tests.png")
    except Exception as err:  # noqa: BLE001
        print(f"cuda_tests.png not written: {err}")
    for name, part in summary["parts"].items():
        print(f"{name:17s} {part['status']:8s} {part.get('seconds', '-')}s  {part.get('skipped', '')[:150]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
