"""Checkpoints on many ranks, on the CPU (gloo): the step's stall per checkpoint, one file against sharded parts
written synchronously and asynchronously, and the bytes each rank reads at a resume, at P = 2 and 4 ranks.

    python -m benchmarks.checkpoint_shards                       # ResNet-18, P = 2 and 4, DDP and ZeRO 2
    python -m benchmarks.checkpoint_shards --worlds 2 --reps 1   # a quick subset
    python -m benchmarks.checkpoint_shards --out benchmarks/results/checkpoint_shards   # the committed results

Each rank trains a ResNet-18 (torchvision's, 11.7 M parameters; SGD with momentum) on 2 images of 32 x 32 a step
under ``dist.engine=ddp`` or DeepSpeed ZeRO 2, and in each timed window takes one step, saves (or not), takes
``--after`` more steps and waits for the save to be complete. Four ways to save (docs/design.md §5):

* ``none``: no checkpoint, the window's baseline;
* ``file``: ``checkpoint.format=file``: the optimizer state gathered on rank 0 (ZeRO's shards), which writes one
  file while the others wait;
* ``sharded-sync``: ``checkpoint.format=sharded``, ``async_save=false``: every rank writes its part at once;
* ``sharded-async``: ``async_save=true``: the parts are copied, then written by a background thread while the
  steps go on.

``stall_s``: the window's wall time (slowest rank) minus the ``none`` window's: what a checkpoint costs the
training, the median over ``--reps`` windows. ``save_call_s``: how long the save call itself held the loop.
``resume_read_mib``: what one rank reads at a resume on the same world size: the whole file for ``file``; for
``sharded`` the weights and its engine's part of the optimizer state (``checkpoint.resume.read_own_part``), the
largest and smallest over the ranks. All of it is CPU time on a 2-core machine shared by the P ranks (and by
whatever else runs on it: ``load_average`` in the JSON), not a cluster's file system: the ratios are the result.

Writes runs/bench/checkpoint_shards/checkpoint_shards.json and .png (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from hypersolid_scale.safety import atomic

MODES = ("none", "file", "sharded-sync", "sharded-async")
ENGINES = {"ddp": ("ddp", 0), "zero2": ("deepspeed", 2)}


def _worker(rank: int, world: int, args: argparse.Namespace, out_dir: str) -> list[dict[str, Any]]:
    """One rank's rows (``common.spawn_ranks``); its checkpoints go in ``out_dir``."""
    import torch
    import torchvision

    from hypersolid_scale import checkpoint as ck
    from hypersolid_scale.checkpoint.resume import read_own_part
    from hypersolid_scale.distributed import barrier, cleanup, init_distributed
    from hypersolid_scale.distributed.engines import build_engine

    torch.set_num_threads(1)
    init_distributed("cpu", "gloo")
    rows = []
    for label, (kind, stage) in ENGINES.items():
        torch.manual_seed(0)
        engine = build_engine(
            torchvision.models.resnet18(num_classes=128),
            lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9),
            engine=kind,
            device=torch.device("cpu"),
            bf16=False,
            grad_clip=0.0,
            sync_bn=False,
            zero_stage=stage,
            batch_size_per_gpu=2,
        )
        x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(rank))
        run_dir = Path(out_dir) / f"{label}-run"
        step = functools.partial(_step, engine, x)
        save = functools.partial(_save, engine, run_dir, rank, world)

        for _ in range(2):  # warm-up: gloo's pairs, DeepSpeed's buffers, the allocator
            step()
        at = 0
        for mode in MODES:
            windows, calls = [], []
            for _ in range(args.reps):
                barrier()
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                at += 1
                pending = None if mode == "none" else save(mode, at)
                calls.append(time.perf_counter() - t1)
                for _ in range(args.after):
                    step()
                if pending is not None:
                    pending.wait()
                barrier()
                windows.append(time.perf_counter() - t0)
            rows.append({"engine": label, "mode": mode, "rank": rank, "window_s": windows, "save_call_s": calls})
        # A resume's reads: the single file whole on every rank; of the sharded folder, what this rank needs.
        barrier()
        save("file", at + 1)
        file_bytes = ck.checkpoint_path(run_dir, at + 1).stat().st_size
        save("sharded-sync", at + 2)
        t0 = time.perf_counter()
        part = read_own_part(ck.open_checkpoint(ck.list_checkpoints(run_dir)[-1]), engine)
        rows.append(
            {
                "engine": label,
                "mode": "resume",
                "rank": rank,
                "file_read_bytes": file_bytes,
                "sharded_read_bytes": int(part["bytes_read"]),
                "sharded_read_s": time.perf_counter() - t0,
            }
        )
        barrier()
    cleanup()
    return rows


def _step(engine: Any, x: Any) -> None:
    engine.backward(engine.wrapped(x).pow(2).mean())
    engine.step()


def _save(engine: Any, run_dir: Path, rank: int, world: int, mode: str, at: int) -> Any:
    """One checkpoint at step ``at``, as the trainer writes it (``training/checkpointer.py``) less the run's
    small entries (config, loader, RNG)."""
    from hypersolid_scale import checkpoint as ck
    from hypersolid_scale.checkpoint.collect import engine_parts
    from hypersolid_scale.checkpoint.layout import split_method_state
    from hypersolid_scale.checkpoint.sharded import save_sharded
    from hypersolid_scale.distributed import barrier

    meta = {"step": at, "epoch": 0, "config": {}, "config_fingerprint": "", "world_size": world}
    if mode == "file":
        optimizer = engine.optimizer_state()  # collective under ZeRO: the shards gathered on rank 0
        if rank == 0:
            model, _ = split_method_state(engine.model.state_dict())
            ck.save_checkpoint(run_dir, {**meta, "model": model, "optimizer": optimizer}, keep_last=1)
        barrier()
        return None
    tensors, rest = engine_parts(engine)
    meta.update(rest)
    return save_sharded(
        run_dir,
        at,
        tensors,
        meta if rank == 0 else None,
        keep_last=1,
        asynchronous=mode == "sharded-async",
        agree=_then_barrier,
    )


