"""Engines and process-group setup: N gloo processes equal 1 process on the concatenated batch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from _warm_python import run_processes, run_python, run_python_together

from hypersolid_scale.distributed import (
    deepspeed_config,
    ensure_process_group,
    first_host,
    has_process_group,
    resolve_transport,
    world_info_from_env,
)
from hypersolid_scale.safety.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "tests" / "_trainer_helpers.py"
sys.path.insert(0, str(REPO / "tests"))


# ----------------------------------------------------------------------------------------------------------
# Environment parsing (torchrun, srun, plain python)
# ----------------------------------------------------------------------------------------------------------


def test_world_info_from_torchrun_env() -> None:
    info = world_info_from_env({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1"})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (3, 8, 1, "torchrun")


def test_world_info_from_srun_env() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}
    info = world_info_from_env(env)
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (5, 8, 1, "slurm")


def test_salloc_shell_without_srun_is_single_process() -> None:
    # SLURM_NTASKS is exported in any allocation; without a job step this is one plain process.
    info = world_info_from_env({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert (info.rank, info.world_size, info.launcher) == (0, 1, "single")


@pytest.mark.parametrize("nodelist, host", [
    ("gpu[003-005,7]", "gpu003"), ("node1,node2", "node1"), ("a-b-c", "a-b-c"), ("x[10]", "x10"),
])
def test_first_host_of_slurm_nodelist(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


def test_resolve_transport() -> None:
    cpu = torch.device("cpu")
    assert resolve_transport("auto", cpu) == "gloo" and resolve_transport("gloo", cpu) == "gloo"
    assert resolve_transport("auto", torch.device("cuda", 0)) == "nccl"
    with pytest.raises(ConfigError, match="dist.transport=nccl needs CUDA devices"):
        resolve_transport("nccl", cpu)
    with pytest.raises(ConfigError, match=r"dist.transport='mpi'.*auto \| gloo \| nccl"):
        resolve_transport("mpi", cpu)


def test_a_rank_without_process_group_does_not_start_one_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a launcher the group comes from init_distributed; a one-rank group would hang the other ranks."""
    assert not has_process_group()
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(RuntimeError, match="rank 1 of 2 .*call init_distributed"):
        ensure_process_group(torch.device("cpu"))
    assert not has_process_group()


_ATTEMPT = """
import os, sys, torch, torch.distributed as dist
from hypersolid_scale.distributed import cleanup, init_distributed
rank, count = sys.argv[1], sys.argv[2]
os.environ.update(RANK=rank, LOCAL_RANK=rank, TORCHELASTIC_RESTART_COUNT=count)
init_distributed("cpu", "gloo", timeout_minutes=1)
total = torch.tensor([float(int(rank) + 1)])
dist.all_reduce(total)
print("sum", int(total.item()), flush=True)
cleanup()
"""


def test_restarted_ranks_meet_in_torchruns_store_whatever_their_restart_counts(tmp_path: Path) -> None:
    """torchrun's agent store outlives the groups that met through it (docs/design.md §5). A first group of 3
    meets there and ends; a second one, whose ranks' TORCHELASTIC_RESTART_COUNT differ (each node's agent counts
    its own restarts, docs/cluster.md), must meet anew rather than in the dead group's keys: under a prefix from
    the restart count, rank 1 (count 0) would dial the first group's addresses and the others would wait for it."""
    import datetime

    import torch.distributed as dist

    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=60))  # the agent's store, as torchrun shares it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "WORLD_SIZE": "3",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(agent.port), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    for counts in (["0", "0", "0"], ["1", "0", "2"]):
        done = run_python_together([["-c", _ATTEMPT, str(rank), count] for rank, count in enumerate(counts)],
                                   env=env, timeout=90)
        assert [d.returncode for d in done] == [0, 0, 0], "\n".join(d.stdout + d.stderr[-3000:] for d in done)
        assert all("sum 6" in d.stdout for d in done), [d.stdout for d in done]


