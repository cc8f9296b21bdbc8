"""The baselines under DeepSpeed, through the trainer's own path (launch/train.py under torchrun, 2 gloo ranks):
2 ranks x 8 images end where 1 process x 16 images ends (backbone, heads, BatchNorm statistics and BYOL's
momentum teacher), DeepSpeed takes the steps DDP takes, and a 2-rank run resumed from its checkpoint continues
bitwise, under ZeRO 0 and ZeRO 2 (whose optimizer state is partitioned across the ranks).

SimCLR gathers the other ranks' rows for its negatives; BYOL has the momentum teacher, which is no parameter of
the optimizer (DeepSpeed must leave it alone) and follows the student after every step.

The runs are the quickstart baseline configs with a narrower network and heads, 4 SGD steps (SGD, not Adam:
Adam's update is blind to a constant factor on the gradient, the classic distributed error) at a small
learning rate. The ranks' float32 sums round differently from one process's; a large step amplifies that
(SimCLR at lr 0.1 ends 1e-2 apart by step 3 under DDP as under DeepSpeed, while the same runs in float64
agree to 1e-13), so the learning rate is kept where the comparison measures the engines, not the rounding.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import torch
from _update import update_gap
from test_baselines_train import _launch

from hypersolid_scale import checkpoint as ck

REPO = Path(__file__).resolve().parents[1]
STEPS = 4
B = 8  # images per rank with 2 processes; the single process takes 2B
RTOL = 1e-5  # the weights must move by far more than this (100x) for the comparisons to prove anything
# Of the update over steps 3-4: |2 ranks - 1 process| / |1 process at step 4 - at step 2| over every floating
# tensor (backbone, heads, teacher, BatchNorm statistics). Measured (this machine's CPU): 6.3e-7 (SimCLR, ZeRO 0),
# 1.0e-7 (BYOL, ZeRO 2); DeepSpeed vs DDP at 2 ranks: 0 (bitwise, both stages). The bound is ~7x the one-vs-two
# OpenMP-thread spread of one process measured on the same baselines (1.4e-6, tests/test_baselines_train.py).
UPDATE_RTOL = 1e-5
COMMON = [
    "optim.name=sgd", "optim.momentum=0.9", "optim.lr=1e-3", f"max_steps={STEPS}",
    f"data.max_pretrain_samples={STEPS * 2 * B}", "data.num_workers=0", "model.small_cnn.width=8",
    "eval.every_n_epochs=0", "tracking.enabled=false", "checkpoint.every_n_steps=2", "checkpoint.keep_last=0",
    "deterministic=true", "dist.device=cpu", "progress=false",
]
HEADS = {
    "simclr": ["method.simclr.hidden_dim=64", "method.simclr.out_dim=32"],
    # momentum 0.9: the teacher moves visibly in 4 steps.
    "byol": ["method.byol.hidden_dim=64", "method.byol.out_dim=32", "method.byol.momentum_base=0.9"],
}
ENGINES = {
    "zero0": ["dist.engine=deepspeed", "dist.zero_stage=0"],
    "zero2": ["dist.engine=deepspeed", "dist.zero_stage=2"],
    "ddp": ["dist.engine=ddp"],
}


def _args(method: str, engine: str, nproc: int, *extra: str) -> list[str]:
    config = REPO / "configs" / "baselines" / f"{method}_quickstart.yaml"
    return ["--config", str(config), *COMMON, *HEADS[method], *ENGINES[engine],
            f"data.batch_size_per_gpu={2 * B // nproc}", *extra]


@pytest.fixture(scope="module")
def train(tmp_path_factory: pytest.TempPathFactory):
    """``train(method, engine, nproc)`` -> run_dir of an uninterrupted run (checkpoints at 2 and 4), each once."""
    pytest.importorskip("deepspeed")
    root = tmp_path_factory.mktemp("baselines_deepspeed")

    @cache
    def run(method: str, engine: str, nproc: int) -> Path:
        # A directory per run: the trainer would otherwise resume another run's checkpoint.
        run_dir = root / f"{method}-{engine}-p{nproc}"
        _launch(run_dir, _args(method, engine, nproc), nproc=nproc)
        return run_dir

    return run


def _final(run_dir: Path) -> dict:
    return ck.load_checkpoint(ck.list_checkpoints(run_dir)[-1])


def _state(ckpt: dict) -> dict[str, torch.Tensor]:
    """Backbone, heads, teacher and BatchNorm statistics of a checkpoint, as one flat dict."""
    return {**ckpt["model"], **{f"method.{k}": v for k, v in ckpt["method"].items()}}


def _gap(got_dir: Path, ref_dir: Path) -> float:
    """How far ``got_dir``'s run ended from ``ref_dir``'s, as a share of the reference's update over its last
    two steps (from its step-2 checkpoint to step 4; tests/_update.py)."""
    first, last = (ck.load_checkpoint(p) for p in ck.list_checkpoints(ref_dir))
    assert (first["step"], last["step"]) == (2, STEPS)
    return update_gap(_state(_final(got_dir)), _state(last), _state(first))


def _moved_from_init(state: dict, prefix: str = "") -> float:
    """The largest relative change of a tensor from the run's initial backbone (nonzero initial tensors only:
    BatchNorm biases start at 0, where any change is infinitely large). ``prefix`` reads the teacher's copy."""
    init = ck.random_init_checkpoint(state)["model"]
    part = "method" if prefix else "model"
    moved = [float((state[part][f"{prefix}{k}"] - v).abs().max() / v.abs().max())
             for k, v in init.items() if k.startswith("backbone.") and v.is_floating_point() and v.abs().max() > 0]
    return max(moved)


