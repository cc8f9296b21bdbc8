"""python -m hypersolid_scale.export: a checkpoint's encoder in torchvision / timm form, and its errors.

Per architecture, a checkpoint written by the package's own writer from a freshly built model (BatchNorm
statistics made non-trivial) is exported; the file loads strict into the library's own constructor and gives
the checkpoint backbone's features bit for bit. One tiny run is trained end to end and evaluated as a
checkpoint and as the exported directory. The README's two examples run against an export made here.
"""

from __future__ import annotations

import json
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torchvision
from safetensors.torch import load_file
from torch import nn

from hypersolid_scale.checkpoint import build_model_from_checkpoint, load_checkpoint, save_checkpoint
from hypersolid_scale.checkpoint.layout import split_method_state
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import load_config, to_dict
from hypersolid_scale.export import export_checkpoint, load_backbone, load_projector_state, read_export
from hypersolid_scale.export.cli import cli
from hypersolid_scale.methods import build_method_model
from hypersolid_scale.models import build_backbone
from hypersolid_scale.safety.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
PROJ = ["method.hypersolid.num_layers=2", "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=16"]
RGB32 = ["data.format=webdataset", "data.dataset=cifar10", "data.path=data/cifar10", "model.in_channels=3"]
ARCHS = {
    "resnet18-small": ["model.arch=resnet18", "model.small_stem=true"],
    "resnet18-standard": ["model.arch=resnet18", "model.small_stem=false"],
    "resnet50-small": ["model.arch=resnet50", "model.small_stem=true"],
    "resnet50-standard": ["model.arch=resnet50", "model.small_stem=false"],
    "vit_tiny": ["model.arch=vit_tiny", "model.vit_tiny.img_size=32", "model.vit_tiny.patch_size=16"],
}


def make_checkpoint(run_dir: Path, overrides: list[str], *, step: int = 5) -> Path:
    """A checkpoint in the trainer's layout (backbone in ``model``, projector in ``method``), random weights."""
    cfg = load_config(None, [*RGB32, *PROJ, *overrides, f"run_dir={run_dir}"])
    torch.manual_seed(0)
    trained = build_method_model(cfg.model, cfg.method)
    for m in trained.modules():  # statistics a buffer left at its default would not reproduce
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    model, method = split_method_state(trained.state_dict())
    state = {
        "model": model,
        "method": {**(method or {}), "_extra_state": {"step": step}},
        "step": step,
        "epoch": 0,
        "config": to_dict(cfg),
        "config_fingerprint": fingerprint(cfg),
        "mlflow_run_id": None,
        "tracking_uri": None,
    }
    return save_checkpoint(run_dir, state)


def library_module(arch: str, meta: dict[str, Any]) -> nn.Module:
    """The library's own constructor, as a user without this package would call it."""
    if arch.startswith("resnet"):
        net = getattr(torchvision.models, arch)(num_classes=10)
        net.fc = nn.Identity()
        if meta["stem"] == "small":
            net.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
            net.maxpool = nn.Identity()
        return net
    import timm

    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32)


@pytest.fixture(scope="module", params=list(ARCHS))
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    ckpt = make_checkpoint(root / "run", ARCHS[request.param])
    export_checkpoint(ckpt, root / "export")
    return request.param, ckpt, root / "export"