def test_ddp_in_one_process_creates_no_process_group() -> None:
    engine = _sgd_engine(_bn_net(), grad_clip=0.0)
    assert engine.wrapped is engine.model  # no DDP wrapper with one process
    assert not has_process_group()


def test_deepspeed_config_is_derived_from_ours() -> None:
    cfg = deepspeed_config(batch_size_per_gpu=64, zero_stage=2, grad_clip=1.0)
    assert cfg["train_micro_batch_size_per_gpu"] == 64
    assert cfg["zero_optimization"]["stage"] == 2
    assert cfg["gradient_clipping"] == 1.0
    assert cfg["gradient_accumulation_steps"] == 1
    # The gradient bucket: the model's trainable elements, DeepSpeed's default (5e8) at most.
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    sized = deepspeed_config(batch_size_per_gpu=64, zero_stage=2, grad_clip=1.0, gradient_elements=11_000_000)
    assert sized["zero_optimization"]["reduce_bucket_size"] == 11_000_000
    huge = deepspeed_config(batch_size_per_gpu=64, zero_stage=2, grad_clip=1.0, gradient_elements=10**10)
    assert huge["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    # bf16 is autocast in the engine's forward; DeepSpeed's own bf16 mode would make the parameters bf16.
    assert not cfg.get("bf16", {}).get("enabled", False)
    assert "torch_autocast" not in cfg
    # bf16: DeepSpeed must let the autocast through (it switches an outside one off on CUDA), and must not
    # reduce any gradient in bf16 (an empty list of "lower precision safe" modules keeps them fp32).
    cfg16 = deepspeed_config(batch_size_per_gpu=64, zero_stage=2, grad_clip=1.0, bf16=True)
    assert cfg16["torch_autocast"] == {"enabled": True, "dtype": "bfloat16", "lower_precision_safe_modules": []}
    assert not cfg16.get("bf16", {}).get("enabled", False)


def test_ddp_engine_load_model_state() -> None:
    from _trainer_helpers import TinyNet

    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.training.optim import build_optimizer

    engine = build_engine(TinyNet(), lambda p: build_optimizer("sgd", p, lr=1e-6, weight_decay=0.0, momentum=0.0,
                                                               betas=(0.9, 0.999)),
                          engine="ddp", device=torch.device("cpu"), bf16=False, grad_clip=0.0)
    loaded = {k: v + 1.0 for k, v in engine.model.state_dict().items()}
    engine.load_model_state(loaded)
    assert_params_equal(engine.model.state_dict(), loaded, "DDP engine after load_model_state")


def _sgd_engine(model: torch.nn.Module, **kwargs):
    from hypersolid_scale.distributed import build_engine
    from hypersolid_scale.training.optim import build_optimizer

    return build_engine(model, lambda p: build_optimizer("sgd", p, lr=0.1, weight_decay=0.0, momentum=0.0,
                                                         betas=(0.9, 0.999)),
                        engine="ddp", device=torch.device("cpu"), bf16=False, **kwargs)


def _bn_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def test_sync_bn_choice_in_one_process() -> None:
    """auto leaves a single process alone (every BatchNorm sees the whole batch); true converts anyway."""
    from hypersolid_scale.distributed import GlobalBatchNorm

    def kinds(setting: str) -> set[str]:
        engine = _sgd_engine(_bn_net(), grad_clip=0.0, sync_bn=setting)
        return {type(m).__name__ for m in engine.model.modules() if "BatchNorm" in type(m).__name__}

    assert kinds("auto") == {"BatchNorm1d"} and kinds("false") == {"BatchNorm1d"}
    assert kinds("true") == {GlobalBatchNorm.__name__}
    with pytest.raises(ValueError, match="dist.sync_bn.*auto | true | false"):
        _sgd_engine(_bn_net(), grad_clip=0.0, sync_bn="sometimes")


def test_ddp_step_returns_the_grad_norm_as_a_tensor() -> None:
    torch.manual_seed(0)
    engine = _sgd_engine(_bn_net(), grad_clip=1e-3)
    x = torch.randn(8, 3)
    engine.backward(engine.model(x).pow(2).sum())
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in engine.model.parameters()]))
    norm = engine.step()
    assert isinstance(norm, torch.Tensor) and norm.dim() == 0  # no host sync inside step()
    torch.testing.assert_close(norm, expected)
    assert expected > 1e-2  # far above the clip: the norm reported is the one before clipping
    assert _sgd_engine(_bn_net(), grad_clip=0.0).step() is None