def _then_barrier(fn: Any) -> Any:
    """``save_sharded``'s agreement without a run's error reporting: run it, then wait for every rank."""
    from hypersolid_scale.distributed import barrier

    result = fn()
    barrier()
    return result


def measure(world: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every engine and way to save on ``world`` spawned gloo ranks: one row each, over the ranks."""
    per_rank = common.spawn_ranks(_worker, world, args, args.scratch)
    out = []
    for i, first in enumerate(per_rank[0]):
        ranks = [rows[i] for rows in per_rank]
        row: dict[str, Any] = {"world": world, "engine": first["engine"], "mode": first["mode"]}
        if first["mode"] == "resume":
            row.update(
                file_read_mib=first["file_read_bytes"] / 2**20,
                sharded_read_mib_max=max(r["sharded_read_bytes"] for r in ranks) / 2**20,
                sharded_read_mib_min=min(r["sharded_read_bytes"] for r in ranks) / 2**20,
                sharded_read_s=max(r["sharded_read_s"] for r in ranks),
            )
        else:
            slowest = [max(ws) for ws in zip(*(r["window_s"] for r in ranks))]  # per window, the slowest rank
            row.update(
                window_s=statistics.median(slowest),
                windows_s=slowest,
                save_call_s=statistics.median(max(cs) for cs in zip(*(r["save_call_s"] for r in ranks))),
            )
        out.append(row)
    for row in out:  # the stall: each window against the same world and engine's window without a checkpoint
        if "window_s" in row:
            base = next(r for r in out if (r["engine"], r["mode"]) == (row["engine"], "none"))
            row["stall_s"] = row["window_s"] - base["window_s"]
    return out


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per world size and engine: the asynchronous stall over the synchronous ones, and a rank's resume read
    against the whole file."""
    out: dict[str, Any] = {}
    for world in sorted({r["world"] for r in rows}):
        for engine in ENGINES:
            got = {r["mode"]: r for r in rows if (r["world"], r["engine"]) == (world, engine)}
            ratio = lambda a, b: a / b if b > 0 else None  # noqa: E731 - a stall at or below the noise: no ratio
            out[f"P{world}-{engine}"] = {
                "async_stall_over_file_stall": ratio(got["sharded-async"]["stall_s"], got["file"]["stall_s"]),
                "async_stall_over_sync_stall": ratio(got["sharded-async"]["stall_s"], got["sharded-sync"]["stall_s"]),
                "resume_read_max_rank_over_file": got["resume"]["sharded_read_mib_max"]
                / got["resume"]["file_read_mib"],
            }
    return out


def plot(rows: list[dict[str, Any]], path: Path, dpi: int) -> Path:
    worlds = sorted({r["world"] for r in rows})
    with common.figure(path, dpi, 1, 2, figsize=(11, 4)) as (fig, (ax_stall, ax_read)):
        labels, width = [], 0.8 / (len(MODES) - 1)
        for i, mode in enumerate(MODES[1:]):
            xs, ys = [], []
            for j, (world, engine) in enumerate((w, e) for w in worlds for e in ENGINES):
                r = next(r for r in rows if (r["world"], r["engine"], r["mode"]) == (world, engine, mode))
                xs.append(j + i * width)
                ys.append(r["stall_s"])
                if i == 0:
                    labels.append(f"P={world}\n{engine}")
            ax_stall.bar(xs, ys, width, label=mode)
        ax_stall.set_xticks([j + width for j in range(len(labels))], labels)
        ax_stall.set_ylabel("stall per checkpoint (s, slowest rank)")
        ax_stall.set_title("The step's stall per checkpoint (CPU, gloo)")
        ax_stall.legend()
        resumes = [r for r in rows if r["mode"] == "resume"]
        names = [f"P={r['world']}\n{r['engine']}" for r in resumes]
        xs = list(range(len(resumes)))
        ax_read.bar([x - 0.2 for x in xs], [r["file_read_mib"] for r in resumes], 0.4, label="file (every rank)")
        ax_read.bar(
            [x + 0.2 for x in xs], [r["sharded_read_mib_max"] for r in resumes], 0.4, label="sharded (largest rank)"
        )
        ax_read.set_xticks(list(xs), names)
        ax_read.set_ylabel("MiB read per rank at a resume")
        ax_read.set_title("What a rank reads to resume")
        ax_read.legend()
    return path


def main(argv: list[str] | None = None) -> None:
    p = common.parser(__doc__)
    common.add_out(p, "checkpoint_shards")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--reps", type=int, default=3, help="timed windows per way to save")
    p.add_argument("--after", type=int, default=6, help="steps after the save in each window")
    p.add_argument("--scratch", default=None, help="where the checkpoints are written (default: the temp folder)")
    args = p.parse_args(argv)
    out = Path(args.out)
    rows = [row for world in args.worlds for row in measure(world, args)]
    result = {
        "meta": common.metadata("cpu"),
        "model": "torchvision resnet18 (num_classes=128), SGD momentum, 2 images of 32x32 a rank",
        "after_steps": args.after,
        "reps": args.reps,
        "rows": rows,
        "summary": summarize(rows),
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / "checkpoint_shards.json", json.dumps(result, indent=1))
    plot(rows, out / "checkpoint_shards.png", 120)
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
