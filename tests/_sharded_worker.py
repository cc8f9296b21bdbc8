"""One link of tests/test_checkpoint_sharded.py's chain of world sizes, on every rank (run under torchrun).

For each engine (DDP, DeepSpeed ZeRO 1 and 2) a small network of odd-sized layers, so that ZeRO's partitions cut
through parameters: resume from the previous link's sharded checkpoint (written on another world size) as the
trainer does (``read_own_part``, each rank reading only its part), check what was put back against the whole
checkpoint read in one process, train ``--steps`` AdamW steps on a fixed global batch split over the
ranks, and save a sharded checkpoint asynchronously. Rank 0 writes the bytes of optimizer state each rank read,
and the whole state's, to ``<out>/read.json``.

    python -m torch.distributed.run --nproc_per_node=W tests/_sharded_worker.py --out DIR [--prev DIR] --steps N
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from hypersolid_scale.checkpoint import list_checkpoints, load_checkpoint, open_checkpoint
from hypersolid_scale.checkpoint.collect import engine_parts
from hypersolid_scale.checkpoint.resume import read_own_part
from hypersolid_scale.checkpoint.sharded import read_optimizer, save_sharded
from hypersolid_scale.distributed.collectives import gather_objects
from hypersolid_scale.distributed.engines import build_engine
from hypersolid_scale.training.run_builder import on_every_rank

GLOBAL_BATCH = 12  # divisible by every world size of the chain (4, 3, 2)
ENGINES = {"ddp": ("ddp", 0), "zero1": ("deepspeed", 1), "zero2": ("deepspeed", 2)}


def network() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(13, 7), nn.Tanh(), nn.Linear(7, 5), nn.Tanh(), nn.Linear(5, 3))


def batch(step: int) -> torch.Tensor:
    return torch.randn(GLOBAL_BATCH, 13, generator=torch.Generator().manual_seed(1000 + step))


def optimizer(params: object) -> torch.optim.Optimizer:
    """AdamW: per-element state (two moments) and a per-group scalar (its step), both of which must travel."""
    return torch.optim.AdamW(params, lr=0.01, weight_decay=1e-2)  # type: ignore[arg-type]


def loss_of(out: torch.Tensor) -> torch.Tensor:
    return (out - 0.5).pow(2).mean()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prev", type=Path, default=None)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // world
    read: dict[str, list] = {}
    for label, (kind, stage) in ENGINES.items():
        engine = build_engine(
            network(), optimizer, engine=kind, device=torch.device("cpu"), bf16=False, grad_clip=0.0, sync_bn=False,
            zero_stage=stage, batch_size_per_gpu=per_rank,
        )
        step = 0
        if args.prev is not None:
            path = list_checkpoints(args.prev / label)[-1]
            ckpt = read_own_part(open_checkpoint(path), engine)
            engine.load_model_state(ckpt["model"])
            engine.load_optimizer_pieces(ckpt["optimizer"]["pieces"], ckpt["optimizer"]["plain"])
            step = int(ckpt["step"])
            # What this rank holds now is exactly its part of the whole checkpoint.
            whole = load_checkpoint(path)
            for name, value in engine.model.state_dict().items():
                assert torch.equal(value, whole["model"][name]), (label, name)
            mine, _ = engine.optimizer_pieces()
            assert mine, label
            for name, keys in mine.items():
                for key, (first, flat) in keys.items():
                    saved = whole["optimizer"]["pieces"][name][key][1]
                    assert torch.equal(flat, saved[first : first + flat.numel()]), (label, name, key, first)
            # Bytes of the optimizer state read: this rank's part, and the whole of it for comparison.
            _, mine_read = read_optimizer(ckpt, engine.needed_ranges())
            _, whole_read = read_optimizer(ckpt, None)
            read[label] = [gather_objects(mine_read) or [], whole_read]
        for t in range(step, step + args.steps):
            x = batch(t)[rank * per_rank : (rank + 1) * per_rank]
            loss = loss_of(engine.wrapped(x))
            engine.backward(loss)
            engine.step()
        step += args.steps
        tensors, rest = engine_parts(engine)
        meta = None
        if rank == 0:
            meta = {"step": step, "epoch": 0, "config": {}, "config_fingerprint": "", "world_size": world, **rest}
        pending = save_sharded(
            args.out / label, step, tensors, meta, keep_last=0, asynchronous=True,
            agree=lambda fn: on_every_rank(fn, rank),
        )
        pending.wait()
        dist.barrier()
    if rank == 0:
        (args.out / "read.json").write_text(json.dumps({"world_size": world, "bytes_read": read}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