def test_exported_backbone_loads_strict_into_the_library_and_gives_the_same_features(
    exported: tuple[str, Path, Path],
) -> None:
    name, ckpt, out = exported
    arch = name.split("-")[0]
    meta = json.loads((out / "export.json").read_text())
    net = library_module(arch, meta)
    state = load_file(str(out / "backbone.safetensors"))
    assert not any(k.startswith(("fc.", "head.", "backbone.", "vit.")) for k in state)
    net.load_state_dict(state, strict=True)
    model, cfg = build_model_from_checkpoint(ckpt)
    size = 32 if arch == "vit_tiny" else 16  # the ViT's img_size; the ResNets take any size
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model.backbone(x)
        assert torch.equal(net.eval()(x), expected)
        loaded = load_backbone(out)
        assert torch.equal(loaded(x), expected) and not loaded.training
    assert all(p.requires_grad and not p.is_meta for p in loaded.parameters())  # trainable further
    pt = torch.load(out / "backbone.pt", weights_only=True)
    assert pt.keys() == state.keys() and all(torch.equal(pt[k], state[k]) for k in state)
    assert meta["arch"] == arch and meta["in_channels"] == 3 and meta["feature_dim"] == expected.shape[1]
    assert meta["library"] == ("timm" if arch == "vit_tiny" else "torchvision")
    assert meta.get("stem") == {"small": "small", "standard": "standard"}.get(name.partition("-")[2])
    assert meta["method"] == "hypersolid" and meta["step"] == 5 and meta["config_fingerprint"] == fingerprint(cfg)
    pre = meta["preprocessing"]
    assert pre["input_size"] == 32 and len(pre["mean"]) == len(pre["std"]) == 3 and pre["mean"][0] != 0
    projector = load_projector_state(out)
    trained = load_checkpoint(ckpt)["method"]
    assert projector.keys() == {k.removeprefix("projector.") for k in trained if k.startswith("projector.")}
    assert meta["projector"] == {
        "module": "method.projector",
        "tensors": len(projector),
        "settings": to_dict(cfg)["method"]["hypersolid"],  # the method's section: its projector's shape too
    }
    assert [meta["projector"]["settings"][k] for k in ("num_layers", "hidden_dim", "out_dim")] == [2, 32, 16]


