"""Methods are one file each: the registry, a method added at run time, a copied method file that trains
through launch/train.py without any other change, and configs / checkpoints of the earlier `loss` layout."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hypersolid_scale.checkpoint import build_model_from_checkpoint
from hypersolid_scale.checkpoint.layout import split_method_state
from hypersolid_scale.config import combinations, former_keys
from hypersolid_scale.config import sections as config_sections
from hypersolid_scale.config.schema import from_dict, load_config, to_dict
from hypersolid_scale.methods import (
    Method,
    MethodModel,
    build_method,
    build_method_model,
    get_method,
    method_names,
    register,
)
from hypersolid_scale.methods.base import encode
from hypersolid_scale.methods.registry import unregister
from hypersolid_scale.models import ModelConfig, SmallCNNOptions, build_backbone
from hypersolid_scale.safety.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def test_every_method_module_registers_one_method_in_order():
    names = method_names()
    assert names[0] == "hypersolid" == load_config(None).method.name  # the default first
    assert list(names) == sorted(names, key=lambda n: (get_method(n).order, n))
    for name in names:
        cls = get_method(name)
        assert cls.name == name and issubclass(cls, Method)
        # one module per method, named after it
        assert cls.__module__ == f"hypersolid_scale.methods.{name}"
    # each displayed by a name of its own; SwAV's and DINO's state, and a momentum teacher, make them stateful
    assert len({get_method(n).display_name for n in names}) == len(names)
    assert get_method("swav").display_name == "SwAV" and get_method("barlowtwins").display_name == "Barlow Twins"
    assert {n for n in names if get_method(n).stateful} == {"swav", "dino", "byol"}
    modules = {p.stem for p in (REPO / "hypersolid_scale" / "methods").glob("[!_]*.py")}
    assert modules - set(names) == {"base", "config", "model", "params", "registry"}  # the package's helpers
    with pytest.raises(ConfigError, match=r"method.name='moco' is not a known method; choose one of: hypersolid"):
        get_method("moco")


def test_a_second_class_under_a_taken_name_is_refused():
    class Impostor(Method):
        name = "simclr"

    with pytest.raises(ConfigError, match="two methods are named 'simclr'"):
        register(Impostor)
    assert get_method("simclr").__name__ == "SimCLR"


@dataclass
class CenterConfig:
    out_dim: int = 8
    KINDS = {"out_dim": "pos_int"}


class Center(Method):
    """A throwaway method: pull both views' projections to their mean."""

    name, Config = "throwaway_center", CenterConfig

    def __init__(self, feature_dim: int, cfg: CenterConfig, steps_per_epoch: int = 1) -> None:
        super().__init__(steps_per_epoch)
        self.head = nn.Linear(feature_dim, cfg.out_dim)

    def forward(self, views, backbone):
        views, _ = self.select_views(views)
        z0, z1 = (self.head(f) for f in encode(backbone, views, separate=False))
        loss = (z0 - z1).pow(2).mean()
        return loss, {"loss": loss.detach()}


@pytest.fixture
def throwaway_method():
    register(Center)
    try:
        yield Center
    finally:
        unregister(Center.name)
    assert Center.name not in method_names()


def test_a_method_registered_at_run_time_builds_validates_and_trains_a_step(throwaway_method):
    assert throwaway_method.name in method_names()
    assert throwaway_method.display_name == throwaway_method.name  # none declared: its name
    torch.manual_seed(0)
    backbone, feature_dim = build_backbone(ModelConfig(arch="small_cnn", small_cnn=SmallCNNOptions(width=4), in_channels=1))
    cfg = SimpleNamespace(name="throwaway_center", throwaway_center=CenterConfig(out_dim=0))
    with pytest.raises(ConfigError, match=r"method.throwaway_center.out_dim=0 is not allowed; it must be a positive"):
        build_method(cfg, backbone, feature_dim, steps_per_epoch=1)
    cfg.throwaway_center = CenterConfig()
    model = MethodModel(backbone, feature_dim, build_method(cfg, backbone, feature_dim, steps_per_epoch=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v) and v.is_floating_point()}
    views = [torch.randn(4, 1, 12, 12) for _ in range(2)]
    loss, stats = model(views)
    loss.backward()
    model.method.before_optimizer_step()
    opt.step()
    model.method.after_step(0, 1, model.backbone)
    assert torch.isfinite(stats["loss"]) and model.method.step == 1
    moved = [k for k, v in model.state_dict().items() if k in before and not torch.equal(v, before[k])]
    assert any(k.startswith("method.head.") for k in moved) and any(k.startswith("backbone.") for k in moved)
    # It declares no projection head: there are no projector features to evaluate, said by its config check.
    assert model.projector is None
    run = load_config(None, ["eval.features=projector"])
    run.method.name = "throwaway_center"  # registered after the config schema was built: set on the loaded config
    with pytest.raises(ConfigError, match=r"eval.features='projector' reads the method's projection head, which "
                                          r"method.name=throwaway_center does not have; set eval.features=backbone"):
        combinations.check_features_have_a_head(run)
    run.eval.features = "backbone"
    combinations.check_features_have_a_head(run)


