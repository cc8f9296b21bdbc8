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
from hypersolid_scale.checkpoint.layout import split_method_state
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import load_config, to_dict
from hypersolid_scale.methods import build_method_model
from hypersolid_scale.safety.errors import CheckpointError

OVERRIDES = ["model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=1", "method.hypersolid.out_dim=8"]


def _weights(cfg) -> tuple[dict, dict]:
    """``(model, method)`` states of a freshly built run of ``cfg``, in the checkpoint's layout."""
    return split_method_state(build_method_model(cfg.model, cfg.method).state_dict())


def _state(step: int, cfg=None) -> dict:
    cfg = cfg or load_config(None, OVERRIDES)
    torch.manual_seed(cfg.seed)
    trained = build_method_model(cfg.model, cfg.method)
    opt = torch.optim.AdamW(trained.parameters())
    trained.projector(trained.backbone(torch.randn(4, 1, 8, 8))).sum().backward()  # a step that moves the weights
    opt.step()
    model, method = split_method_state(trained.state_dict())
    return {"model": model, "method": method, "optimizer": opt.state_dict(), "scheduler": {"step": step},
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
    other = load_config(None, [*OVERRIDES, "method.hypersolid.alpha=0.5"])
    with pytest.raises(ValueError, match=r"(?s)method.hypersolid.alpha: 0.9 -> 0.5.*checkpoint.resume=force"):
        ck.check_compatible(state, to_dict(other), fingerprint(other), force=False)
    with pytest.warns(UserWarning, match="despite config changes"):
        ck.check_compatible(state, to_dict(other), fingerprint(other), force=True)
    longer = load_config(None, [*OVERRIDES, "epochs=500"])
    ck.check_compatible(state, to_dict(longer), fingerprint(longer), force=False)  # training longer is fine
    # The per-rank batch changes with the world size; restore_run_state compares the global batch instead.
    wider = load_config(None, [*OVERRIDES, "data.batch_size_per_gpu=128"])
    ck.check_compatible(state, to_dict(wider), fingerprint(wider), force=False)


def test_the_global_batch_of_a_checkpoint_is_stored_or_derived() -> None:
    state = _state(1, load_config(None, [*OVERRIDES, "data.batch_size_per_gpu=64"]))
    assert ck.saved_global_batch(state) is None  # neither global_batch nor world_size: resumes at any
    assert ck.saved_global_batch({**state, "world_size": 2}) == 128  # before global_batch was stored
    assert ck.saved_global_batch({**state, "world_size": 2, "global_batch": 96}) == 96


def test_build_model_from_checkpoint_and_random_init_baseline(tmp_path: Path) -> None:
    state = _state(4)
    path = ck.save_checkpoint(tmp_path, state)
    model, cfg = ck.build_model_from_checkpoint(path)
    assert cfg.model.small_cnn.width == 4 and not model.training
    # the trainer's layout: the backbone in "model", the method's heads and state in "method"
    read, trained = model.state_dict(), {**state["model"], **state["method"]}
    assert set(read) == set(state["model"]) | {k for k in state["method"] if k.startswith("projector.")}
    assert all(torch.equal(read[k], v) for k, v in trained.items() if k in read)
    init = ck.random_init_checkpoint(ck.load_checkpoint(path))
    assert all(k.startswith("backbone.") for k in init["model"]) and init["method"]
    weights = {**init["model"], **init["method"]}
    torch.manual_seed(cfg.seed)
    fresh_model, fresh_method = _weights(cfg)
    fresh = {**fresh_model, **fresh_method}
    tensors = [k for k, v in fresh.items() if isinstance(v, torch.Tensor)]
    assert set(weights) == set(fresh) and all(torch.equal(weights[k], fresh[k]) for k in tensors)
    assert any(not torch.equal(weights[k], trained[k]) for k in tensors)  # the trained ones moved
    model, _ = ck.build_model_from_checkpoint(init)  # evaluation reads it
    assert all(torch.equal(v, fresh[k]) for k, v in model.state_dict().items())


def test_evaluation_reads_a_baselines_own_projection_head(tmp_path: Path) -> None:
    """Every method's evaluation model holds its projection head (SimCLR's ``head``) with the trained weights;
    a checkpoint without its method state (a backbone alone) gets none."""
    state = _state(2, load_config(None, [*OVERRIDES, "method.name=simclr", "method.simclr.hidden_dim=16",
                                         "method.simclr.out_dim=8"]))
    model, cfg = ck.build_model_from_checkpoint(ck.save_checkpoint(tmp_path / "a", state))
    head = {k.removeprefix("head."): v for k, v in state["method"].items() if k.startswith("head.")}
    assert cfg.method.name == "simclr" and head and model.projector is not None
    read = model.projector.state_dict()
    assert read.keys() == head.keys() and all(torch.equal(read[k], v) for k, v in head.items())
    assert model.projector(model.embed(torch.randn(3, 1, 8, 8))).shape == (3, 8)
    bare, _ = ck.build_model_from_checkpoint(ck.save_checkpoint(tmp_path / "b", {**state, "method": None}))
    assert bare.projector is None


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
    state["model"] = _weights(load_config(None, [*OVERRIDES, "model.small_cnn.width=8"]))[0]
    path = ck.save_checkpoint(tmp_path, state)
    with pytest.raises(CheckpointError, match=rf"{path} holds weights of another architecture.*small_cnn") as err:
        ck.build_model_from_checkpoint(path)
    # torch names every tensor; the message counts them and shows the first few, cut between names.
    wrong = [k for k, v in _weights(load_config(None, OVERRIDES))[0].items() if v.shape != state["model"][k].shape]
    assert f"({len(wrong)} of another shape ({', '.join(wrong[:3])}, ...))" in str(err.value), str(err.value)


def test_weights_of_another_network_count_the_missing_and_unexpected_tensors(tmp_path: Path) -> None:
    state = _state(3)
    state["model"] = _weights(load_config(None, [*OVERRIDES, "model.arch=resnet18"]))[0]
    path = ck.save_checkpoint(tmp_path, state)
    expected = set(_weights(load_config(None, OVERRIDES))[0])
    missing = [k for k in expected - set(state["model"]) if not k.endswith("num_batches_tracked")]  # may lack
    unexpected = set(state["model"]) - expected
    with pytest.raises(CheckpointError) as err:
        ck.build_model_from_checkpoint(path)
    text = str(err.value)
    assert f"{len(missing)} tensors missing from the file (" in text, text
    assert f"{len(unexpected)} tensors the model does not have (" in text, text
    assert '"' not in text and len(text) < 800, text  # names, not torch's quoted list of hundreds


def test_a_directory_given_as_checkpoint_names_its_newest_step_file(tmp_path: Path) -> None:
    for step in (9, 10):
        ck.save_checkpoint(tmp_path / "run", _state(step))
    (tmp_path / "run" / "checkpoints" / "notes.txt").write_text("x")
    (tmp_path / "run" / "checkpoints" / "step_00000011.pt.123.tmp").write_bytes(b"partial")
    newest = str(tmp_path / "run" / "checkpoints" / "step_00000010.pt")
    for given in (tmp_path / "run", tmp_path / "run" / "checkpoints"):
        with pytest.raises(CheckpointError, match="is a directory, not a checkpoint file") as err:
            ck.load_checkpoint(given)
        assert newest in str(err.value) and "does not exist" not in str(err.value)
    with pytest.raises(CheckpointError, match="holds no step_"):
        ck.load_checkpoint(tmp_path / "run" / "..")


class _Fails:
    """A ``torch.save`` that writes a few bytes, then raises what ``make`` builds."""

    def __init__(self, make) -> None:
        self.make = make

    def __call__(self, obj, f, *args, **kwargs) -> None:
        f.write(b"partial")
        raise self.make()


def _torch_writer_error() -> RuntimeError:
    return RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662")


def test_only_torchs_write_failures_become_checkpoint_errors(tmp_path: Path, monkeypatch) -> None:
    """torch's zip writer reports a failed write as a RuntimeError: that one is the user's disk; any other
    RuntimeError is a bug and stays one. Either way nothing is left behind."""
    target = tmp_path / "step_00000004.pt"
    monkeypatch.setattr(torch, "save", _Fails(_torch_writer_error))
    with pytest.raises(CheckpointError, match=r"step_00000004\.pt: the write stopped part-way.*MiB free"):
        ck.atomic_save({"a": torch.ones(3)}, target)
    monkeypatch.setattr(torch, "save", _Fails(lambda: RuntimeError("a bug in a tensor's __reduce__")))
    with pytest.raises(RuntimeError, match="a bug") as err:
        ck.atomic_save({"a": torch.ones(3)}, target)
    assert not isinstance(err.value, CheckpointError)
    assert not list(tmp_path.iterdir())


def test_a_runtime_error_with_less_free_space_than_the_tensors_is_a_full_disk(tmp_path: Path, monkeypatch) -> None:
    real = ck.files.shutil.disk_usage
    monkeypatch.setattr(ck.files.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    monkeypatch.setattr(torch, "save", _Fails(lambda: RuntimeError("something torch says")))
    with pytest.raises(CheckpointError, match=r"No space left on device \(0\.0 MiB free there\).*keep_last"):
        ck.atomic_save({"a": torch.ones(1000)}, tmp_path / "step_00000004.pt")  # 4000 bytes of tensor data
    with pytest.raises(RuntimeError, match="something torch says") as err:
        ck.atomic_save({"a": torch.ones(100)}, tmp_path / "step_00000004.pt")  # 400 bytes: it would have fit
    assert not isinstance(err.value, CheckpointError)
    assert not list(tmp_path.iterdir())


class _Engine:
    def __init__(self) -> None:
        self.loaded: list[str] = []

    def load_model_state(self, state: dict) -> None:
        self.loaded.append("model")

    def load_optimizer_state(self, state: dict) -> None:
        self.loaded.append("optimizer")


class _StreamsByRank:
    """A loader like WebDataset's: its batches depend on the world size."""

    world_size_invariant = False

    def __init__(self) -> None:
        self.state: dict = {}

    def __len__(self) -> int:
        return 10

    def load_state_dict(self, state: dict) -> None:
        self.state = state


@pytest.mark.parametrize("done, streams", [(4, True), (10, False)])
def test_another_world_size_at_the_same_global_batch_resumes_with_one_line(capfd, done: int, streams: bool) -> None:
    state = {**_state(4), "world_size": 2, "global_batch": 128, "path": "ck.pt"}
    state["loader"] = {"epoch": 0, "batches_done": done}
    engine, loader = _Engine(), _StreamsByRank()
    common = dict(engine=engine, loader=loader, rank=0, steps_per_epoch=10, force=False)
    assert ck.restore_run_state(state, world_size=1, global_batch=128, **common) == (4, 0 if streams else 1)
    assert engine.loaded == ["model", "optimizer"] and loader.state == state["loader"]
    lines = capfd.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: resuming ck.pt, written by 2 process(es), on 1 at the same "
                                                   "global batch of 128: the step (4)"), lines
    assert "WebDataset augmentations draw from them" in lines[0]
    # Mid-epoch, the rest of the epoch comes from the new streams; at its end nothing of the streams is lost.
    assert ("the rest of epoch 0 is drawn from the 1-process streams" in lines[0]) == streams, lines[0]
    with pytest.raises(CheckpointError, match=r"^checkpoint ck.pt was trained with a global batch of 128 images "
                                              r"\(2 process\(es\)\), this run's is 64 \(1 process\(es\)\)[^\n]*$"):
        ck.restore_run_state(state, world_size=1, global_batch=64, **common)