# ----------------------------------------------------------------------------------------------------------
# Single-process DeepSpeed: resumed weights, bf16 with BatchNorm
# ----------------------------------------------------------------------------------------------------------


def _run_helper(call: str) -> None:
    """Run ``_trainer_helpers.<call>`` in a process of its own (a fork of the warm server, run from tests/):
    DeepSpeed's process group must not outlive it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = run_python(["-c", f"import _trainer_helpers as h; h.{call}"], env=env, cwd=REPO / "tests", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


# Run in a process of its own with no launcher variables: the one-rank group that DeepSpeed needs is created once,
# through an in-memory store (no address, no port), and DeepSpeed joins it instead of starting its own.
_ONE_RANK_GROUP = """
import os, torch
from hypersolid_scale.distributed import build_engine, cleanup, ensure_process_group, get_world_size, has_process_group
from _trainer_helpers import TinyNet
assert not has_process_group()
ensure_process_group(torch.device("cpu"))
ensure_process_group(torch.device("cpu"))  # a second call keeps the group (a second init would raise)
assert has_process_group() and get_world_size() == 1
engines = [build_engine(TinyNet(), lambda p: torch.optim.SGD(p, lr=0.1), engine="deepspeed",
                        device=torch.device("cpu"), bf16=False, grad_clip=0.0, zero_stage=stage,
                        batch_size_per_gpu=2) for stage in (0, 2)]
assert get_world_size() == 1
# ZeRO-2's gradient bucket (allocated at every step) is the model's size, not DeepSpeed's 5e8 elements.
numel = sum(p.numel() for p in engines[1].model.parameters() if p.requires_grad)
assert engines[1].ds_optimizer.reduce_bucket_size == numel < 10_000, (engines[1].ds_optimizer.reduce_bucket_size, numel)
print("env", sorted(k for k in ("MASTER_ADDR", "MASTER_PORT") if k in os.environ), os.environ["LOCAL_RANK"])
cleanup()
assert not has_process_group()
"""


@pytest.mark.slow
def test_deepspeed_in_one_process_joins_one_group_without_a_port() -> None:
    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = run_python(["-c", _ONE_RANK_GROUP], env=env, cwd=REPO / "tests", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "env [] 0" in proc.stdout


@pytest.mark.slow
def test_deepspeed_load_model_state_survives_the_next_step(tmp_path: Path) -> None:
    """ZeRO keeps fp32 master weights apart from the module; a resume that loads only the module's weights
    must refresh them, or the first step copies the old weights back."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "resume.pt"
    specs = ["0:fp32", "1:fp32", "2:fp32", "1:bf16"]
    _run_helper(f"deepspeed_load_model_state({str(out)!r}, {specs!r})")
    results = torch.load(out, weights_only=True)
    for spec in specs:
        r = results[spec]
        # lr 1e-8: one step moves the weights by far less than the 1.0 between the old and the loaded ones.
        for k in r["old"]:
            torch.testing.assert_close(r["after"][k], r["loaded"][k], rtol=0, atol=1e-3,
                                       msg=lambda m: f"stage:precision {spec}, {k}: weights after one step "
                                                     f"are not the loaded ones: {m}")


