"""GlobalBatchNorm (docs/design.md §3b): 2 gloo ranks, each holding a DIFFERENT slice of a fixed batch, must
reproduce one process running nn.BatchNorm on the whole batch: outputs, input gradients, weight/bias
gradients, running statistics (identical on every rank), eval mode; and with no process group the layer is
nn.BatchNorm bit for bit.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from _net import spawn_ranks
from test_dist_loss import join_gloo_group
from torch import nn

from hypersolid_scale.distributed import (
    GlobalBatchNorm,
    all_reduce_sum_differentiable,
    cleanup,
    convert_global_batchnorm,
)

WORLD = 2
STEPS = 3  # training steps (different global batches), then one eval forward
# (name, BatchNorm class, its kwargs, global input shape, rows per rank, dtype)
CASES = [
    ("1d-2d-even", nn.BatchNorm1d, {}, (8, 5), (4, 4), torch.float64),
    ("1d-3d-uneven-cumulative", nn.BatchNorm1d, {"momentum": None}, (8, 5, 3), (3, 5), torch.float64),
    ("2d-uneven-no-affine", nn.BatchNorm2d, {"affine": False, "momentum": 0.3}, (8, 4, 3, 3), (1, 7), torch.float64),
    ("2d-no-running-stats", nn.BatchNorm2d, {"track_running_stats": False}, (6, 3, 2, 2), (2, 4), torch.float64),
    ("2d-float32", nn.BatchNorm2d, {}, (8, 4, 5, 5), (5, 3), torch.float32),
]
TOL = {torch.float64: dict(rtol=1e-6, atol=1e-10), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def make_bn(case: tuple) -> nn.Module:
    """The BatchNorm of a case with non-trivial affine parameters, the same in every process."""
    _, cls, kwargs, shape, _, dtype = case
    bn = cls(shape[1], **kwargs).to(dtype)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        if bn.weight is not None:
            bn.weight.copy_(1.0 + 0.5 * torch.randn(shape[1], generator=g, dtype=dtype))
            bn.bias.copy_(torch.randn(shape[1], generator=g, dtype=dtype))
    return bn


def batches(case: tuple) -> list[torch.Tensor]:
    """STEPS + 1 global batches (the last one for eval), mean and scale far from 0 and 1."""
    _, _, _, shape, _, dtype = case
    g = torch.Generator().manual_seed(11)
    return [3.0 + 2.0 * torch.randn(shape, generator=g, dtype=dtype) for _ in range(STEPS + 1)]


def loss_weights(case: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    _, _, _, shape, _, dtype = case
    g = torch.Generator().manual_seed(13)
    return torch.randn(shape, generator=g, dtype=dtype), torch.rand(shape, generator=g, dtype=dtype)


def row_loss(y: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A sum over rows (so the whole-batch loss is the sum of the ranks' losses), not constant per channel:
    its gradient through the statistics does not vanish."""
    return (a * y).sum() + 0.5 * (b * y * y).sum()


def run_bn(bn: nn.Module, case: tuple, rows: slice, device: str = "cpu") -> dict[str, Any]:
    """Train STEPS forward/backward passes on ``rows`` of each global batch, then one eval forward.
    Results come back on the CPU."""
    bn = bn.to(device)
    a, b = (w[rows].to(device) for w in loss_weights(case))
    out: dict[str, Any] = {"steps": []}
    bn.train()
    for x in batches(case)[:STEPS]:
        x = x[rows].to(device).requires_grad_(True)
        y = bn(x)
        row_loss(y, a, b).backward()
        step = {"y": y.detach(), "x_grad": x.grad}
        if bn.weight is not None:
            step.update(w_grad=bn.weight.grad.clone(), b_grad=bn.bias.grad.clone())
            bn.weight.grad, bn.bias.grad = None, None
        step["buffers"] = {k: v.clone() for k, v in bn.named_buffers()}
        out["steps"].append(step)
    bn.eval()
    with torch.no_grad():
        out["eval"] = bn(batches(case)[STEPS][rows].to(device))
    return _to_cpu(out)


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_cpu(v) for v in obj]
    return obj