# In the copy's repository, one process (one torch import): the compare plan for `--methods hypersolid,simclr_copy`
# on the quickstart setting, printed as JSON, then `python launch/train.py ARGS...` as its own __main__.
_PLAN_THEN_TRAIN = """
import json, runpy, sys
from pathlib import Path
from hypersolid_scale.compare.plan import check_budget, parse_methods, plan
trainings = plan(Path("configs"), "quickstart", parse_methods("hypersolid,simclr_copy"), 1, 1, [])
budget = check_budget(trainings, steps=2, nproc=1, out_dir=Path(sys.argv[1]))
print(json.dumps([[t.method, str(t.config), list(t.overrides)] for t in trainings] + [budget.views]), flush=True)
sys.argv = sys.argv[2:]
runpy.run_path("launch/train.py", run_name="__main__")
"""


def test_a_copied_method_file_trains_and_is_compared_with_no_other_change(tmp_path):
    """Copy simclr.py under a new name and change nothing else: the config gains `method.simclr_copy.*`,
    launch/train.py trains it on the quickstart setting's config (it has no config file of its own), its
    checkpoint stores its own method section only, and the comparison plans it next to Hypersolid.

    In a copy of the package, launch/ and configs/ (imported first through PYTHONPATH): the repository's own
    package never holds the copy, so no other test running meanwhile discovers it."""
    repo = tmp_path / "repo"
    for part in ("hypersolid_scale", "launch", "configs"):
        shutil.copytree(REPO / part, repo / part, ignore=shutil.ignore_patterns("__pycache__"))
    src = repo / "hypersolid_scale" / "methods" / "simclr.py"
    text = src.read_text()
    assert '"simclr"' in text
    src.with_name("simclr_copy.py").write_text(text.replace('"simclr"', '"simclr_copy"'))
    assert not list((repo / "configs").rglob("simclr_copy*"))
    env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
    run_dir = tmp_path / "run"
    train = ["launch/train.py", "--config", "configs/quickstart.yaml", "method.name=simclr_copy",
             "method.simclr_copy.hidden_dim=32", "method.simclr_copy.out_dim=16", "data.dataset=digits",
             "data.num_local_views=0", "data.batch_size_per_gpu=32", "model.small_cnn.width=4", "max_steps=2",
             "dist.device=cpu", "eval.every_n_epochs=0", "tracking.enabled=false", "progress=false",
             f"run_dir={run_dir}"]
    proc = subprocess.run([sys.executable, "-c", _PLAN_THEN_TRAIN, str(tmp_path / "compare"), *train], cwd=repo,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ckpt = torch.load(sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1], map_location="cpu", weights_only=True)
    assert ckpt["config"]["method"]["name"] == "simclr_copy" and ckpt["step"] == 2
    assert set(ckpt["config"]["method"]) == {"name", "simclr_copy"}  # the chosen method's section only
    assert any(k.startswith("head.") for k in ckpt["method"]) and all(k.startswith("backbone.") for k in ckpt["model"])

    *trainings, views = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("[[")))
    assert trainings == [["hypersolid", "configs/quickstart.yaml", []],
                         ["simclr_copy", "configs/quickstart.yaml", ["method.name=simclr_copy",
                                                                     "data.num_local_views=0"]]]
    assert views == {"hypersolid": 6, "simclr_copy": 2}  # a two-view method gets the two global views
    assert "simclr_copy" not in method_names()  # this process never imported the copy


