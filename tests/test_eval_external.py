"""launch/eval.py --backbone SOURCE:NAME --weights FILE: published backbones through the same suites.

The weights are random (seeded) torchvision / timm networks saved in the layouts found in the wild; their
features are checked against the library's own forward pass, and bad files against the one-line errors.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from _errors import assert_one_error_line
from _eval_helpers import EXTERNAL_FAST, make_checkpoint, run_launch_eval
from torch import nn

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.data import build_eval_datasets
from hypersolid_scale.eval.app import main
from hypersolid_scale.eval.embed import extract_embeddings
from hypersolid_scale.eval.source import external_source
from hypersolid_scale.models.external import build_external, load_external_backbone, match_state_dict, parse_backbone
from hypersolid_scale.safety.errors import CheckpointError, ConfigError


def _resnet18(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = torchvision.models.resnet18(weights=None)
    # Non-trivial BatchNorm statistics, so a buffer left at its default would change the features.
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _save_layouts(net: nn.Module, folder: Path) -> dict[str, Path]:
    """The same weights as a plain state dict, a DDP checkpoint, and a lightly module's checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    state = net.state_dict()
    # lightly's examples: backbone = nn.Sequential(*list(resnet.children())[:-1]) next to a projection head
    lightly = {f"backbone.{k}": v for k, v in nn.Sequential(*list(net.children())[:-1]).state_dict().items()}
    lightly.update({"projection_head.layers.0.weight": torch.randn(64, 512),
                    "projection_head.layers.0.bias": torch.randn(64)})
    files = {"plain": state, "ddp": {"state_dict": {f"module.{k}": v for k, v in state.items()}, "epoch": 3},
             "lightly": {"state_dict": lightly, "global_step": 10}}
    paths = {}
    for name, obj in files.items():
        paths[name] = folder / f"{name}.pt"
        torch.save(obj, paths[name])
    return paths


def _report(path: Path) -> dict[str, Any]:
    return json.loads((path.parent / "eval" / path.stem / "report.json").read_text())


# ---------------------------------------------------------------------------------------------- features


def test_three_layouts_give_identical_knn_numbers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    paths = _save_layouts(_resnet18(), tmp_path / "weights")
    reports = {}
    for name, path in paths.items():
        assert main(["--backbone", "torchvision:resnet18", "--weights", str(path), "--no-mlflow",
                     *EXTERNAL_FAST]) == 0
        assert "(extracted)" in capsys.readouterr().out  # each file embeds the data itself (no shared cache)
        reports[name] = _report(path)  # the default output folder: <dirname(weights)>/eval/<stem>
    metrics = [r["metrics"] for r in reports.values()]
    assert metrics[0] == metrics[1] == metrics[2] and set(metrics[0]) == {"knn_k5_majority", "knn_k5_weighted"}
    assert 30 < metrics[0]["knn_k5_majority"] <= 100  # digits: a random ResNet is far above chance (10 %)
    meta = {name: r["meta"] for name, r in reports.items()}
    assert meta["plain"]["dropped"] == ["fc.weight", "fc.bias"] and meta["ddp"]["dropped_keys"] == 2
    assert meta["lightly"]["dropped"] == ["projection_head.layers.0.weight", "projection_head.layers.0.bias"]
    for name, m in meta.items():
        assert m["weights"] == str(paths[name]) and m["backbone"] == "torchvision:resnet18"
        assert m["loaded_tensors"] == 120 and m["feature_dim"] == 512 and m["n_train"] == 300
        assert "repeated to the backbone's 3 channels" in m["input"]  # digits are grey


def test_features_equal_torchvisions_pooled_output(tmp_path: Path) -> None:
    net = _resnet18(seed=1)
    path = _save_layouts(net, tmp_path)["lightly"]
    src = external_source("torchvision:resnet18", path, [], ["data.dataset=digits"])
    _, test_ds = build_eval_datasets(load_config(None, ["data.dataset=digits"]).data)
    batch = torch.utils.data.Subset(test_ds, range(48))
    feats, _ = extract_embeddings(src.model, batch, batch_size=16, device="cpu", progress=False)
    reference = copy.deepcopy(net)
    reference.fc = nn.Identity()
    x = torch.stack([test_ds[i][0] for i in range(48)])  # (48, 1, 16, 16), normalised by the eval transform
    with torch.no_grad():
        expected = reference(x.repeat(1, 3, 1, 1))
    assert feats.shape == (48, 512) and torch.allclose(feats, expected, atol=1e-5)