def ddp_data() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5), nn.ReLU(), nn.Linear(5, 3)).double()
    x = 1.0 + torch.randn(8, 6, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    return model, x


DDP_SPLIT = (3, 5)


def _worker(rank: int, port: int, out_dir: str) -> None:
    join_gloo_group(rank, WORLD, port)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for case in CASES:
        split = case[4]
        start = sum(split[:rank])
        results[case[0]] = run_bn(convert_global_batchnorm(make_bn(case)), case, slice(start, start + split[rank]))

    # The adjoint of the all-reduce: d/dx_r Σ_s <w_s, Σ_t x_t> = Σ_s w_s.
    x = torch.full((3,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) * (10 ** rank)
    y = all_reduce_sum_differentiable(x)
    (w * y).sum().backward()
    results["all_reduce"] = {"y": y.detach(), "grad": x.grad}

    # Under DDP with the loss contract of docs/design.md §3 (rank loss = P x its share of the global mean), the
    # averaged parameter gradients must be the single-process ones, Linear before the BatchNorm included.
    model, x = ddp_data()
    ddp = nn.parallel.DistributedDataParallel(convert_global_batchnorm(model))
    start = sum(DDP_SPLIT[:rank])
    part = x[start:start + DDP_SPLIT[rank]]
    (WORLD * ddp(part).pow(2).sum() / x.shape[0]).backward()
    results["ddp"] = {name: p.grad.clone() for name, p in ddp.module.named_parameters()}
    results["ddp_buffers"] = {k: v.clone() for k, v in ddp.module.named_buffers()}

    # The engine converts under auto and true with 2 CPU ranks, and leaves nn.BatchNorm under false.
    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.training.optim import build_optimizer

    engines = {}
    for setting in ("auto", "true", "false"):
        engine = build_engine(ddp_data()[0], lambda p: build_optimizer("sgd", p, lr=0.1, weight_decay=0.0,
                                                                              momentum=0.0, betas=(0.9, 0.999)),
                              engine="ddp", device=torch.device("cpu"), bf16=False, grad_clip=0.0, sync_bn=setting)
        engines[setting] = sorted({type(m).__name__ for m in engine.model.modules() if "BatchNorm" in type(m).__name__})
    results["engines"] = engines
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    cleanup()


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory) -> list[dict[str, Any]]:
    return spawn_ranks(_worker, WORLD, tmp_path_factory.mktemp("bn"))


# ----------------------------------------------------------------------------------------------------------
# 2 ranks vs 1 process
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_two_ranks_equal_one_process_batchnorm(rank_results: list[dict[str, Any]], case: tuple) -> None:
    name, _, kwargs, shape, split, dtype = case
    ref = run_bn(make_bn(case), case, slice(0, shape[0]))
    tol = TOL[dtype]
    for rank in range(WORLD):
        got = rank_results[rank][name]
        rows = slice(sum(split[:rank]), sum(split[:rank + 1]))
        for t, (g, r) in enumerate(zip(got["steps"], ref["steps"])):
            what = f"{name}, rank {rank}, step {t}"
            torch.testing.assert_close(g["y"], r["y"][rows], **tol, msg=lambda m: f"{what}, output: {m}")
            torch.testing.assert_close(g["x_grad"], r["x_grad"][rows], **tol, msg=lambda m: f"{what}, dx: {m}")
            assert g["buffers"].keys() == r["buffers"].keys()
            for k in r["buffers"]:
                torch.testing.assert_close(g["buffers"][k], r["buffers"][k], **tol, msg=lambda m: f"{what}, {k}: {m}")
                # Every rank holds the same statistics, bit for bit (they come from one all-reduce).
                assert torch.equal(g["buffers"][k], rank_results[0][name]["steps"][t]["buffers"][k]), (what, k)
        if "track_running_stats" not in kwargs:
            torch.testing.assert_close(got["eval"], ref["eval"][rows], **tol)
    if "track_running_stats" in kwargs:  # eval without running statistics: each rank's own batch, as SyncBN
        local = [run_bn(make_bn(case), case, slice(sum(split[:r]), sum(split[:r + 1])))["eval"] for r in range(WORLD)]
        for rank in range(WORLD):
            torch.testing.assert_close(rank_results[rank][name]["eval"], local[rank], **tol)
    if ref["steps"][0].get("w_grad") is not None:
        # Each rank's weight/bias gradient covers its own rows; their sum is the whole batch's (DDP would
        # average them, and the loss contract's P factor makes that average the same sum).
        for t, r in enumerate(ref["steps"]):
            for key in ("w_grad", "b_grad"):
                total = sum(rank_results[rank][name]["steps"][t][key] for rank in range(WORLD))
                torch.testing.assert_close(total, r[key], **tol, msg=lambda m: f"{name}, step {t}, {key}: {m}")
    # The test can fail: the local batch's statistics differ from the global ones by far more than tol.
    local_only = run_bn(make_bn(case), case, slice(0, split[0]))["steps"][0]["y"]
    assert (local_only - ref["steps"][0]["y"][:split[0]]).abs().max() > 1e-3


@pytest.mark.slow
def test_all_reduce_backward_is_its_adjoint(rank_results: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        got = rank_results[rank]["all_reduce"]
        torch.testing.assert_close(got["y"], torch.full((3,), 3.0, dtype=torch.float64))
        torch.testing.assert_close(got["grad"], torch.tensor([11.0, 22.0, 33.0], dtype=torch.float64))


@pytest.mark.slow
def test_ddp_with_global_batchnorm_averages_to_the_single_process_gradient(
        rank_results: list[dict[str, Any]]) -> None:
    model, x = ddp_data()
    model(x).pow(2).sum().div(x.shape[0]).backward()
    for rank in range(WORLD):
        for name, p in model.named_parameters():
            torch.testing.assert_close(rank_results[rank]["ddp"][name], p.grad, rtol=1e-6, atol=1e-10,
                                       msg=lambda m: f"rank {rank}, {name}: {m}")
        for k, v in model.named_buffers():
            torch.testing.assert_close(rank_results[rank]["ddp_buffers"][k], v, rtol=1e-6, atol=1e-10)


@pytest.mark.slow
def test_engine_converts_batchnorm_on_two_cpu_ranks_unless_disabled(rank_results: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        engines = rank_results[rank]["engines"]
        assert engines["auto"] == ["GlobalBatchNorm"] and engines["true"] == ["GlobalBatchNorm"]
        assert engines["false"] == ["BatchNorm1d"]


# ----------------------------------------------------------------------------------------------------------
# One process
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_without_process_group_it_is_batchnorm_bit_for_bit(case: tuple) -> None:
    shape = case[3]
    ref = run_bn(make_bn(case), case, slice(0, shape[0]))
    got = run_bn(convert_global_batchnorm(make_bn(case)), case, slice(0, shape[0]))
    for g, r in zip(got["steps"], ref["steps"]):
        for key in r:
            if key == "buffers":
                assert all(torch.equal(g[key][k], r[key][k]) for k in r[key])
            else:
                assert torch.equal(g[key], r[key]), key
    assert torch.equal(got["eval"], ref["eval"])


class ForcedGlobal(GlobalBatchNorm):
    """Takes the two-pass global-statistics path in training even on one rank (where the layer itself
    takes the F.batch_norm shortcut), so that path is checked against nn.BatchNorm without processes."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(input)
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
        factor = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked)
        stats = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
        return self._global_batch_norm(input, *stats, factor)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_global_formula_on_one_rank_equals_batchnorm(case: tuple) -> None:
    shape, dtype = case[3], case[5]
    ref = run_bn(make_bn(case), case, slice(0, shape[0]))
    bn = make_bn(case)
    forced = ForcedGlobal(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats, dtype=dtype)
    forced.load_state_dict(bn.state_dict())
    got = run_bn(forced, case, slice(0, shape[0]))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    for t, (g, r) in enumerate(zip(got["steps"], ref["steps"])):
        for key in r:
            if key == "buffers":
                for k in r[key]:
                    torch.testing.assert_close(g[key][k], r[key][k], **tol, msg=lambda m: f"step {t}, {k}: {m}")
            else:
                torch.testing.assert_close(g[key], r[key], **tol, msg=lambda m: f"step {t}, {key}: {m}")
    torch.testing.assert_close(got["eval"], ref["eval"], **tol)


def test_gradcheck_of_the_global_formula() -> None:
    bn = ForcedGlobal(3, track_running_stats=False, dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 2, generator=g, dtype=torch.float64).requires_grad_(True)
    weight = (0.5 + torch.rand(3, generator=g, dtype=torch.float64)).requires_grad_(True)
    bias = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_(True)

    def f(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(bn, {"weight": weight, "bias": bias}, (x,))

    assert torch.autograd.gradcheck(f, (x, weight, bias))
    assert torch.autograd.gradgradcheck(f, (x, weight, bias))


def test_convert_keeps_tensors_mode_and_nesting() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Sequential(nn.Flatten(), nn.BatchNorm1d(4)))
    model[1].running_mean.fill_(2.0)
    model.eval()
    weight, running_mean = model[1].weight, model[1].running_mean
    converted = convert_global_batchnorm(model)
    assert isinstance(converted[1], GlobalBatchNorm) and isinstance(converted[2][1], GlobalBatchNorm)
    assert converted[1].weight is weight and converted[1].running_mean is running_mean  # no copies
    assert not converted[1].training
    assert converted.state_dict().keys() == model.state_dict().keys()
    alone = convert_global_batchnorm(nn.BatchNorm1d(3))
    assert isinstance(alone, GlobalBatchNorm)
    with pytest.raises(ValueError, match="2 or 3-dimensional"):
        alone(torch.randn(2, 3, 4, 4))  # a converted BatchNorm1d still refuses images
    with pytest.raises(ValueError, match="before its first forward"):
        convert_global_batchnorm(nn.LazyBatchNorm1d())


# ----------------------------------------------------------------------------------------------------------
# CUDA: the same layer on GPU tensors, next to torch's SyncBatchNorm (what the engines pick on CUDA)
# ----------------------------------------------------------------------------------------------------------

CUDA_CASES = [c for c in CASES if c[0] in ("1d-3d-uneven-cumulative", "2d-float32")]


def _cuda_worker(rank: int, port: int, out_dir: str) -> None:
    # gloo on one GPU: NCCL refuses two ranks on the same device, gloo all-reduces CUDA tensors.
    join_gloo_group(rank, WORLD, port)
    results: dict[str, Any] = {}
    for case in CUDA_CASES:
        split = case[4]
        rows = slice(sum(split[:rank]), sum(split[:rank + 1]))
        results[case[0]] = {
            "global": run_bn(convert_global_batchnorm(make_bn(case)), case, rows, device="cuda"),
            "sync": run_bn(nn.SyncBatchNorm.convert_sync_batchnorm(make_bn(case)), case, rows, device="cuda"),
        }
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    cleanup()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_global_and_sync_batchnorm_equal_one_process(tmp_path) -> None:
    results = spawn_ranks(_cuda_worker, WORLD, tmp_path)
    for case in CUDA_CASES:
        name, _, _, shape, split, dtype = case
        ref = run_bn(make_bn(case), case, slice(0, shape[0]), device="cuda")
        tol = TOL[dtype]
        for rank in range(WORLD):
            rows = slice(sum(split[:rank]), sum(split[:rank + 1]))
            for kind in ("global", "sync"):
                got = results[rank][name][kind]
                for t, (g, r) in enumerate(zip(got["steps"], ref["steps"])):
                    what = f"{name}, {kind}, rank {rank}, step {t}"
                    torch.testing.assert_close(g["y"], r["y"][rows], **tol, msg=lambda m: f"{what}, y: {m}")
                    torch.testing.assert_close(g["x_grad"], r["x_grad"][rows], **tol,
                                               msg=lambda m: f"{what}, dx: {m}")
                    for k in r["buffers"]:
                        torch.testing.assert_close(g["buffers"][k], r["buffers"][k], **tol,
                                                   msg=lambda m: f"{what}, {k}: {m}")
                torch.testing.assert_close(got["eval"], ref["eval"][rows], **tol)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_engine_uses_sync_batchnorm_and_returns_a_device_grad_norm() -> None:
    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.training.optim import build_optimizer

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    engine = build_engine(model, lambda p: build_optimizer("sgd", p, lr=0.1, weight_decay=0.0, momentum=0.0,
                                                           betas=(0.9, 0.999)),
                          engine="ddp", device=torch.device("cuda"), bf16=False, grad_clip=1.0, sync_bn="true")
    assert any(isinstance(m, nn.SyncBatchNorm) for m in engine.model.modules())
    engine.backward(engine.model(torch.randn(8, 3, device="cuda")).pow(2).sum())
    norm = engine.step()
    assert norm.is_cuda and norm.dim() == 0 and torch.isfinite(norm)
