"""Exact gradient accumulation for losses that couple the rows of a batch (docs/design.md §3d).

Summing the gradients of K micro-batch losses is wrong for every method here: a micro-batch would only be
repelled from, contrasted with or normalised against itself. The step is instead done in two passes, as
GradCache (Gao et al., 2021) and open_clip's ``accum_freq`` do for contrastive losses:

1. each micro-batch goes through the networks WITHOUT a graph (``Method.embed``); only its outputs are kept;
2. the outputs of all micro-batches, concatenated, are the rows of this rank's share of the global batch:
   ``Method.loss`` runs on them once (gathering every rank's rows, as without accumulation) and autograd
   gives the gradient of the loss with respect to each output;
3. each micro-batch goes through the networks again, now with its graph, and back-propagates the slice of
   that gradient which belongs to it. The parameters' gradients add up over the micro-batches to exactly
   the gradient of the global loss, and the engine averages them over ranks in the last micro-batch only.

The second pass must reproduce the first: the random state (dropout, drop-path; augmentation was done before)
is captured before each micro-batch in pass 1 and replayed in pass 2; a method's own state changes once per
step (``Method.start_step`` before pass 1, ``Method.loss``); ``replay=True`` skips a teacher's outputs. Buffers
are restored after pass 2, so BatchNorm's running statistics are updated once per micro-batch, in pass 1.
Written here, not taken from a library: GradCache and open_clip wrap their own model APIs; this one works on
any ``Method`` through the engine's wrapper (DDP, DeepSpeed).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hypersolid_scale.distributed import Engine
from hypersolid_scale.methods import Method, Outputs


class RandomState:
    """The torch random state of the CPU and of ``device`` (when it is a GPU) at one moment, to replay."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cpu = torch.get_rng_state()
        self.gpu = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.gpu is not None:
            torch.cuda.set_rng_state(self.gpu, self.device)


def split_views(views: list[torch.Tensor], parts: int) -> list[list[torch.Tensor]]:
    """Micro-batch k = rows [k*m, (k+1)*m) of every view: what rank k of ``parts`` ranks would get
    (data/loading/common.py ``split_global_batches``), so 1 process x K micro-batches sees what K processes see."""
    chunks = [v.chunk(parts) for v in views]
    return [[c[k] for c in chunks] for k in range(parts)]


def concat_outputs(outs: list[Outputs]) -> Outputs:
    """Every output's micro-batches joined along the rows, in micro-batch order."""
    return {key: [torch.cat(tensors) for tensors in zip(*(o[key] for o in outs))] for key in outs[0]}


def accumulated_step(
    engine: Engine, method: Method, model: nn.Module, views: list[torch.Tensor], parts: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Forward and backward of one optimizer step over ``parts`` micro-batches of ``views`` (this rank's rows of
    the global batch). Leaves the gradients in the parameters (averaged over ranks) and returns the loss
    (detached) and statistics of the whole batch, as a plain forward would. ``model``: the unwrapped module
    whose buffers pass 2 must leave untouched."""
    micro = split_views(views, parts)
    method.start_step()
    states, outs = [], []
    with torch.no_grad(), engine.autocast():
        for batch in micro:
            states.append(RandomState(engine.device))
            outs.append(engine.wrapped(batch, embed=True))
    after = RandomState(engine.device)

    joined = concat_outputs(outs)
    leaves: list[tuple[str, int, torch.Tensor]] = []
    for key, tensors in joined.items():
        if key in method.target_keys:
            continue
        for i, t in enumerate(tensors):
            if t.is_floating_point():
                tensors[i] = t.detach().requires_grad_(True)
                leaves.append((key, i, tensors[i]))
    with engine.autocast():
        loss, stats = method.loss(joined)
    grads = torch.autograd.grad(loss, [leaf for _, _, leaf in leaves], allow_unused=True)
    # Each micro-batch's rows of each gradient; None where an output does not reach the loss (SwaV's queued z).
    sliced = [(key, i, None if g is None else g.chunk(parts)) for (key, i, _), g in zip(leaves, grads)]

    buffers = [b.detach().clone() for b in model.buffers()]
    for k, batch in enumerate(micro):
        states[k].restore()
        with engine.micro_batch(last=k == parts - 1):
            with engine.autocast():
                out = engine.wrapped(batch, embed=True, replay=True)
            # sum(out * g) back-propagates exactly g into out (d/d out of (out * g).sum() is g, bit for bit),
            # and every engine takes a scalar loss; DeepSpeed takes nothing else.
            surrogate: Any = sum(
                (out[key][i] * g[k]).sum() for key, i, g in sliced if g is not None and out[key][i].requires_grad
            )
            engine.backward(surrogate)
    with torch.no_grad():
        for b, saved in zip(model.buffers(), buffers):
            b.copy_(saved)
    after.restore()
    return loss.detach(), stats
