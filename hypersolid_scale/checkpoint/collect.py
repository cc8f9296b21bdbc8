"""What a training run's checkpoint holds: ``run_state`` collects it from every rank (the keys are listed in
:mod:`hypersolid_scale.checkpoint`), ``sharded_run_state`` each rank's share of it for a sharded checkpoint;
:mod:`~hypersolid_scale.checkpoint.resume` puts it back.
"""

from __future__ import annotations

from typing import Any

from hypersolid_scale.checkpoint.layout import split_method_state
from hypersolid_scale.checkpoint.rng import rng_state
from hypersolid_scale.checkpoint.sharded import optimizer_tensors, split_weights
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import Config, to_dict
from hypersolid_scale.distributed import Engine, gather_objects


def run_meta(
    *,
    cfg: Config,
    loader: Any,
    step: int,
    rank: int,
    world_size: int,
    global_batch: int,
    mlflow_run_id: str | None,
    tracking_uri: str | None,
) -> dict[str, Any] | None:
    """Everything of a run's checkpoint but its weights and optimizer state. Collective: every rank contributes
    its RNG state; the dict is returned on rank 0, None elsewhere.

    ``epoch`` is the loader's epoch (in progress, or just finished when its position is at the end);
    ``global_batch`` the images of one optimizer step over all ranks, what steps and the loader count.
    """
    loader_state = loader.state_dict()
    rngs = gather_objects(rng_state())
    if rank != 0:
        return None
    return {
        "step": step,
        "epoch": int(loader_state["epoch"]),
        "rng": rngs,  # one state per rank, rank order
        "loader": loader_state,
        "config": to_dict(cfg, stored=True),
        "config_fingerprint": fingerprint(cfg),
        "mlflow_run_id": mlflow_run_id,
        "tracking_uri": tracking_uri,
        "world_size": world_size,
        "global_batch": int(global_batch),
    }


def run_state(*, engine: Engine, **meta: Any) -> dict[str, Any] | None:
    """The single-file checkpoint of a run at ``step`` (``run_meta``'s arguments). Collective: every rank
    contributes its RNG state (and its ZeRO shard, inside ``optimizer_state``); the dict is returned on rank 0,
    None elsewhere."""
    optim_state = engine.optimizer_state()
    state = run_meta(**meta)
    if state is None:
        return None
    model, method = split_method_state(engine.model.state_dict())
    extra = {} if method is None else {"method": method}
    return {"model": model, **extra, "optimizer": optim_state, **state}


def sharded_run_state(*, engine: Engine, **meta: Any) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The sharded checkpoint of a run (``run_meta``'s arguments): ``(this rank's tensors, rank 0's run.pt or
    None)``; see :mod:`hypersolid_scale.checkpoint.sharded`. Collective (the RNG states)."""
    state = run_meta(**meta)
    tensors, rest = engine_parts(engine)
    if state is not None:
        state.update(rest)
    return tensors, state


def engine_parts(engine: Engine) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tensors, rest)`` of an engine's weights and optimizer state for a sharded checkpoint: this rank's
    tensors for DCP's parts, and what ``run.pt`` holds of them (``model_rest``, ``method_rest``,
    ``optimizer_plain``)."""
    model, method = split_method_state(engine.model.state_dict())
    tensors, model_rest = split_weights(model, "model")
    method_tensors, method_rest = split_weights(method or {}, "method")
    pieces, plain = engine.optimizer_pieces()
    numel = {n: p.numel() for n, p in engine.model.named_parameters()}
    tensors.update(method_tensors)
    tensors.update(optimizer_tensors(pieces, numel, engine.replicated_optimizer))
    return tensors, {"model_rest": model_rest, "method_rest": method_rest, "optimizer_plain": plain}