def test_a_stored_config_with_a_method_no_longer_installed_reads_with_one_note(capfd, monkeypatch):
    """A checkpoint stores its own method's section; one written when every method's section was stored reads
    without the sections of methods removed since (one note), and evaluates its backbone."""
    monkeypatch.setattr(config_sections, "_said", set())  # said once per process
    monkeypatch.delenv("RANK", raising=False)
    cfg = load_config(None, ["method.name=simclr", "model.small_cnn.width=4", "model.in_channels=1"])
    stored = to_dict(cfg, stored=True)
    assert set(stored["method"]) == {"name", "simclr"}
    assert stored["method"]["simclr"] == to_dict(cfg)["method"]["simclr"]
    assert to_dict(from_dict(stored)) == to_dict(cfg)
    old = to_dict(cfg)  # an earlier version's: every method's section, one of a method removed since
    old["method"]["simclr_copy"] = dict(old["method"]["simclr"])
    assert to_dict(from_dict(old)) == to_dict(cfg)
    torch.manual_seed(0)
    weights, heads = split_method_state(build_method_model(cfg.model, cfg.method).state_dict())
    model, got = build_model_from_checkpoint({"model": weights, "method": heads, "config": old, "step": 2,
                                              "path": "old.pt"})
    assert got.method.name == "simclr" and heads is not None
    assert all(torch.equal(v, weights[f"backbone.{k}"]) for k, v in model.backbone.state_dict().items())
    assert all(torch.equal(v, heads[f"head.{k}"]) for k, v in model.projector.state_dict().items())
    notes = [line for line in capfd.readouterr().err.splitlines() if "not installed" in line]
    assert notes == [("note: a stored config has sections of methods not installed here (method.simclr_copy); "
                      "they are left out")]
    old["method"]["simclr_copy"] = 3  # not a section: a bad key stays an error
    with pytest.raises(ConfigError, match="simclr_copy"):
        from_dict(old)


# ----------------------------------------------------------------------------------------------------------
# The earlier `loss` section
# ----------------------------------------------------------------------------------------------------------


def test_the_loss_section_moves_to_method():
    old = {"loss": {"name": "swav", "alpha": 0.5, "swav": {"temperature": 0.2}}, "seed": 3}
    new = former_keys.rename_former_keys(old, "here", note=False)
    assert new == {"seed": 3, "method": {"name": "swav", "hypersolid": {"alpha": 0.5}, "swav": {"temperature": 0.2}}}
    assert former_keys.rename_former_keys({"method": {"name": "byol"}}, "here") == {"method": {"name": "byol"}}


def test_an_old_config_file_and_old_overrides_load_as_the_new_ones_with_one_note(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(former_keys, "_noted", set())  # said once per process: maybe already, by another test
    monkeypatch.delenv("RANK", raising=False)
    old = tmp_path / "old.yaml"
    old.write_text("loss:\n  alpha: 0.5\n  backend: tiled\n  tile_size: 64\nseed: 1\n")
    new = tmp_path / "new.yaml"
    new.write_text("method:\n  hypersolid:\n    alpha: 0.5\n    backend: tiled\n    tile_size: 64\nseed: 1\n")
    assert to_dict(load_config(old)) == to_dict(load_config(new))
    assert to_dict(load_config(None, ["loss.name=dino", "loss.dino.teacher_temp=0.05"])) == \
        to_dict(load_config(None, ["method.name=dino", "method.dino.teacher_temp=0.05"]))
    notes = [line for line in capfd.readouterr().err.splitlines() if "'loss' is now 'method'" in line]
    # One line per layer naming where the old layout was found, and each former key said once per process.
    assert len(notes) == 3 and str(old) in notes[0] and "'loss.*'" in notes[0], notes
    assert "'loss.name'" in notes[1] and "'loss.dino.*'" in notes[2], notes
    with pytest.raises(ConfigError, match="unknown config key 'method.hypersolid.alphaa'"):
        load_config(None, ["loss.alphaa=0.5"])


def test_a_stored_config_of_the_earlier_layout_reads_as_moved():
    cfg = load_config(None, ["method.hypersolid.alpha=0.7", "method.name=hypersolid"])
    stored = to_dict(cfg)
    stored["loss"] = stored.pop("method")["hypersolid"]  # how an earlier version stored it
    assert to_dict(from_dict(stored)) == to_dict(cfg)


def test_the_old_projector_layout_of_a_checkpoint_is_read_as_the_method_s(capfd, monkeypatch):
    import importlib

    layout = importlib.import_module("hypersolid_scale.checkpoint.layout")
    migrate_layout = layout.migrate_layout
    monkeypatch.setattr(layout, "_said_layout", False)  # said once per process: maybe already, by another test

    proj = torch.ones(2)
    ckpt = {"model": {"backbone.w": torch.zeros(1), "projector.net.0.weight": proj}, "step": 7, "path": "x.pt"}
    out = migrate_layout(ckpt)
    assert set(out["model"]) == {"backbone.w"} and out["method"]["projector.net.0.weight"] is proj
    assert out["method"]["_extra_state"] == {"step": 7}
    assert migrate_layout(out) is out  # the present layout is left alone
    assert re.search(r"x\.pt: written by an earlier version", capfd.readouterr().err)
