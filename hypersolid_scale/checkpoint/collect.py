"""What a training run's checkpoint holds: ``run_state`` collects it from every rank (the keys are listed in
:mod:`hypersolid_scale.checkpoint`); :mod:`~hypersolid_scale.checkpoint.resume` puts it back.
"""

from __future__ import annotations

from typing import Any

from hypersolid_scale.checkpoint.layout import split_method_state
from hypersolid_scale.checkpoint.rng import rng_state
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import Config, to_dict
from hypersolid_scale.distributed import Engine, gather_objects


def run_state(
    *,
    cfg: Config,
    engine: Engine,
    loader: Any,
    step: int,
    rank: int,
    world_size: int,
    global_batch: int,
    mlflow_run_id: str | None,
    tracking_uri: str | None,
) -> dict[str, Any] | None:
    """The checkpoint of a run at ``step``. Collective: every rank contributes its RNG state (and its ZeRO
    shard, inside ``optimizer_state``); the dict is returned on rank 0, None elsewhere.

    ``epoch`` is the loader's epoch (in progress, or just finished when its position is at the end);
    ``global_batch`` the images of one optimizer step over all ranks, what steps and the loader count.
    """
    loader_state = loader.state_dict()
    optim_state = engine.optimizer_state()
    rngs = gather_objects(rng_state())
    if rank != 0:
        return None
    model, method = split_method_state(engine.model.state_dict())
    extra = {} if method is None else {"method": method}
    return {
        "model": model,
        **extra,
        "optimizer": optim_state,
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