def test_timm_vit_tiny_state_dict(tmp_path: Path) -> None:
    import timm

    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False)  # with its 1000-class head
    path = tmp_path / "vit_tiny.pth"
    torch.save(vit.state_dict(), path)
    assert main(["--backbone", "timm:vit_tiny_patch16_224", "--weights", str(path), "--no-mlflow",
                 *EXTERNAL_FAST]) == 0
    report = _report(path)
    assert report["meta"]["dropped"] == ["head.weight", "head.bias"] and report["meta"]["feature_dim"] == 192
    assert 10 < report["metrics"]["knn_k5_majority"] <= 100
    # the features are timm's own pooled output (CLS token), grey repeated to RGB; at the nominal 224 px the
    # position embeddings are used as they are
    net, _ = load_external_backbone("timm:vit_tiny_patch16_224", path, data_channels=1)
    vit.reset_classifier(0)
    x = torch.randn(2, 1, 224, 224)
    with torch.no_grad():
        assert torch.allclose(net(x), vit.eval()(x.repeat(1, 3, 1, 1)), atol=1e-5)


def test_native_backbone_from_a_training_checkpoint_matches_its_checkpoint_eval(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")  # small_cnn of width 8 on digits
    fast = [a for a in EXTERNAL_FAST if a != "data.dataset=digits"]
    assert main(["--checkpoint", str(path), "--no-mlflow", "--output-dir", str(tmp_path / "ckpt"), *fast]) == 0
    assert main(["--backbone", "native:small_cnn", "--weights", str(path), "--no-mlflow", "--output-dir",
                 str(tmp_path / "ext"), "data.dataset=digits", "model.small_cnn.width=8", *fast]) == 0
    ckpt_report = json.loads((tmp_path / "ckpt" / "report.json").read_text())
    ext_report = json.loads((tmp_path / "ext" / "report.json").read_text())
    assert ext_report["metrics"] == ckpt_report["metrics"]
    assert ext_report["meta"]["dropped"] == []  # the checkpoint's model state is the backbone's alone
    assert "input" not in ext_report["meta"]  # built for the data's one channel: nothing repeated


# ---------------------------------------------------------------------------------------------- names


def test_former_source_name_is_read_as_native_with_a_note(capsys: pytest.CaptureFixture) -> None:
    assert parse_backbone("hypersolid:small_cnn") == ("native", "small_cnn")
    assert "hypersolid:small_cnn is read as native:small_cnn" in capsys.readouterr().err
    assert parse_backbone("native:resnet18") == ("native", "resnet18")
    with pytest.raises(ConfigError, match="native:resnet18"):
        parse_backbone("nativ:resnet18")


def test_prefix_under_another_name_is_found_and_can_be_stripped(tmp_path: Path) -> None:
    net = _resnet18()
    path = tmp_path / "dino.pth"
    torch.save({"teacher": {f"backbone.{k}": v for k, v in net.state_dict().items()}}, path)
    with pytest.raises(CheckpointError, match=r"--strip-prefix teacher\.") as err:
        load_external_backbone("torchvision:resnet18", path, data_channels=3)
    assert str(path) in str(err.value) and "conv1.weight" in str(err.value)
    loaded, info = load_external_backbone("torchvision:resnet18", path, data_channels=3, strip_prefixes=["teacher."])
    x = torch.randn(2, 3, 32, 32)
    reference = copy.deepcopy(net)
    reference.fc = nn.Identity()
    with torch.no_grad():
        assert torch.allclose(loaded(x), reference(x), atol=1e-5)
    assert info.loaded == 120 and info.dropped == ["teacher.backbone.fc.weight", "teacher.backbone.fc.bias"]


def test_mismatch_kinds_are_told_apart() -> None:
    net, dim, channels = build_external("torchvision", "resnet18")  # without its classifier
    assert (dim, channels) == (512, 3)
    state = dict(_resnet18().state_dict())
    state.pop("layer4.1.bn2.running_var")  # a backbone tensor missing
    state["layer4.2.conv1.weight"] = torch.zeros(1)  # under the network's own module, but not one of its tensors
    state["conv1.weight"] = torch.zeros(64, 3, 3, 3)  # another shape
    for key in [k for k in state if k.endswith("num_batches_tracked")]:
        del state[key]  # absent from files of older torch versions: harmless
    _, info, bad = match_state_dict(net, state)
    assert bad["missing"] == ["layer4.1.bn2.running_var"] and bad["unexpected"] == ["layer4.2.conv1.weight"]
    assert len(bad["shape"]) == 1 and bad["shape"][0].startswith("conv1.weight (64, 3, 3, 3)")
    assert info.dropped == ["fc.weight", "fc.bias"] and len(info.missing_buffers) == 20


# ---------------------------------------------------------------------------------------------- errors


def test_resnet50_weights_given_as_resnet18(tmp_path: Path) -> None:
    torch.manual_seed(0)
    path = tmp_path / "r50.pth"
    torch.save(torchvision.models.resnet50(weights=None).state_dict(), path)
    proc = run_launch_eval("--backbone", "torchvision:resnet18", "--weights", str(path), "--no-mlflow",
                           *EXTERNAL_FAST)
    line = assert_one_error_line(proc, str(path), "torchvision:resnet18", "layer1.0.conv3.weight",
                                 "--backbone torchvision:resnet50")
    assert "of another shape (layer1.0.conv1.weight (64, 64, 1, 1) in the file" in line
    assert not (tmp_path / "eval" / "r50" / "report.json").exists()


def test_small_cnn_weights_given_as_resnet18_name_the_small_cnn(tmp_path: Path) -> None:
    """A state dict of this package's small CNN (e.g. a quickstart backbone saved with torch.save): the error
    names the --backbone and the model settings that load it."""
    from hypersolid_scale.models import BackboneWithProjector, Projector, build_backbone

    cfg = load_config(None, ["model.in_channels=1", "model.small_cnn.width=8"])
    path = tmp_path / "small.pt"
    backbone, dim = build_backbone(cfg.model)  # evaluation's model of a Hypersolid run, its projector included
    torch.save(BackboneWithProjector(backbone, dim, Projector(dim, 64, 32, 2)).state_dict(), path)
    line = assert_one_error_line(run_launch_eval("--backbone", "native:resnet18", "--weights", str(path), "--no-mlflow",
                                                 *EXTERNAL_FAST), str(path))
    assert "--backbone native:small_cnn model.small_cnn.width=8 model.in_channels=1 (what the file looks like)" \
        in line, line


def test_random_bytes_weights(tmp_path: Path) -> None:
    path = tmp_path / "weights.pth"
    path.write_bytes(random.Random(0).randbytes(4096))
    line = assert_one_error_line(run_launch_eval("--backbone", "torchvision:resnet18", "--weights", str(path),
                                                 "--no-mlflow", *EXTERNAL_FAST), str(path))
    assert "not a PyTorch file" in line and "torch.save" in line
    assert "Traceback" in (tmp_path / "eval" / "weights" / "errors.log").read_text()


def test_bad_arguments_are_config_errors(tmp_path: Path) -> None:
    path = _save_layouts(_resnet18(), tmp_path)["plain"]
    bad: list[tuple[list[str], str]] = [
        (["--backbone", "torchvision:resnet18"], "needs --weights"),
        (["--checkpoint", str(path), "--weights", str(path)], "go with --backbone"),
        (["--backbone", "resnet18", "--weights", str(path)], "SOURCE:NAME"),
        (["--backbone", "torchvision:resnet81", "--weights", str(path)], "resnet18"),
        (["--backbone", "torchvision:resnet18", "--weights", str(path), "model.small_stem=true"], "not allowed"),
        (["--backbone", "native:resnet18", "--weights", str(path), "model.arch=resnet50"], "not allowed"),
        (["--backbone", "torchvision:resnet18", "--weights", str(path), "--features", "projector"], "projector"),
        (["--backbone", "torchvision:resnet18", "--weights", str(path), "--suite", "qualitative"], "qualitative"),
    ]
    for args, needle in bad:
        with pytest.raises(ConfigError, match=needle):
            main([*args, "--no-mlflow", "data.dataset=digits"])
    with pytest.raises(CheckpointError, match="does not exist"):
        main(["--backbone", "torchvision:resnet18", "--weights", str(tmp_path / "nope.pt"), "--no-mlflow"])


# ---------------------------------------------------------------------------------------------- MLflow


@pytest.mark.slow
def test_external_eval_logs_a_new_tagged_mlflow_run(tmp_path: Path) -> None:
    from mlflow import MlflowClient

    path = _save_layouts(_resnet18(), tmp_path)["plain"]
    assert main(["--backbone", "torchvision:resnet18", "--weights", str(path), *EXTERNAL_FAST]) == 0
    report = _report(path)
    uri = f"sqlite:///{tmp_path.resolve()}/mlflow.db"  # next to the weights, as for an untracked training
    assert report["meta"]["tracking_uri"] == uri
    run = MlflowClient(uri).get_run(report["meta"]["mlflow_run_id"])
    assert run.data.tags["eval.kind"] == "external" and run.data.tags["eval.backbone"] == "torchvision:resnet18"
    assert run.data.tags["eval.weights"] == str(path.resolve()) and run.info.status == "FINISHED"
    assert run.data.metrics["eval/knn_k5_majority"] == pytest.approx(report["metrics"]["knn_k5_majority"])
    artifacts = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id, "eval/plain")}
    assert "eval/plain/report.json" in artifacts