@pytest.mark.slow
def test_deepspeed_bf16_trains_a_batchnorm_model_with_fp32_parameters(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    out = tmp_path / "bf16.pt"
    _run_helper(f"deepspeed_bf16_batchnorm_step({str(out)!r})")
    r = torch.load(out, weights_only=True)
    # bf16 autocast reached the model inside the engine; the loss computes in fp32 all the same.
    assert r["feats_dtype"] == "torch.bfloat16" and r["loss_dtype"] == "torch.float32"
    assert all(torch.isfinite(torch.tensor(loss)) for loss in r["losses"])
    for k, p in r["params"].items():
        assert p.dtype == torch.float32, f"{k} is {p.dtype}; parameters must stay float32 under bf16"
        assert torch.isfinite(p).all(), k
    for k, b in r["buffers"].items():
        assert b.dtype != torch.bfloat16, f"buffer {k} is bf16"
    # The steps did train: bf16 did not silently turn into a no-op.
    assert max((r["params"][k] - r["before"][k]).abs().max().item() for k in r["params"]) > 1e-4
    assert r["emb"].dtype == torch.float32 and torch.isfinite(r["emb"]).all()


# ----------------------------------------------------------------------------------------------------------
# 2 gloo processes vs 1 process, several optimizer steps
# ----------------------------------------------------------------------------------------------------------


def _run_torchrun(tmp_path: Path, specs: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = run_processes([str(HELPERS), str(tmp_path), *specs], nproc=2, env=env, timeout=420)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def assert_params_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5, msg=lambda m: f"{what}, {k}: {m}")


@pytest.mark.slow
def test_two_processes_match_one_process_ddp_and_deepspeed(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed")
    sys.path.insert(0, str(REPO / "tests"))
    from _trainer_helpers import train_params

    specs = ["ddp", "deepspeed:0", "deepspeed:1", "deepspeed:2", "deepspeed:2:2"]
    _run_torchrun(tmp_path, specs)
    torch.set_num_threads(1)
    reference = train_params("ddp")
    start = {k: v.clone() for k, v in reference.items()}
    for spec in specs:
        got = torch.load(tmp_path / f"{spec.replace(':', '_')}.pt", weights_only=True)
        assert_params_equal(got, reference, f"2-process {spec} vs 1 process")
    # The test can fail: parameters moved away from the initial ones by far more than the tolerance.
    torch.manual_seed(0)
    from _trainer_helpers import TinyNet

    init = TinyNet().state_dict()
    assert max((start[k] - init[k]).abs().max().item() for k in init) > 1e-2


def test_an_engine_registered_at_run_time_is_a_choice_and_trains(tmp_path: Path) -> None:
    """A new engine is one registered class (docs/design.md §7): `dist.engine=<its name>` validates, and
    `build_engine` gives it what it needs to train; removing it takes it out of the choices again."""
    from hypersolid_scale.config.schema import load_config
    from hypersolid_scale.distributed.engines import engine_names, register_engine, unregister_engine
    from hypersolid_scale.distributed.engines.ddp import DDPEngine

    class CountingEngine(DDPEngine):
        kind = "test_counting"
        steps = 0

        def step(self):
            type(self).steps += 1
            return super().step()

    register_engine(CountingEngine)
    try:
        assert engine_names()[0] == "ddp" and "test_counting" in engine_names()
        cfg = load_config(REPO / "configs" / "quickstart.yaml", ["dist.engine=test_counting"])
        assert cfg.dist.engine == "test_counting"
        from hypersolid_scale.distributed import build_engine
        from hypersolid_scale.training.optim import build_optimizer

        engine = build_engine(_bn_net(), lambda p: build_optimizer("sgd", p, lr=0.1, weight_decay=0.0, momentum=0.0,
                                                                   betas=(0.9, 0.999)),
                              engine="test_counting", device=torch.device("cpu"), bf16=False, grad_clip=0.0)
        before = [p.detach().clone() for p in engine.model.parameters()]
        engine.backward(engine.model(torch.randn(8, 3)).square().mean())
        engine.step()
        assert CountingEngine.steps == 1
        assert any(not torch.equal(a, p) for a, p in zip(before, engine.model.parameters()))
    finally:
        unregister_engine("test_counting")
    assert "test_counting" not in engine_names()
    with pytest.raises(ConfigError, match="dist.engine.*test_counting.*choose one of: ddp"):
        load_config(REPO / "configs" / "quickstart.yaml", ["dist.engine=test_counting"])
