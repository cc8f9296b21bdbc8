"""The global batch (data/batch.py): what a config states stays what it trains at, on any GPU count."""

from __future__ import annotations

from pathlib import Path

import pytest

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data import DataConfig, plan_batch
from hypersolid_scale.safety.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if "sweeps" not in p.parts)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_config_trains_at_its_global_batch_on_any_gpu_count(path: Path) -> None:
    cfg = load_config(path)
    stated = cfg.data.global_batch_size
    assert stated is not None and cfg.data.batch_size_per_gpu is None, "configs state the global batch"
    for world in (1, 2, 4, 8):
        if stated % world:
            continue
        plan = plan_batch(cfg.data, world_size=world, accumulate_steps=cfg.optim.accumulate_steps)
        assert plan.global_batch == stated
        assert plan.micro_batch * world * plan.accumulate_steps == stated


def test_cifar100_on_the_slurm_examples_eight_gpus_trains_at_128() -> None:
    cfg = load_config(REPO / "configs" / "cifar100.yaml")
    plan = plan_batch(cfg.data, world_size=8)
    assert (plan.global_batch, plan.micro_batch) == (128, 16)
    assert plan.describe() == "global batch 128 = 8 process(es) x 16 images per GPU"


def test_accumulation_divides_the_per_gpu_batch_not_the_global_one() -> None:
    plan = plan_batch(DataConfig(global_batch_size=4096), world_size=8, accumulate_steps=4)
    assert (plan.global_batch, plan.micro_batch, plan.rank_batch) == (4096, 128, 512)
    assert "8 process(es) x 4 accumulation steps x 128 images per GPU" in plan.describe()


def test_a_global_batch_that_does_not_divide_is_one_line_naming_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        plan_batch(DataConfig(global_batch_size=100), world_size=3, accumulate_steps=2)
    message = str(err.value)
    assert "\n" not in message
    assert "data.global_batch_size=100" in message and "multiple of 6" in message and "96 or 102" in message


def test_the_per_gpu_key_still_works_and_its_global_batch_grows_with_the_gpus() -> None:
    plan = plan_batch(DataConfig(batch_size_per_gpu=64), world_size=4, accumulate_steps=2)
    assert (plan.global_batch, plan.micro_batch) == (512, 64)
    assert "grows with the GPU count" in plan.describe()
    assert plan_batch(DataConfig(), world_size=2).micro_batch == 256  # neither key: 256 per GPU, as before


def test_one_way_to_state_the_batch(tmp_path: Path) -> None:
    quick = REPO / "configs" / "quickstart.yaml"
    with pytest.raises(ConfigError, match="overrides set both"):
        load_config(None, ["data.global_batch_size=128", "data.batch_size_per_gpu=64"])
    both = tmp_path / "both.yaml"
    both.write_text("data:\n  global_batch_size: 128\n  batch_size_per_gpu: 64\n")
    with pytest.raises(ConfigError, match="are both set"):
        load_config(both)
    # An override of one key replaces the file's other one.
    cfg = load_config(quick, ["data.batch_size_per_gpu=32"])
    assert (cfg.data.global_batch_size, cfg.data.batch_size_per_gpu) == (None, 32)
    cfg = load_config(quick, ["data.global_batch_size=256"])
    assert (cfg.data.global_batch_size, cfg.data.batch_size_per_gpu) == (256, None)
    with pytest.raises(ConfigError, match="must be >= 1"):
        load_config(quick, ["data.global_batch_size=0"])
    with pytest.raises(ConfigError, match="optim.accumulate_steps"):
        load_config(quick, ["optim.accumulate_steps=0"])