def test_small_cnn_is_exported_as_its_own_module_with_a_note(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ckpt = make_checkpoint(tmp_path / "run", ["model.arch=small_cnn", "model.small_cnn.width=8"])
    assert cli(["--checkpoint", str(ckpt), "--out", str(tmp_path / "deep" / "er" / "out")]) == 0  # parents made
    printed = capsys.readouterr().out
    assert "note: small_cnn is this package's own CNN with no torchvision or timm counterpart" in printed
    meta = read_export(tmp_path / "deep" / "er" / "out")
    assert meta["library"] is None and "no torchvision or timm counterpart" in meta["library_note"]
    net = load_backbone(tmp_path / "deep" / "er" / "out")
    model, _ = build_model_from_checkpoint(ckpt)
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        assert type(net).__name__ == "SmallCNN" and torch.equal(net(x), model.backbone(x))


def test_a_baselines_head_is_its_projector(tmp_path: Path) -> None:
    from hypersolid_scale.methods.registry import build_method

    cfg = load_config(None, [*RGB32, "model.arch=small_cnn", "model.small_cnn.width=4", "method.name=simclr"])
    backbone, dim = build_backbone(cfg.model)
    method = build_method(cfg.method, backbone, dim, steps_per_epoch=1)
    trained = nn.ModuleDict({"backbone": backbone, "method": method})
    model, heads = split_method_state(trained.state_dict())
    state = {"model": model, "method": heads, "step": 3, "epoch": 0, "config": to_dict(cfg)}
    ckpt = save_checkpoint(tmp_path / "run", {**state, "config_fingerprint": fingerprint(cfg)})
    meta = export_checkpoint(ckpt, tmp_path / "out")
    assert meta["method"] == "simclr" and meta["projector"]["module"] == "method.head"
    head = load_projector_state(tmp_path / "out")
    assert head and head.keys() == {k.removeprefix("head.") for k in heads if k.startswith("head.")}
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(load_backbone(tmp_path / "out")(x), backbone.eval()(x))


# ---------------------------------------------------------------------------------------------- errors


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert cli(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def test_bad_checkpoints_are_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = make_checkpoint(tmp_path / "run", ["model.arch=small_cnn", "model.small_cnn.width=4"])
    foreign = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, foreign)
    noise = tmp_path / "noise.pt"
    noise.write_bytes(bytes(range(256)) * 10)
    cut = tmp_path / "cut.pt"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    out = str(tmp_path / "out")
    cases = {
        foreign: "is not a Hypersolid checkpoint",
        noise: "not a PyTorch checkpoint at all",
        cut: "cut short",
        tmp_path / "absent.pt": "does not exist",
        tmp_path: "is a directory",
    }
    for path, needle in cases.items():
        line = _error_line(capsys, ["--checkpoint", str(path), "--out", out])
        assert needle in line and str(path) in line, line
    assert not (tmp_path / "out").exists()  # nothing written for a bad input
    (tmp_path / "file").write_text("x")
    assert "is a file" in _error_line(capsys, ["--checkpoint", str(good), "--out", str(tmp_path / "file")])


def test_weights_of_another_arch_than_the_config_says(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "run", ["model.arch=small_cnn", "model.small_cnn.width=4"])
    state = load_checkpoint(ckpt)
    state["config"]["model"]["small_cnn"]["width"] = 8  # the config no longer describes the weights
    save_checkpoint(tmp_path / "run", {**state, "step": 9})
    with pytest.raises(CheckpointError, match=r"do not fit model.arch=small_cnn .*size mismatch"):
        export_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000009.pt", tmp_path / "out")


def test_load_backbone_refuses_what_is_not_an_intact_export(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "run", ["model.arch=small_cnn", "model.small_cnn.width=4"])
    out = tmp_path / "out"
    export_checkpoint(ckpt, out)
    with pytest.raises(CheckpointError, match="holds no export.json"):
        load_backbone(tmp_path / "run")
    with pytest.raises(CheckpointError, match="is not a directory"):
        load_backbone(out / "backbone.safetensors")
    data = (out / "backbone.safetensors").read_bytes()
    (out / "backbone.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="damaged or not a safetensors file"):
        load_backbone(out)
    meta = read_export(out)
    meta["files"].pop("projector")
    (out / "export.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="has no projector"):
        load_projector_state(out)
    (out / "export.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="cannot be read"):
        read_export(out)


# ---------------------------------------------------------------------------------------------- end to end


def _run_script(path: str, argv: list[str], *, module: bool = False) -> int:
    """``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` in this process; its exit status."""
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        (runpy.run_module if module else runpy.run_path)(path, run_name="__main__")
    except SystemExit as end:
        return int(end.code or 0)
    finally:
        sys.argv = saved
    return 0


def test_a_trained_run_exported_evaluates_like_its_checkpoint(tmp_path: Path) -> None:
    from hypersolid_scale.checkpoint import list_checkpoints
    from hypersolid_scale.eval.app import cli as eval_cli
    from hypersolid_scale.tracking.metadata import git_commit
    from hypersolid_scale.training.trainer import main as train

    run = tmp_path / "run"
    tiny = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=8", *PROJ]
    assert (
        train(
            [
                *tiny,
                f"run_dir={run}",
                "data.max_pretrain_samples=128",
                "max_steps=4",
                "data.num_local_views=2",
                "data.batch_size_per_gpu=32",
                "data.num_workers=0",
                "progress=false",
                "eval.every_n_epochs=0",
                "dist.device=cpu",
                "tracking.enabled=false",
            ]
        )
        == 0
    )
    ckpt = list_checkpoints(run)[-1]
    out = tmp_path / "export"
    assert _run_script(str(ROOT / "launch" / "export.py"), ["--checkpoint", str(ckpt), "--out", str(out)]) == 0
    meta = read_export(out)
    assert meta["step"] == 4 and meta["source_commit"] == git_commit() and meta["arch"] == "small_cnn"
    fast = [
        "--suite",
        "knn",
        "--no-mlflow",
        "eval.knn_k=[5]",
        "eval.max_train_samples=300",
        "eval.max_test_samples=120",
        "eval.num_workers=0",
    ]
    assert eval_cli(["--checkpoint", str(ckpt), "--output-dir", str(tmp_path / "e1"), *fast]) == 0
    args = [a.replace("<out>", str(out)) for a in meta["eval"]]  # the command export.json suggests
    assert eval_cli([*args, "--output-dir", str(tmp_path / "e2"), "data.dataset=digits", *fast]) == 0
    reports = [json.loads((tmp_path / e / "report.json").read_text())["metrics"] for e in ("e1", "e2")]
    assert reports[0] == reports[1] and set(reports[0]) == {"knn_k5_majority", "knn_k5_weighted"}
    # python -m hypersolid_scale.export writes the same files again
    assert _run_script("hypersolid_scale.export", ["--checkpoint", str(ckpt), "--out", str(out)], module=True) == 0
    assert read_export(out)["config_fingerprint"] == meta["config_fingerprint"]


# ---------------------------------------------------------------------------------------------- README


def readme_block(marker: str) -> str:
    """The first fenced code block after ``<!-- readme-example: MARKER -->`` in README.md."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- readme-example: {marker} -->.*?```\w*\n(.*?)```", text, re.S)
    assert found, f"README.md has no code block after the marker readme-example: {marker}"
    return found.group(1)


def test_readme_encoder_example_runs_on_an_export(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "runs" / "stl10", ARCHS["resnet18-standard"])
    command = readme_block("export-command").strip()
    launcher = "python -m hypersolid_scale.export "
    assert command.startswith(launcher) and "\n" not in command
    # the shell expands the arguments in a directory laid out as the README's; the module runs in this process
    shell = ["bash", "-c", f'set -- {command.removeprefix(launcher)}; printf "%s\\n" "$@"']
    argv = subprocess.run(shell, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
    assert argv == ["--checkpoint", str(ckpt.relative_to(tmp_path)), "--out", "runs/stl10/export"]
    assert cli([str(tmp_path / a) if a.startswith("runs/") else a for a in argv]) == 0
    code = readme_block("load-encoder").replace("runs/stl10/export", str(tmp_path / "runs" / "stl10" / "export"))
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md:load-encoder", "exec"), scope)
    x = torch.randn(2, 3, 32, 32)
    model, _ = build_model_from_checkpoint(ckpt)
    with torch.no_grad():
        assert torch.equal(scope["encoder"].eval()(x), model.backbone(x))


def test_readme_loss_example_trains(tmp_path: Path) -> None:
    code = readme_block("loss-loop")
    assert len(code.strip().splitlines()) <= 15 and "HypersolidLoss" in code
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md:loss-loop", "exec"), scope)
    assert torch.isfinite(scope["loss"]) and scope["net"][0].weight.grad.abs().sum() > 0


def test_the_loss_imports_no_tracking_slurm_or_data_code() -> None:
    code = (
        "import sys, importlib.metadata as md\n"
        "from hypersolid_scale.losses import HypersolidLoss\n"
        "import hypersolid_scale\n"
        "print(hypersolid_scale.__version__, md.version('hypersolid-scale'))\n"
        "print(*sorted(sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    version_line, modules_line = proc.stdout.splitlines()[:2]
    version, installed = version_line.split()
    assert version == installed
    mods = modules_line.split()
    assert "hypersolid_scale.losses.hypersolid" in mods  # the listing is real
    forbidden = (
        "hypersolid_scale.tracking",
        "hypersolid_scale.data",
        "hypersolid_scale.config.sweep",
        "hypersolid_scale.training",
        "launch",
        "mlflow",
        "webdataset",
        "ffcv",
        "deepspeed",
    )
    bad = [m for m in mods if m.split(".")[0] in forbidden or m.startswith(forbidden)]
    assert not bad, f"importing HypersolidLoss pulled in {bad}"