@pytest.mark.slow
# SimCLR (the gathered negatives) under ZeRO 0, BYOL (the teacher DeepSpeed must leave alone) under ZeRO 2, the
# partitioned case; both stages of BYOL are resumed below.
@pytest.mark.parametrize(("method", "engine"), [("simclr", "zero0"), ("byol", "zero2")])
def test_two_deepspeed_ranks_equal_one_process(train, method: str, engine: str) -> None:
    one, two = _final(train(method, engine, 1)), _final(train(method, engine, 2))
    assert (one["world_size"], two["world_size"], one["step"], two["step"]) == (1, 2, STEPS, STEPS)
    for part in ("model", "method"):
        assert one[part].keys() == two[part].keys()
        for k, v in one[part].items():
            if isinstance(v, torch.Tensor) and not v.is_floating_point():  # num_batches_tracked
                assert torch.equal(two[part][k], v), f"{method} {engine}: {part}.{k}"
    assert any("running_var" in k for k in one["model"]) and any("running_var" in k for k in one["method"])
    gap = _gap(train(method, engine, 2), train(method, engine, 1))
    print(f"{method} {engine}: 2 ranks x {B} vs 1 process x {2 * B}: {gap:.3g} of the update")
    assert gap <= UPDATE_RTOL, f"{method} {engine}: 2 ranks differ from 1 process by {gap:.3g} of the update"
    # The comparison can fail: training moved the weights far beyond the tolerance.
    assert _moved_from_init(one) > 1e2 * RTOL
    if method == "byol":
        compared = [k for k in one["method"] if k.startswith(("teacher_backbone.", "teacher_projector."))]
        assert len(compared) > 10, "the momentum teacher must be compared too"
        assert _moved_from_init(one, prefix="teacher_") > 1e2 * RTOL


@pytest.mark.slow
def test_deepspeed_takes_the_steps_ddp_takes(train) -> None:
    """At the same world size both engines average the same gradients: DeepSpeed (ZeRO 0 and 2) ends where
    DDP ends, the teacher included, to within float32 rounding."""
    for engine in ("zero0", "zero2"):
        gap = _gap(train("byol", engine, 2), train("byol", "ddp", 2))
        print(f"byol {engine} vs ddp, 2 ranks: {gap:.3g} of the update")
        assert gap <= 1e-6, f"{engine} vs ddp: {gap:.3g} of the update"  # measured: 0


def _assert_same_tree(a: object, b: object, where: str) -> int:
    """``a`` and ``b`` are the same nested state, tensors bitwise; returns how many tensors were compared."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and torch.equal(a, b), where
        return 1
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        return sum(_assert_same_tree(a[k], b[k], f"{where}.{k}") for k in a)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        return sum(_assert_same_tree(x, y, f"{where}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    assert a == b, f"{where}: {a!r} != {b!r}"
    return 0


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["zero0", "zero2"])
def test_a_resumed_two_rank_byol_run_continues_bitwise(train, tmp_path: Path, engine: str) -> None:
    """2 ranks resume from the uninterrupted run's step-2 checkpoint and end with its weights, teacher and
    optimizer state (ZeRO 2: each rank's partition) bit for bit."""
    reference = train("byol", engine, 2)
    at_two = ck.list_checkpoints(reference)[0]
    out = _launch(tmp_path / "resumed", _args("byol", engine, 2, f"checkpoint.path={at_two}"), nproc=2)
    assert f"resumed from {at_two} at step 2" in out
    # DeepSpeed's inference-only shared-memory op is not compiled for a CPU training (distributed/engines/deepspeed.py).
    assert "deepspeed_shm_comm" not in out
    a, b = _final(reference), _final(tmp_path / "resumed")
    assert a["step"] == b["step"] == STEPS
    for part in ("model", "method"):
        assert _assert_same_tree(a[part], b[part], part) > 0
    assert _assert_same_tree(a["optimizer"], b["optimizer"], "optimizer") > 0
    if engine == "zero2":
        assert a["optimizer"]["zero_stage"] == 2 and len(a["optimizer"]["shards"]) == 2
    # The comparison can fail: the teacher and the weights moved between the checkpoint and the end.
    start = ck.load_checkpoint(at_two)
    assert not torch.equal(start["method"]["teacher_backbone.features.0.weight"],
                           a["method"]["teacher_backbone.features.0.weight"])
    assert not torch.equal(start["model"]["backbone.features.0.weight"], a["model"]["backbone.features.0.weight"])
