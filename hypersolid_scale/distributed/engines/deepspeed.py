"""DeepSpeed ZeRO 0-2 engine with a client torch optimizer; the same loss code as DDP.

DeepSpeed joins the process group this package created (``dist_init_required=False``): under torchrun or
srun the one from ``init_distributed``, in a single process a one-rank group (``ensure_process_group``).

Checkpoints: we do not use DeepSpeed's checkpoint directories. The model weights are the full module state
(ZeRO 0-2 keep every weight on every rank), saved in the same portable file as DDP runs. For ZeRO-1/2 the
optimizer state is partitioned; each rank's partition (its base-optimizer state and its fp32 master slice,
stripped of DeepSpeed's Python objects so that ``weights_only=True`` loads it) is gathered to rank 0 and
stored as ``{"zero_stage": s, "shards": [rank0, rank1, ...]}``. Resuming the optimizer state needs the same
world size and ZeRO stage; the weights resume under any world size. The sharded checkpoint instead stores each
parameter's slice of the partitioned state by name (``optimizer_pieces``), which any world size reads back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from hypersolid_scale.distributed.collectives import gather_objects, get_world_size
from hypersolid_scale.distributed.engines import (
    Engine,
    EngineOptions,
    OptimizerFn,
    Pieces,
    covering_slice,
    grad_norm_tensor,
    register_engine,
)
from hypersolid_scale.distributed.process_group import ensure_process_group
from hypersolid_scale.safety.errors import ConfigError

# DeepSpeed's default bucket: 5e8 elements per gradient reduction (its ZeRO-1/2 config docs).
DEFAULT_REDUCE_BUCKET = 500_000_000


def deepspeed_config(
    *,
    batch_size_per_gpu: int,
    zero_stage: int,
    grad_clip: float,
    bf16: bool = False,
    accumulate_steps: int = 1,
    gradient_elements: int = DEFAULT_REDUCE_BUCKET,
) -> dict[str, Any]:
    """DeepSpeed's JSON config, derived from ours (one source of truth for batch and clipping).

    No "bf16" section: DeepSpeed's bf16 mode casts the module's parameters to bf16 but leaves BatchNorm's
    running statistics fp32 (BatchNorm then refuses the mixed dtypes) and hands bf16 weights to evaluation
    code that feeds fp32 images. bf16 is autocast in ``Engine.forward`` instead, as under DDP:
    the parameters, gradients, master weights and optimizer state stay fp32, and the loss decides its
    thresholds in fp32 anyway (docs/design.md §2).

    The gradient bucket is no larger than the model's trainable elements (``gradient_elements``; DeepSpeed's
    5e8 at most): ZeRO-1/2 allocate a buffer of the bucket's size at every step (2 GB of fp32 for the default,
    ~0.8 s a step on a CPU, memory held on a GPU), and every gradient fits one bucket either way, so the
    reductions are the same.

    But DeepSpeed's engine switches off an autocast entered outside it on CUDA unless its own
    "torch_autocast" section enables one (on an H200 the forward silently ran in fp32), so with bf16 that
    section is set, with no "lower precision safe" modules: DeepSpeed would otherwise reduce the gradients
    of every Linear and Conv in bf16, and the gradient all-reduce must stay fp32 for N processes to equal 1.
    """
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": batch_size_per_gpu,
        # Our accumulation (docs/design.md §3d) marks the last micro-batch itself (``micro_batch``) and steps
        # once; DeepSpeed must only know the count, for its batch arithmetic.
        "gradient_accumulation_steps": accumulate_steps,
        "gradient_clipping": grad_clip,
        "zero_optimization": {
            "stage": zero_stage,
            "reduce_bucket_size": max(1, min(gradient_elements, DEFAULT_REDUCE_BUCKET)),
        },
        # ZeRO partitions any torch optimizer's state; DeepSpeed only whitelists Adam-type ones by name,
        # and our SGD option (with momentum) would otherwise be refused.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,  # we log ourselves
        "wall_clock_breakdown": False,
    }
    if bf16:
        config["torch_autocast"] = {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    return config


def _plain(obj: Any) -> Any:
    """Drop what ``torch.load(weights_only=True)`` cannot read (DeepSpeed's loss scaler, fragment maps)."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if _is_plain(v)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj)
    # Enum members such as ZeroStageEnum subclass int/str but unpickle as their class: store the value.
    for plain in (bool, int, float, str):
        if isinstance(obj, plain):
            return plain(obj)
    return obj


def _is_plain(v: Any) -> bool:
    if isinstance(v, (torch.Tensor, int, float, bool, str, type(None))):
        return True
    if isinstance(v, (list, tuple)):
        return all(_is_plain(x) for x in v)
    return isinstance(v, dict)


def _partitioned(value: Any, master: torch.Tensor) -> bool:
    """Whether an optimizer state entry is per element of the partition (momentum) rather than one value (a step)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.numel() == master.numel()


def _skip_shared_memory_op(deepspeed: Any) -> None:
    """Keep DeepSpeed's CPU backend from compiling its shared-memory all-reduce (C++, JIT-built on the first
    run on a machine and again for every other install path: ~40-80 s of a 2-core machine's time). Only its
    inference all-reduce uses that op, never training, so a training run gains nothing from it. DeepSpeed
    builds the ops its table of compatible ops allows; marking this one incompatible there is the only switch
    it reads at run time (a DeepSpeed without the table builds it as before)."""
    compatible = getattr(deepspeed.ops, "__compatible_ops__", None)
    if isinstance(compatible, dict):
        compatible["deepspeed_shm_comm"] = False


@register_engine
class DeepSpeedEngine(Engine):
    """DeepSpeed averages the gradients in ``backward``; its ``step`` clips (``gradient_clipping``), steps and
    zeroes them. ``optimizer`` is the client torch optimizer; ``ds_optimizer`` the ZeRO wrapper around it (the
    client itself under ZeRO 0)."""

    kind: ClassVar[str] = "deepspeed"
    order: ClassVar[int] = 1

    def __init__(self, model: nn.Module, optimizer_fn: OptimizerFn, options: EngineOptions) -> None:
        """Around ``model`` (its BatchNorms already converted); of ``options``: device, bf16, grad_clip,
        zero_stage, batch_size_per_gpu, compile, accumulate_steps."""
        o = options
        device, bf16, grad_clip, zero_stage = o.device, o.bf16, o.grad_clip, o.zero_stage
        batch_size_per_gpu, compile, accumulate_steps = o.batch_size_per_gpu, o.compile, o.accumulate_steps
        import deepspeed  # optional dependency: only DeepSpeed runs need it

        if device.type == "cpu":
            _skip_shared_memory_op(deepspeed)
        ensure_process_group(device)
        self.zero_stage, self.bf16, self.device = zero_stage, bf16, device
        self.config = deepspeed_config(
            batch_size_per_gpu=batch_size_per_gpu,
            zero_stage=zero_stage,
            grad_clip=grad_clip,
            bf16=bf16,
            accumulate_steps=accumulate_steps,
            gradient_elements=sum(p.numel() for p in model.parameters() if p.requires_grad),
        )
        model = model.to(device)
        self.optimizer = optimizer_fn(model.parameters())
        self.wrapped, self.ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=self.optimizer, config=self.config, dist_init_required=False
        )
        self.model = self.wrapped.module
        if compile:
            self.wrapped.compile()

    def backward(self, loss: torch.Tensor) -> None:
        # The loss is already the step's (an accumulated step hands each micro-batch its exact share of the
        # gradient, docs/design.md §3d): no division by the accumulation count.
        self.wrapped.backward(loss, scale_wrt_gas=False)

    def micro_batch(self, last: bool) -> contextlib.AbstractContextManager:
        # DeepSpeed reduces (and ZeRO partitions) the gradients at the boundary it is told about.
        self.wrapped.set_gradient_accumulation_boundary(last)
        return contextlib.nullcontext()

    def step(self) -> torch.Tensor | None:
        self.wrapped.step()  # clips, steps and zeroes the gradients
        return grad_norm_tensor(self.wrapped.get_global_grad_norm(), self.device)

    def optimizer_state(self) -> dict[str, Any] | None:
        """Collective (all ranks call it). Rank 0 gets the portable dict, other ranks None."""
        if self.zero_stage == 0 and self.ds_optimizer is self.optimizer:
            return self.optimizer.state_dict()
        shard = _plain(self.ds_optimizer.state_dict())
        shards = gather_objects(shard)
        if shards is None:
            return None
        return {"zero_stage": self.zero_stage, "shards": shards}

    def load_model_state(self, state: dict[str, torch.Tensor]) -> None:
        """Load weights into the module *and* into the optimizer's fp32 master copy.

        ZeRO 1/2 step a separate fp32 copy of the weights and copy it back into the module after every step;
        loading the module alone would be undone by the first step.
        A loaded optimizer state (``load_from_fp32_weights=True``) overwrites the master copy again with the
        checkpoint's own fp32 weights, so call this first and ``load_optimizer_state`` after it.
        """
        self.model.load_state_dict(state)
        # ZeRO's module parameters are views into its flat parameter buffers, so the load above reached them;
        # the master copy is refreshed from there. A plain torch optimizer (ZeRO 0, fp32) has no copy.
        refresh = getattr(self.ds_optimizer, "refresh_fp32_params", None)
        if refresh is not None:
            refresh()

    # ---- the sharded checkpoint's per-parameter view of a ZeRO 1/2 partition (docs/design.md §5) ----------

    @property
    def replicated_optimizer(self) -> bool:
        return self.ds_optimizer is self.optimizer  # ZeRO 0: the client optimizer, whole on every rank

    def _partition_layout(self) -> Iterator[tuple[int, list[tuple[str, int, int]], int, int]]:
        """Per parameter group i of ZeRO's flat buffers: ``(i, [(name, offset, numel)], start, end)``, where each
        parameter sits in the group's flat buffer (DeepSpeed pads between parameters and at the end) and the
        part ``start .. end`` of it this rank's partition holds (DeepSpeed's own partitions, read, not recomputed)."""
        import deepspeed.comm as ds_dist

        names = {id(p): n for n, p in self.model.named_parameters()}
        opt = self.ds_optimizer
        for i, params in enumerate(opt.round_robin_bit16_groups):
            rank = ds_dist.get_rank(group=opt.real_dp_process_group[i])
            parts = opt.parallel_partitioned_bit16_groups[i]
            start = sum(t.numel() for t in parts[:rank])
            members = [(names[id(p)], off, p.numel()) for p, off in zip(params, opt.round_robin_bit16_offsets[i])]
            yield i, members, start, start + parts[rank].numel()

    def optimizer_pieces(self) -> tuple[Pieces, dict[str, Any]]:
        if self.replicated_optimizer:
            return super().optimizer_pieces()
        opt = self.ds_optimizer
        pieces: Pieces = {}
        scalars: dict[str, dict[str, Any]] = {}
        for i, members, start, end in self._partition_layout():
            master = opt.single_partition_of_fp32_groups[i]
            state = self.optimizer.state.get(master, {})
            flat = {"master": master.detach()}
            flat.update({k: v.detach() for k, v in state.items() if _partitioned(v, master)})
            other = {k: v for k, v in state.items() if not _partitioned(v, master)}
            for name, off, numel in members:
                if other:  # one value for the whole group (Adam's step), the same on every rank: named for each
                    scalars[name] = dict(other)  # parameter, so that rank 0's run.pt holds it for all of them
                lo, hi = max(off, start), min(off + numel, end)
                if lo < hi:
                    pieces[name] = {key: (lo - off, t[lo - start : hi - start]) for key, t in flat.items()}
        groups = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": [n for n, _, _ in members]}
            for g, (_, members, _, _) in zip(self.optimizer.param_groups, self._partition_layout())
        ]
        return pieces, {"param_groups": groups, "scalars": scalars}

    def needed_ranges(self) -> dict[str, tuple[int, int]]:
        if self.replicated_optimizer:
            return super().needed_ranges()
        ranges = {}
        for _, members, start, end in self._partition_layout():
            for name, off, numel in members:
                lo, hi = max(off, start), min(off + numel, end)
                if lo < hi:
                    ranges[name] = (lo - off, hi - off)
        return ranges

    def load_optimizer_pieces(self, pieces: Pieces, plain: dict) -> None:
        """Each rank fills its partition's slices of the master weights and optimizer state (left as zeros in
        the padding), then ZeRO copies the master weights into the module on every rank (collective)."""
        if self.replicated_optimizer:
            super().load_optimizer_pieces(pieces, plain)
            return
        opt = self.ds_optimizer
        for (i, members, start, end), group in zip(self._partition_layout(), plain["param_groups"]):
            master = opt.single_partition_of_fp32_groups[i]
            state = self.optimizer.state[master]
            for name, off, numel in members:
                lo, hi = max(off, start), min(off + numel, end)
                if lo >= hi:
                    continue
                for key, (first, flat) in pieces.get(name, {}).items():
                    if key == "master":
                        dst = master
                    else:
                        dst = state.setdefault(key, torch.zeros_like(master, memory_format=torch.contiguous_format))
                    piece = covering_slice(flat, first, lo - off, hi - off, name, key)
                    dst.data[lo - start : hi - start].copy_(piece)
                state.update(plain["scalars"].get(name, {}))
            self.optimizer.param_groups[i].update({k: v for k, v in group.items() if k != "params"})
        opt.update_lp_params()  # the fp32 master partitions into the module's weights, gathered on every rank

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if "shards" not in state:
            self.optimizer.load_state_dict(state)
            return
        world = get_world_size()
        if state["zero_stage"] != self.zero_stage or len(state["shards"]) != world:
            raise ConfigError(
                f"the checkpoint's optimizer state was saved with ZeRO stage {state['zero_stage']} on "
                f"{len(state['shards'])} ranks; this run uses stage {self.zero_stage} on {world} ranks. "
                "Resume with the same world size and dist.zero_stage, or pass checkpoint.resume=force to "
                "restart the optimizer state from scratch (checkpoints written with checkpoint.format=sharded "
                "resume it on any world size)"
            )
        self.ds_optimizer.load_state_dict(state["shards"], load_optimizer_states=True, load_from_fp32_weights=True)
