"""The device stage alone, on cached decoded batches: what it costs the device and the host per batch.

    python -m benchmarks.stage_alone --device cuda [--batch 128] [--batches 8] [--out DIR]
    python -m benchmarks.stage_alone --device cpu --quick       # batch 8, 1 batch

Data: photo-like JPEGs (smooth random colours, 375-500 px a side, as ImageNet's), their view parameters drawn
as the PIL path draws them, decoded once by the stage (`DeviceStage.decode`) and kept: the rows time only
`DeviceStage.views_of` (draws sent, images packed, crops, photometric chain, the cast), the default preset's
2 x 224 + 6 x 96 views, with the preset's blur and with the blur off. The chain as the trainer runs it: compiled
by `prepare` on CUDA, eager on the CPU.

Per row: device ms per batch and per phase (CUDA events around each phase where CUDA exists; on the CPU the
wall time, which is the device's work there), host ms per batch (the calling thread's CPU time), and the
operator calls per batch (torch.profiler: what the Python code asks of torch). Writes stage_alone.json into
--out with the card, torch and commit.
"""

from __future__ import annotations

import io
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from benchmarks import common
from benchmarks.device_stage import draws, operator_calls
from hypersolid_scale.data import PRESETS
from hypersolid_scale.data.device.views import DeviceStage
from hypersolid_scale.safety import atomic


def photo_jpegs(n: int, seed: int) -> list[bytes]:
    """n smooth JPEGs of 375-500 px a side (random colours, bilinearly enlarged)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        h, w = (int(v) for v in rng.integers(375, 501, 2))
        small = rng.integers(0, 256, (h // 16 + 1, w // 16 + 1, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((w, h), Image.Resampling.BILINEAR).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class Phases:
    """`DeviceStage.views_of`'s `mark`: the device time of each phase, summed over the batches."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []

    def start(self) -> None:
        self.marks = [("start", self._now())]

    def __call__(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def add_to(self, totals: dict[str, float]) -> None:
        """Add this batch's ms per phase to `totals` (after a synchronisation on CUDA)."""
        for (_, a), (phase, b) in zip(self.marks, self.marks[1:]):
            totals[phase] += a.elapsed_time(b) if self.cuda else 1000 * (b - a)


def measure(preset: Any, device: torch.device, batches: list[tuple[Any, Any]], batch: int) -> dict[str, Any]:
    stage = DeviceStage(preset, device)
    chain = stage.prepare(batch)
    stage.views_of(*batches[0])  # warm-up: library handles, allocator pools
    common.sync(device)
    phases, totals, host = Phases(device), defaultdict[str, float](float), 0.0
    t0 = time.perf_counter()
    for images, params in batches:
        phases.start()
        h0 = time.thread_time()
        stage.views_of(images, params, mark=phases)
        host += time.thread_time() - h0
        common.sync(device)
        phases.add_to(totals)
    wall = time.perf_counter() - t0
    n = len(batches)
    return {
        "photometric_chain": chain,
        "device_ms_per_batch": sum(totals.values()) / n,
        "device_ms_per_phase": {k: v / n for k, v in totals.items()},
        "host_ms_per_batch": 1000 * host / n,
        "wall_ms_per_batch": 1000 * wall / n,
        "operator_calls_per_batch": operator_calls(lambda: stage.views_of(*batches[0])),
    }


def run(args: Any) -> dict[str, Any]:
    device = torch.device(args.device)
    preset = PRESETS["default"]
    decoder = DeviceStage(preset, device)
    # Decoded once and kept on the device, with the PIL path's draws.
    batches = [
        decoder.decode(draws(preset, photo_jpegs(args.batch, seed=b), b * args.batch)) for b in range(args.batches)
    ]
    rows = {
        "blur_on": measure(preset, device, batches, args.batch),
        "blur_off": measure(replace(preset, blur_probs=(0.0, 0.0, 0.0)), device, batches, args.batch),
    }
    return {
        **common.metadata(device),
        "batch": args.batch,
        "batches": args.batches,
        "views": preset.view_sizes(),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__)
    common.add_device(p)
    common.add_quick(p, "batch 8, 1 batch (a CPU check of the code)")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=8)
    common.add_out(p, "stage_alone", "folder for stage_alone.json")
    args = p.parse_args(argv)
    common.check_device(args.device)
    if args.quick:
        args.batch, args.batches = 8, 1
    res = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(Path(args.out) / "stage_alone.json", res, indent=2)
    for name, row in res["rows"].items():
        phases = ", ".join(f"{k} {v:.1f}" for k, v in row["device_ms_per_phase"].items())
        print(
            f"{name}: device {row['device_ms_per_batch']:.1f} ms/batch ({phases}); host {row['host_ms_per_batch']:.1f} "
            f"ms; {row['operator_calls_per_batch']} calls; chain {row['photometric_chain']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
