"""Checkpoints: atomic, weights_only-loadable, pruned, corruption-tolerant, config-guarded."""

from __future__ import annotations

import os
import pickle
import random
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.config import fingerprint, load_config, to_dict
from hypersolid_scale.errors import CheckpointError
from hypersolid_scale.models import build_model

OVERRIDES = ["model.in_channels=1", "model.small_cnn_width=4", "model.proj_layers=1", "model.proj_dim=8"]


def _state(step: int, cfg=None) -> dict:
    cfg = cfg or load_config(None, OVERRIDES)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 2, 1, 8, 8).unbind(1)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": {"step": step},
            "step": step, "epoch": 0, "rng": [ck.rng_state()], "loader": {"epoch": 0, "batches_done": step},
            "config": to_dict(cfg), "config_fingerprint": fingerprint(cfg), "mlflow_run_id": "abc",
            "tracking_uri": None}


def test_save_is_weights_only_loadable_and_complete(tmp_path: Path) -> None:
    path = ck.save_checkpoint(tmp_path, _state(5))
    assert path == tmp_path / "checkpoints" / "step_00000005.pt"
    raw = torch.load(path, weights_only=True)  # no pickled code needed
    for key in ("model", "optimizer", "scheduler", "step", "epoch", "rng", "loader", "config",
                "config_fingerprint", "mlflow_run_id", "tracking_uri", "format_version"):
        assert key in raw
    assert not any(k.startswith("module.") for k in raw["model"])
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_rng_state_roundtrip() -> None:
    state = ck.rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    ck.set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_keep_last_prunes_oldest_by_step(tmp_path: Path) -> None:
    for step in (1, 2, 10, 3):
        ck.save_checkpoint(tmp_path, _state(step), keep_last=2)
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000003.pt", "step_00000010.pt"]


def test_truncated_newest_checkpoint_falls_back_with_warning(tmp_path: Path) -> None:
    ck.save_checkpoint(tmp_path, _state(1))
    newest = ck.save_checkpoint(tmp_path, _state(2))
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) // 2])  # a crash mid-copy, a full disk...
    (tmp_path / "checkpoints" / "step_00000003.pt").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="corrupt or truncated"):
        found = ck.find_resume_checkpoint(tmp_path)
    assert found is not None and found[1]["step"] == 1
    with pytest.raises(ValueError, match="corrupt or truncated"):
        ck.load_checkpoint(newest)
    with pytest.raises(FileNotFoundError):
        ck.load_checkpoint(tmp_path / "nope.pt")


def test_non_checkpoint_file_is_refused(tmp_path: Path) -> None:
    torch.save({"weights": torch.zeros(1)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not a Hypersolid checkpoint"):
        ck.load_checkpoint(tmp_path / "x.pt")


def test_incompatible_config_refused_unless_forced(tmp_path: Path) -> None:
    state = _state(1)
    other = load_config(None, [*OVERRIDES, "loss.alpha=0.5"])
    with pytest.raises(ValueError, match=r"(?s)loss.alpha: 0.9 -> 0.5.*checkpoint.resume=force"):
        ck.check_compatible(state, to_dict(other), fingerprint(other), force=False)
    with pytest.warns(UserWarning, match="despite config changes"):
        ck.check_compatible(state, to_dict(other), fingerprint(other), force=True)
    longer = load_config(None, [*OVERRIDES, "epochs=500"])
    ck.check_compatible(state, to_dict(longer), fingerprint(longer), force=False)  # training longer is fine


def test_build_model_from_checkpoint_and_random_init_baseline(tmp_path: Path) -> None:
    state = _state(4)
    path = ck.save_checkpoint(tmp_path, state)
    model, cfg = ck.build_model_from_checkpoint(path)
    assert cfg.model.small_cnn_width == 4 and not model.training
    for k, v in state["model"].items():
        assert torch.equal(model.state_dict()[k], v)
    init = ck.random_init_checkpoint(ck.load_checkpoint(path))
    torch.manual_seed(cfg.seed)
    fresh = build_model(cfg.model).state_dict()
    assert all(torch.equal(init["model"][k], fresh[k]) for k in fresh)
    assert any(not torch.equal(init["model"][k], state["model"][k]) for k in fresh)  # the trained ones moved


class _NotAllowed:
    """A pickled object of a class: a checkpoint of this trainer never holds one."""


@pytest.mark.parametrize("kind, why", [
    ("truncated", "cut short"), ("random", "not a PyTorch checkpoint"), ("empty", "empty"),
    ("plain_pickle", "not a PyTorch checkpoint"), ("object", "Python objects other than tensors"),
])
def test_unreadable_files_get_our_explanation_never_torchs_advice(tmp_path: Path, kind: str, why: str) -> None:
    path = tmp_path / "step_00000001.pt"
    if kind == "truncated":
        data = ck.save_checkpoint(tmp_path / "run", _state(1)).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random":
        path.write_bytes(os.urandom(2048))
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "plain_pickle":
        path.write_bytes(pickle.dumps({"model": {}}))
    else:
        torch.save({"model": _NotAllowed()}, path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's own warnings about the file (file an issue...) stay hidden
        with pytest.raises(CheckpointError, match=why) as err:
            ck.load_checkpoint(path)
    assert isinstance(err.value, ValueError) and str(path) in str(err.value)
    assert "weights_only" not in str(err.value) and "\n" not in str(err.value)


def test_missing_checkpoint_is_a_checkpoint_error_and_a_file_not_found_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as err:
        ck.load_checkpoint(tmp_path / "nope.pt")
    assert isinstance(err.value, FileNotFoundError)


def test_weights_of_another_architecture_name_the_file(tmp_path: Path) -> None:
    state = _state(3)
    state["model"] = build_model(load_config(None, [*OVERRIDES, "model.small_cnn_width=8"]).model).state_dict()
    path = ck.save_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match=rf"{path} holds weights of another architecture.*small_cnn"):
        ck.build_model_from_checkpoint(path)
