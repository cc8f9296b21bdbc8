"""The ``dist`` section: how the processes cooperate, its keys' choices and ranges beside the code that reads
them (the engines, the transports, the BatchNorm synchronisation, the precisions). ``config/schema.py`` checks
them with every other section's after merging."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypersolid_scale.distributed.batchnorm import SYNC_BN_CHOICES
from hypersolid_scale.distributed.engines import engine_names
from hypersolid_scale.distributed.precision import PRECISIONS
from hypersolid_scale.distributed.process_group import TRANSPORTS

# torch.compile's modes (training/compile_scope.py says which one a run gets)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")
ZERO_STAGES = (0, 1, 2)  # 3 would shard the weights the loss code sees
DEVICES = ("auto", "cpu", "cuda")


@dataclass
class DistConfig:
    """How processes cooperate. World size and rank come from torchrun / Slurm, never from here."""

    engine: str = "ddp"  # ddp | deepspeed
    transport: str = "auto"  # the process group's: auto (nccl on GPU, gloo on CPU) | gloo | nccl
    zero_stage: int = 0  # DeepSpeed ZeRO stage 0, 1 or 2 (3 would shard the weights the loss code sees)
    # BatchNorm statistics over the GLOBAL batch (docs/design.md §3b): auto (whenever world size > 1) | true | false.
    # CUDA uses torch's SyncBatchNorm, CPU/gloo hypersolid_scale.distributed.batchnorm.GlobalBatchNorm.
    sync_bn: str = "auto"
    compile: bool = False  # torch.compile the step (or the backbone only: training/compile_scope.py says when)
    # torch.compile's mode with dist.compile=true: default | reduce-overhead (CUDA graphs of the compiled forward and
    # backward, one process only) | max-autotune
    compile_mode: str = "default"
    # auto (bf16 autocast on a GPU that has it, else fp32) | bf16 (autocast) | fp32 | fp64 (the model and the views in
    # float64: N processes = 1 checked to ~1e-9 of the update, docs/design.md §3b). Formerly dist.bf16 (auto | true
    # | false), still read: auto -> auto, true -> bf16, false -> fp32 (both in one file or override and not the same:
    # an error).
    precision: str = "auto"
    device: str = "auto"  # auto | cpu | cuda
    timeout_minutes: int = 30  # process-group timeout
    # A rank or node that vanished (killed, powered off, its link cut) stops the others within about this many
    # seconds (a heartbeat through the rendezvous store: hypersolid_scale/distributed/heartbeat.py); 0 disables it,
    # leaving such a run waiting out timeout_minutes in its collective.
    peer_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        # YAML reads `sync_bn: true` as a boolean, which the str field stores as "True": keep accepting the
        # spelling of the former boolean option. Anything else outside CHOICES fails in `validate`.
        self.sync_bn = str(self.sync_bn).lower()


# A registry's names are looked up when a config is validated (an engine registered at run time is a choice).
CHOICES: dict[str, tuple[Any, ...] | Callable[[], tuple[Any, ...]]] = {
    "dist.engine": engine_names,
    "dist.transport": TRANSPORTS,
    "dist.zero_stage": ZERO_STAGES,
    "dist.precision": PRECISIONS,
    "dist.sync_bn": SYNC_BN_CHOICES,
    "dist.device": DEVICES,
    "dist.compile_mode": COMPILE_MODES,
}

RANGES: list[tuple[str, Any, str]] = [
    ("dist.timeout_minutes", lambda v: v >= 1, "an int >= 1"),
    ("dist.peer_timeout_s", lambda v: v == 0 or v >= 1, "0 (no heartbeat) or seconds >= 1"),
]
