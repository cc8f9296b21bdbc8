"""Cross-section checks at config validation (config/combinations.py): each combination the run would refuse
later is refused by ``load_config``, before any process starts, in one line naming both keys and a value that
works; and that value loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hypersolid_scale.config.combinations import RULES
from hypersolid_scale.config.schema import load_config
from hypersolid_scale.models import ModelConfig, ViTOptions, build_backbone
from hypersolid_scale.safety.errors import ConfigError, UserError

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"

# rule -> (the overrides it refuses, the keys and fix its message names, the overrides that fix it)
CASES = {
    "check_engine": (
        ["dist.precision=fp64", "dist.engine=deepspeed"],
        ["dist.precision=fp64", "dist.engine=ddp"],
        ["dist.precision=fp32", "dist.engine=deepspeed"],
    ),
    "check_transport_on_device": (
        ["dist.transport=nccl", "dist.device=cpu"],
        ["dist.transport=nccl", "dist.device=cpu", "dist.transport=gloo"],
        ["dist.transport=gloo", "dist.device=cpu"],
    ),
    "check_crops_fit_backbone": (
        ["model.arch=vit_tiny"],  # 28 px crops, patch_size 16: the new user
        ["data.global_crop_size=28", "model.vit_tiny.patch_size=16", "model.arch=vit_tiny", "model.vit_tiny.patch_size=4"],
        ["model.arch=vit_tiny", "model.vit_tiny.patch_size=4"],
    ),
    "check_frozen_heads_under_zero": (
        ["method.name=dino", "dist.engine=deepspeed", "dist.zero_stage=2"],
        ["method.dino.freeze_last_layer_epochs=1", "dist.zero_stage=2", "method.dino.freeze_last_layer_epochs=0"],
        ["method.name=dino", "dist.engine=deepspeed", "dist.zero_stage=2", "method.dino.freeze_last_layer_epochs=0"],
    ),
    "check_local_views_smaller": (
        ["method.name=dino", "data.local_crop_size=28"],
        ["method.name=dino", "(28 px)", "data.local_crop_size", "data.num_local_views=0"],
        ["method.name=dino", "data.local_crop_size=12"],
    ),
}
# Rules tested on their own: the launcher's world size (below), and a method without a projection head (none of
# the built-in ones: tests/test_method_registry.py registers one).
OWN_TESTS = {"check_batch_splits", "check_per_rank_state", "check_features_have_a_head"}


def test_every_rule_has_a_case() -> None:
    assert {rule.__name__ for rule in RULES} == {*CASES, *OWN_TESTS}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_a_refused_combination_is_found_when_the_config_is_loaded(rule: str) -> None:
    refused, named, fixed = CASES[rule]
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, refused)
    message = str(err.value)
    assert "\n" not in message and "internal" not in message
    assert all(words in message for words in named), message
    load_config(QUICKSTART, fixed)  # the value the message suggests works


def test_the_batch_must_split_over_the_processes_the_launcher_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(
        ConfigError, match=r"global_batch_size=256 does not split over 3 process.*accumulate"
    ):
        load_config(QUICKSTART, ["data.global_batch_size=256"])
    assert load_config(QUICKSTART, ["data.global_batch_size=255"]).data.global_batch_size == 255
    monkeypatch.setenv("WORLD_SIZE", "1")
    load_config(QUICKSTART, ["data.global_batch_size=256"])


def test_a_method_s_rule_on_the_world_size_is_checked_with_the_launcher_s(monkeypatch: pytest.MonkeyPatch) -> None:
    swav = ["method.name=swav", "method.swav.queue_length=64", "eval.features=backbone"]
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="method.swav.queue_length > 0 .*set method.swav.queue_length=0"):
        load_config(QUICKSTART, swav)
    load_config(QUICKSTART, [*swav[:1], "method.swav.queue_length=0"])
    monkeypatch.setenv("WORLD_SIZE", "1")
    load_config(QUICKSTART, swav)


def test_a_vit_given_an_image_of_another_size_is_the_user_s_error_not_an_internal_one() -> None:
    """What the validation cannot see (e.g. another data set's images at evaluation) is still a UserError."""
    vit, _ = build_backbone(ModelConfig(arch="vit_tiny", in_channels=1, vit_tiny=ViTOptions(img_size=32, patch_size=16)))
    with pytest.raises(UserError, match=r"28x28 is not a multiple of model.vit_tiny.patch_size=16.*data.global_crop_size"):
        vit(torch.zeros(1, 1, 28, 28))
