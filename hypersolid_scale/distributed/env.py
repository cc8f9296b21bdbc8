"""Process-group setup from torchrun's or Slurm's environment (one code path for both launchers).

torchrun exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT. ``srun`` exports
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID and the node list; there MASTER_ADDR is the first host of
SLURM_JOB_NODELIST unless the sbatch script exported it already. A plain ``python`` run is world size 1
and creates no process group at all.
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" | "slurm" | "single"


def world_info_from_env(env: dict[str, str] | None = None) -> WorldInfo:
    """Rank, world size and local rank, from torchrun's variables first, then Slurm's."""
    env = dict(os.environ) if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return WorldInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torchrun")
    # SLURM_NTASKS is set inside any allocation; only trust it under srun, where SLURM_STEP_ID exists too,
    # so that `python train.py` inside an salloc shell stays a single process.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        return WorldInfo(int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0")), "slurm")
    return WorldInfo(0, 1, 0, "single")


def first_host(nodelist: str) -> str:
    """First hostname of a Slurm node list: ``gpu[003-005,7],cpu1`` -> ``gpu003``.

    Uses ``scontrol show hostnames`` when available (it knows every syntax), else a parser for the
    common ``prefix[a-b,c]`` forms.
    """
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if m is None:
        raise ValueError(f"cannot parse Slurm node list {nodelist!r}; export MASTER_ADDR in the sbatch script")
    prefix, ranges = m.group(1), m.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _slurm_rendezvous(env: dict[str, str]) -> None:
    """Fill MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE / LOCAL_RANK for ``init_process_group``."""
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ValueError("running under srun but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; "
                             "export MASTER_ADDR=<first node> in the sbatch script")
        os.environ["MASTER_ADDR"] = first_host(nodelist)
    if "MASTER_PORT" not in env:
        # Derived from the job id so concurrent jobs on a shared node do not collide.
        os.environ["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)


def resolve_device(device: str, local_rank: int) -> torch.device:
    """``auto``: the local rank's GPU when CUDA is present, else the CPU."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("dist.device=cuda but no CUDA device is visible; use dist.device=auto or cpu")
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def resolve_backend(backend: str, device: torch.device) -> str:
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("dist.backend=nccl needs CUDA devices; use dist.backend=gloo (or auto) on CPU")
    return backend


def init_distributed(device: str = "auto", backend: str = "auto", timeout_minutes: int = 30) -> tuple[WorldInfo, torch.device]:
    """Create the default process group (if world size > 1) and pick this rank's device."""
    info = world_info_from_env()
    dev = resolve_device(device, info.local_rank)
    if info.world_size > 1 and not dist.is_initialized():
        if info.launcher == "slurm":
            _slurm_rendezvous(dict(os.environ))
        os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank))
        dist.init_process_group(
            backend=resolve_backend(backend, dev),
            rank=info.rank,
            world_size=info.world_size,
            timeout=datetime.timedelta(minutes=timeout_minutes),
            device_id=dev if dev.type == "cuda" else None,
        )
    return info, dev


def all_reduce_max_flag(flag: bool) -> bool:
    """True on every rank if it is True on any rank (used for preemption: one signalled rank stops all)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    backend = dist.get_backend()
    t = torch.tensor([1.0 if flag else 0.0], device="cuda" if backend == "nccl" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def broadcast_object(obj: object, src: int = 0) -> object:
    """Rank ``src``'s Python object on every rank (small things: a checkpoint path, a run id)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: object) -> list[object] | None:
    """Every rank's object, as a list on rank 0 (None elsewhere). Used to collect ZeRO optimizer shards."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out: list[object] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def cleanup() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
