"""The default process group, set up from torchrun's or Slurm's environment (one code path for both launchers).

torchrun exports RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT, and the group joins through the
store its agent hosts there, under a prefix that the attempt's ranks agree on (:func:`elastic_store`). ``srun`` exports
SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID and the node list; there MASTER_ADDR is the first host of
SLURM_JOB_NODELIST unless the sbatch script exported it already. A plain ``python`` run is world size 1
and :func:`init_distributed` creates no process group at all; only DeepSpeed, which always talks through one,
asks for a one-rank group (:func:`ensure_process_group`), created here and nowhere else.

The transport is the process group's communication library: gloo (CPU) or nccl (CUDA).
"""

from __future__ import annotations

import datetime
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.safety.process_exit import needs_quick_exit

TRANSPORTS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    launcher: str  # "torchrun" | "slurm" | "single"


def has_process_group() -> bool:
    """True when a default process group exists (of any size). Every collective checks this first."""
    return dist.is_available() and dist.is_initialized()


def world_info_from_env(env: dict[str, str] | None = None) -> WorldInfo:
    """Rank, world size and local rank, from torchrun's variables first, then Slurm's."""
    env = dict(os.environ) if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return WorldInfo(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torchrun")
    # SLURM_NTASKS is set inside any allocation; only trust it under srun, where SLURM_STEP_ID exists too,
    # so that `python train.py` inside an salloc shell stays a single process.
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        return WorldInfo(
            int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0")), "slurm"
        )
    return WorldInfo(0, 1, 0, "single")


def first_host(nodelist: str) -> str:
    """First hostname of a Slurm node list: ``gpu[003-005,7],cpu1`` -> ``gpu003``.

    Uses ``scontrol show hostnames`` when available (it knows every syntax), else a parser for the
    common ``prefix[a-b,c]`` forms.
    """
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10, check=True
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    m = re.match(r"([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if m is None:
        raise ConfigError(f"cannot parse Slurm node list {nodelist!r}; export MASTER_ADDR in the sbatch script")
    prefix, ranges = m.group(1), m.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def _slurm_rendezvous(env: dict[str, str]) -> None:
    """Fill MASTER_ADDR / MASTER_PORT for ``init_process_group`` under srun."""
    if "MASTER_ADDR" not in env:
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
        if not nodelist:
            raise ConfigError(
                "running under srun but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; "
                "export MASTER_ADDR=<first node> in the sbatch script"
            )
        os.environ["MASTER_ADDR"] = first_host(nodelist)
    if "MASTER_PORT" not in env:
        # Derived from the job id so concurrent jobs on a shared node do not collide.
        os.environ["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)


def resolve_device(device: str, local_rank: int) -> torch.device:
    """``auto``: the local rank's GPU when CUDA is present, else the CPU."""
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("dist.device=cuda but no CUDA device is visible; use dist.device=auto or cpu")
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    return torch.device("cuda", torch.cuda.current_device())


def resolve_transport(transport: str, device: torch.device) -> str:
    """``auto``: nccl for CUDA devices, gloo otherwise."""
    if transport not in TRANSPORTS:
        raise ConfigError(f"dist.transport={transport!r} is not known; choose one of: {' | '.join(TRANSPORTS)}")
    if transport == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if transport == "nccl" and device.type != "cuda":
        raise ConfigError("dist.transport=nccl needs CUDA devices; use dist.transport=gloo (or auto) on CPU")
    return transport


def _export_rank_env(info: WorldInfo) -> None:
    # Libraries that join the group later (DeepSpeed reads LOCAL_RANK) look these up in the environment.
    os.environ.update(RANK=str(info.rank), WORLD_SIZE=str(info.world_size), LOCAL_RANK=str(info.local_rank))


def elastic_restart(env: dict[str, str] | None = None) -> tuple[int, int] | None:
    """``(n, N)`` when this group is torchrun's restart n of at most N (``--max-restarts``), else None."""
    env = dict(os.environ) if env is None else env
    count = int(env.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    return (count, int(env.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)) if count > 0 else None


def elastic_store(rank: int, world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """torchrun's agent store, with this attempt's keys apart from every earlier attempt's; None when the workers
    do not share the agent's store (Slurm, a plain run, ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``).

    The agent keeps ONE store for all its attempts (the static rendezvous keeps its TCPStore; the c10d one shares
    its own), and torch's ``env://`` puts no attempt prefix on the group's keys: after a restart
    (``--max-restarts``) the new ranks would read the dead group's addresses, still in the store (gloo:
    "connectFullMesh failed ... Connection refused"; nccl: the old unique id), and never meet. The attempt's
    prefix is agreed on by the ranks themselves (:func:`attempt_token`), not taken from
    ``TORCHELASTIC_RESTART_COUNT``: each node's agent counts its own restarts, and one whose healthy workers are
    restarted because another node asks for a new rendezvous does not count one, so the counts differ across
    nodes (docs/cluster.md).
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    return dist.PrefixStore(f"/worker/attempt_{attempt_token(agent, rank, world_size, timeout)}/default_pg", agent)


JOIN_PREFIX = "/hypersolid/join"


def attempt_token(store: dist.Store, rank: int, world_size: int, timeout: datetime.timedelta) -> str:
    """A token the same on every rank of this attempt and never seen by an earlier attempt, agreed on through
    ``store``, which still holds what earlier attempts' ranks wrote there.

    Rank 0 draws the token. Every other rank writes a fresh nonce of its own under its rank
    (``<JOIN_PREFIX>/hello/<rank>``) and waits for rank 0's answer under the key named by that nonce, a key no
    earlier attempt can have written. Rank 0 answers every nonce it finds, stale ones included (nobody waits on
    those), until every rank has said under the token's own keys that it has it. Every rank of an earlier
    attempt is dead before this attempt's start (a rendezvous round closes only after each agent stopped its
    workers), so what is written after the start is this attempt's. Written by hand: torch's rendezvous gives
    workers no identifier of the round that the nodes agree on.
    """
    mine = uuid.uuid4().hex
    if rank != 0:
        store.set(f"{JOIN_PREFIX}/hello/{rank}", mine)
        token = store.get(f"{JOIN_PREFIX}/answer/{mine}").decode()  # waits up to the store's timeout
        store.add(f"{JOIN_PREFIX}/{token}/joined", 1)
        return token
    hellos = [f"{JOIN_PREFIX}/hello/{r}" for r in range(1, world_size)]
    answered: list[bytes] = [b""] * len(hellos)
    deadline = time.monotonic() + timeout.total_seconds()
    if hellos:
        store.wait(hellos, timeout)  # each rank's key exists (this attempt's nonce, or an earlier one's)
    while store.add(f"{JOIN_PREFIX}/{mine}/joined", 0) < world_size - 1:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"rank 0 waited {timeout} for the other {world_size - 1} rank(s) to join this attempt through "
                "torchrun's store; start one torchrun per node with the same --nnodes and --rdzv-endpoint"
            )
        for i, nonce in enumerate(store.multi_get(hellos)):  # one round trip for every rank's newest nonce
            if nonce != answered[i]:
                store.set(f"{JOIN_PREFIX}/answer/{nonce.decode()}", mine)
                answered[i] = nonce
        time.sleep(0.005)
    return mine


def init_distributed(
    device: str = "auto", transport: str = "auto", timeout_minutes: int = 30
) -> tuple[WorldInfo, torch.device]:
    """Create the default process group (if world size > 1) and pick this rank's device."""
    info = world_info_from_env()
    dev = resolve_device(device, info.local_rank)
    if info.world_size > 1 and not has_process_group():
        if info.launcher == "slurm":
            _slurm_rendezvous(dict(os.environ))
        _export_rank_env(info)
        timeout = datetime.timedelta(minutes=timeout_minutes)
        needs_quick_exit()  # gloo's threads can abort the interpreter's teardown: safety/process_exit.py
        dist.init_process_group(
            backend=resolve_transport(transport, dev),
            store=elastic_store(info.rank, info.world_size, timeout),  # None: env:// (MASTER_ADDR / MASTER_PORT)
            rank=info.rank,
            world_size=info.world_size,
            timeout=timeout,
            device_id=dev if dev.type == "cuda" else None,
        )
    return info, dev


def ensure_process_group(device: torch.device) -> None:
    """Make sure a default process group exists; in a single process, create a one-rank group.

    The one-rank group rendezvous through an in-memory store, so it needs no address and no port. Under a
    launcher (world size > 1) the group must come from :func:`init_distributed`: a rank must not go on alone.
    """
    if has_process_group():
        return
    info = world_info_from_env()
    if info.world_size > 1:
        raise RuntimeError(
            f"this is rank {info.rank} of {info.world_size} ({info.launcher}) but no process group "
            "exists; call init_distributed() before building the engine"
        )
    _export_rank_env(info)
    needs_quick_exit()  # gloo's threads can abort the interpreter's teardown: safety/process_exit.py
    dist.init_process_group(resolve_transport("auto", device), store=dist.HashStore(), rank=0, world_size=1)


def cleanup() -> None:
    """Destroy the default process group, if there is one."""
    if has_process_group():
        dist.destroy_process_group()
