"""Config tree: YAML + overrides, and bad input failing early with a message naming key and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hypersolid_scale.config import former_keys
from hypersolid_scale.config import sections as config_sections
from hypersolid_scale.config.fingerprint import config_diff, fingerprint
from hypersolid_scale.config.schema import Config, from_dict, load_config, save_config, to_dict
from hypersolid_scale.config.sweep import load_sweep
from hypersolid_scale.data.formats.ffcv import FFCVOptions
from hypersolid_scale.data.formats.webdataset import WebDatasetOptions
from hypersolid_scale.safety.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
SWEEPS = sorted((REPO / "configs" / "sweeps").glob("*.yaml"))


def test_defaults_are_the_paper_hyperparameters() -> None:
    cfg = load_config(None, [])
    assert isinstance(cfg, Config)
    assert (cfg.optim.name, cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.schedule) == ("adamw", 1e-3, 1e-6, "constant")
    assert (cfg.method.hypersolid.alpha, cfg.method.hypersolid.norm_weight, cfg.method.hypersolid.out_dim) == (0.9, 1e-6, 1024)


def test_yaml_then_overrides(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.5\n  name: sgd\nseed: 7\n")
    cfg = load_config(f, ["optim.lr=0.25", "data.batch_size_per_gpu=32", "dist.bf16=True"])
    assert (cfg.optim.lr, cfg.optim.name, cfg.seed, cfg.data.batch_size_per_gpu) == (0.25, "sgd", 7, 32)
    assert cfg.dist.precision == "bf16"  # dist.bf16, its former spelling, as a YAML boolean


def test_loads_leave_the_shared_defaults_tree_as_built(tmp_path: Path) -> None:
    """load_config and from_dict merge into a copy of the defaults tree built once per process (schema._schema):
    loads with a file, overrides (a batch override replaces the file's other batch key), a failing override
    and a stored dict leave that tree equal to a new one."""
    from omegaconf import OmegaConf

    from hypersolid_scale.config.schema import _schema

    f = tmp_path / "c.yaml"
    f.write_text("data:\n  global_batch_size: 64\noptim:\n  lr: 0.5\n")
    cfg = load_config(f, ["data.batch_size_per_gpu=8", "method.name=simclr", "model.arch=resnet18"])
    with pytest.raises(ConfigError):
        load_config(f, ["optim.lr=fast"])
    from_dict(to_dict(cfg))
    assert OmegaConf.to_container(_schema()) == OmegaConf.to_container(OmegaConf.structured(Config))
    assert load_config(None, []) == Config()


def test_to_dict_answers_like_a_fresh_conversion_after_edits_of_the_config_and_of_its_answer() -> None:
    """to_dict keeps its answers by the config's repr: an edited config (an int in a float field, which
    OmegaConf converts) and an edited answer never change what a later call returns."""
    from omegaconf import OmegaConf

    def fresh(cfg: Config) -> dict:
        return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)

    cfg = load_config(Path("configs/quickstart.yaml").resolve(), [])
    first = to_dict(cfg)
    assert first == fresh(cfg)
    first["optim"]["lr"] = -1.0
    first["data"].clear()
    assert to_dict(cfg) == fresh(cfg) and to_dict(cfg)["optim"]["lr"] == cfg.optim.lr
    cfg.optim.lr = 2
    cfg.seed = 123
    assert to_dict(cfg) == fresh(cfg) and repr(to_dict(cfg)["optim"]["lr"]) == "2.0"
    stored = to_dict(cfg, stored=True)
    assert stored["method"] == {"name": cfg.method.name, cfg.method.name: fresh(cfg)["method"][cfg.method.name]}


@pytest.mark.parametrize("layers, expected", [
    ({}, "auto"), ({"bf16": "true"}, "bf16"), ({"bf16": False}, "fp32"), ({"bf16": "auto"}, "auto"),
    ({"precision": "fp64"}, "fp64"), ({"precision": "FP64"}, "fp64"), ({"precision": "fp32", "bf16": "false"}, "fp32"),
    ({"precision": "fp64", "override": "dist.bf16=true"}, "bf16"),  # a later layer wins, in either spelling
    ({"bf16": True, "override": "dist.precision=fp64"}, "fp64"),
])
def test_precision_and_its_former_spelling_bf16(tmp_path: Path, layers: dict, expected: str) -> None:
    f = tmp_path / "c.yaml"
    dist = {k: v for k, v in layers.items() if k != "override"}
    f.write_text(yaml.safe_dump({"dist": dist}) if dist else "seed: 0\n")
    cfg = load_config(f, [layers["override"]] if "override" in layers else [])
    assert cfg.dist.precision == expected
    assert "bf16" not in to_dict(cfg)["dist"]  # config.yaml holds one spelling
    # A stored config of an earlier version, with dist.bf16: read as dist.precision.
    old = to_dict(cfg)
    old["dist"] = {**{k: v for k, v in old["dist"].items() if k != "precision"}, "bf16": "false"}
    assert from_dict(old).dist.precision == "fp32"


def test_former_key_names_are_read_under_their_new_names(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """data.max_train_samples -> data.max_pretrain_samples, data.decode -> data.views_on: in a file, an
    override and a stored config (an older checkpoint resumes: no difference in what it trains)."""
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  max_train_samples: 64\n  format: imagefolder\n  path: /x\n")
    cfg = load_config(f, ["data.decode=device"])
    assert (cfg.data.max_pretrain_samples, cfg.data.views_on) == (64, "device")
    err = capsys.readouterr().err
    assert "'data.max_train_samples' (in " in err and "'data.views_on'" in err
    assert "max_train_samples" not in to_dict(cfg)["data"] and "decode" not in to_dict(cfg)["data"]
    assert load_config(f, ["data.max_pretrain_samples=8"]).data.max_pretrain_samples == 8  # a later layer wins
    old = to_dict(cfg)
    old["data"] = {**{k: v for k, v in old["data"].items() if k not in ("max_pretrain_samples", "views_on")},
                   "max_train_samples": 64, "decode": "device"}
    assert to_dict(from_dict(old)) == to_dict(cfg)
    assert fingerprint(old) != fingerprint(cfg) and config_diff(old, to_dict(cfg)) == []
    f.write_text("data:\n  max_train_samples: 64\n  max_pretrain_samples: 32\n")
    with pytest.raises(ConfigError, match=r"'data.max_train_samples' = 64 and 'data.max_pretrain_samples' = 32"):
        load_config(f)


def test_former_flat_format_keys_are_read_in_their_format_s_section(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """data.shuffle_buffer -> data.webdataset.shuffle_buffer, data.ffcv_order -> data.ffcv.order, ...: in a file,
    an override and a stored config (an older checkpoint resumes: no difference in what it trains)."""
    monkeypatch.setattr(former_keys, "_noted", set())
    f = tmp_path / "c.yaml"
    f.write_text("data:\n  format: webdataset\n  path: /x\n  shuffle_buffer: 64\n  verify_shards: true\n"
                 "  manifest: /m.json\n  max_lost_fraction: 0.5\n  ffcv_os_cache: true\n")
    cfg = load_config(f, ["data.ffcv_order=random", "data.ffcv_batches_ahead=5"])
    assert cfg.data.webdataset == WebDatasetOptions(shuffle_buffer=64, manifest="/m.json", verify_shards=True,
                                                    max_lost_fraction=0.5)
    assert cfg.data.ffcv == FFCVOptions(order="random", os_cache=True, batches_ahead=5)
    err = capsys.readouterr().err
    assert ("note: config keys 'data.shuffle_buffer', 'data.manifest', 'data.verify_shards', 'data.max_lost_fraction' "
            f"(in {f}) are read as 'data.webdataset.shuffle_buffer', ") in err
    assert "'data.ffcv_order' (the override 'data.ffcv_order=random') is read as 'data.ffcv.order'" in err
    assert not {"shuffle_buffer", "ffcv_order"} & set(to_dict(cfg)["data"])
    assert load_config(f, ["data.webdataset.shuffle_buffer=8"]).data.webdataset.shuffle_buffer == 8  # later wins
    # A checkpoint's config stored before the sections: the flat keys, every format's.
    old = to_dict(cfg, stored=True)
    assert "webdataset" in old["data"] and "ffcv" not in old["data"]  # only the chosen format's section is stored
    data = {k: v for k, v in old["data"].items() if k != "webdataset"}
    old["data"] = {**data, **{k: v for k, v in to_dict(cfg)["data"]["webdataset"].items()},
                   **{f"ffcv_{k}": v for k, v in to_dict(cfg)["data"]["ffcv"].items()}}
    assert to_dict(from_dict(old)) == to_dict(cfg)
    assert fingerprint(old) != fingerprint(cfg) and config_diff(old, to_dict(cfg)) == []
    assert config_diff(old, to_dict(load_config(f, ["data.webdataset.shuffle_buffer=8"]))) == [
        "data.webdataset.shuffle_buffer: 64 -> 8"]
    f.write_text("data:\n  ffcv_order: random\n  ffcv:\n    order: sequential\n")
    with pytest.raises(ConfigError, match=r"'data.ffcv_order' = 'random' and 'data.ffcv.order' = 'sequential'"):
        load_config(f)


def test_a_format_s_section_enters_the_fingerprint_only_when_chosen(capfd: pytest.CaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base = load_config(None, [])  # builtin: no format section is read
    assert fingerprint(load_config(None, ["data.webdataset.shuffle_buffer=5", "data.ffcv.order=random"])) == \
        fingerprint(base)
    shards = ["data.format=webdataset", "data.path=/d"]
    wds = load_config(None, shards)
    assert fingerprint(load_config(None, [*shards, "data.ffcv.order=random"])) == fingerprint(wds)
    other = load_config(None, [*shards, "data.webdataset.shuffle_buffer=5"])
    assert config_diff(to_dict(wds), to_dict(other)) == ["data.webdataset.shuffle_buffer: 2000 -> 5"]
    ffcv = ["data.format=ffcv", "data.path=/d"]
    assert config_diff(to_dict(load_config(None, ffcv)), to_dict(load_config(None, [*ffcv, "data.ffcv.order=random"]))) \
        == ["data.ffcv.order: 'quasi_random' -> 'random'"]
    # A stored section of a format not installed here is left out, said once; what it trains is the same.
    monkeypatch.setattr(config_sections, "_said", set())  # said once per process
    old = to_dict(wds, stored=True)
    old["data"]["parquet"] = {"row_groups": 4}
    assert to_dict(from_dict(old)) == to_dict(wds) and config_diff(old, to_dict(wds)) == []
    notes = [line for line in capfd.readouterr().err.splitlines() if "not installed" in line]
    assert notes == ["note: a stored config has sections of formats not installed here (data.parquet); they are left out"]
    old["data"]["parquet"] = 3  # not a section: a bad key stays an error
    with pytest.raises(ValueError, match="parquet"):
        from_dict(old)


def test_precision_contradicted_in_one_layer_or_unknown_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("dist:\n  precision: fp64\n  bf16: true\n")
    with pytest.raises(ConfigError, match=r"'dist.bf16' = true .*'dist.precision' = 'fp64'.*disagree"):
        load_config(f)
    with pytest.raises(ConfigError, match=r"dist.bf16.*auto \| true \| false"):
        load_config(None, ["dist.bf16=fp16"])
    with pytest.raises(ConfigError, match=r"dist.precision.*auto \| bf16 \| fp32 \| fp64"):
        load_config(None, ["dist.precision=fp16"])
    with pytest.raises(ConfigError, match=r"fp64 runs under dist.engine=ddp"):
        load_config(None, ["dist.precision=fp64", "dist.engine=deepspeed"])


def test_precision_enters_the_fingerprint_and_the_former_spelling_resumes() -> None:
    base = load_config(None, [])
    assert fingerprint(load_config(None, ["dist.precision=fp64"])) != fingerprint(base)
    assert fingerprint(load_config(None, ["dist.bf16=auto"])) == fingerprint(base)
    old = to_dict(base)  # as an earlier version stored it
    old["dist"] = {**{k: v for k, v in old["dist"].items() if k != "precision"}, "bf16": "auto"}
    assert config_diff(old, to_dict(base)) == []
    assert config_diff(old, to_dict(load_config(None, ["dist.precision=fp32"]))) == [
        "dist.precision: 'auto' -> 'fp32'"]


@pytest.mark.parametrize("yaml_value, expected", [
    (None, "auto"), ("true", "true"), ("false", "false"), ("auto", "auto"), ("yes", "true"), ("False", "false"),
])
def test_sync_bn_is_auto_by_default_and_accepts_the_former_booleans(tmp_path: Path, yaml_value: str | None,
                                                                   expected: str) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("seed: 0\n" if yaml_value is None else f"dist:\n  sync_bn: {yaml_value}\n")
    assert load_config(f, []).dist.sync_bn == expected
    if yaml_value is not None:
        assert load_config(None, [f"dist.sync_bn={yaml_value}"]).dist.sync_bn == expected
    # A checkpoint written while sync_bn was a boolean still reads back.
    d = to_dict(load_config(None, []))
    d["dist"]["sync_bn"] = expected == "true"
    assert from_dict(d).dist.sync_bn == ("true" if expected == "true" else "false")


@pytest.mark.parametrize("override, must_mention", [
    (["optim.lrr=1"], ["optim.lrr", "lr", "weight_decay"]),  # unknown key: lists the allowed keys
    (["nonsense=1"], ["nonsense", "optim", "run_dir"]),
    (["optim.lr=fast"], ["optim.lr", "float"]),  # wrong type
    (["epochs=1.5"], ["epochs"]),
    (["optim.name=lamb"], ["optim.name", "adamw", "sgd", "lars"]),  # bad value: lists the choices
    (["optim.schedule=step"], ["optim.schedule", "constant", "cosine"]),
    (["dist.engine=fsdp"], ["dist.engine", "ddp", "deepspeed"]),
    (["dist.zero_stage=3"], ["dist.zero_stage", "0 | 1 | 2"]),
    (["dist.engine=ddp", "dist.zero_stage=2"], ["zero_stage", "deepspeed"]),
    (["checkpoint.resume=maybe"], ["checkpoint.resume", "auto", "never", "force"]),
    (["dist.sync_bn=sometimes"], ["dist.sync_bn", "auto | true | false"]),
    (["dist.sync_bn=1"], ["dist.sync_bn", "auto | true | false"]),
    (["optim.lr=-1"], ["optim.lr", "positive"]),
    (["method.hypersolid.pooling=avg"], ["method.hypersolid.pooling", "max", "mean"]),
    (["model.arch=vgg"], ["model.arch", "resnet18"]),
    (["data.dataset=cifar"], ["data.dataset", "fashion_mnist"]),
    (["optim.lr"], ["optim.lr", "section.key=value"]),  # malformed override
    (["optim.betas=[0.9"], ["'optim.betas=[0.9'", "not valid YAML", "optim.betas=[a,b]"]),  # unparsable value
    (["optim.name=${x"], ["'optim.name=${x'", "interpolation", "quote"]),
    (["optim.lr=1e-3", "optim.min_lr=1e-2"], ["optim.min_lr", "above optim.lr"]),
    (["optim.lr_scaling=quadratic"], ["optim.lr_scaling", "none | linear | sqrt"]),
    (["optim.reference_batch_size=0"], ["optim.reference_batch_size", "an int >= 1"]),
    (["optim.reference_batch_size=many"], ["optim.reference_batch_size", "int"]),
    (["optim.lr_scaling=sqrt"], ["optim.lr_scaling", "optim.reference_batch_size"]),  # scaling from what?
    (["optim.lars_trust_coefficient=-0.1"], ["optim.lars_trust_coefficient", "positive"]),
])
def test_bad_config_fails_naming_key_and_allowed_values(override: list[str], must_mention: list[str]) -> None:
    with pytest.raises(ValueError) as err:
        load_config(None, override)
    for word in must_mention:
        assert word in str(err.value), str(err.value)


def test_bad_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml", [])
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  momentun: 0.9\n")
    with pytest.raises(ValueError, match="optim.momentun.*momentum"):
        load_config(f, [])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path, [])
    assert cfg.optim.lr == 1e-3 and cfg.method.hypersolid.alpha == 0.9 and cfg.method.hypersolid.out_dim == 1024


def test_paper_setups_are_shipped() -> None:
    names = {p.stem for p in CONFIGS}
    assert {"quickstart", "cifar10", "cifar100", "stl10", "food101", "imagenet100", "imagenet1k",
            "stl10_vit_tiny"} <= names
    in1k = load_config(REPO / "configs/imagenet1k.yaml", [])
    assert (in1k.model.arch, in1k.data.global_batch_size, in1k.epochs) == ("resnet50", 512, 100)
    vit = load_config(REPO / "configs/stl10_vit_tiny.yaml", [])
    assert (vit.model.arch, vit.data.global_batch_size, vit.epochs) == ("vit_tiny", 64, 100)
    c100 = load_config(REPO / "configs/cifar100.yaml", [])
    assert (c100.model.arch, c100.data.global_batch_size, c100.epochs, c100.data.num_local_views) == \
        ("resnet18", 128, 200, 6)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_loads_and_varies_one_thing(path: Path) -> None:
    base, runs = load_sweep(path)
    assert Path(base).is_file() and len(runs) >= 2
    assert len({tuple(r) for r in runs}) == len(runs)  # no duplicated run


def test_sweep_with_a_bad_run_names_its_index(tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"base": str(REPO / "configs/cifar100.yaml"),
                                 "runs": [["method.hypersolid.alpha=0.5"], ["method.hypersolid.alfa=0.5"]]}))
    with pytest.raises(ValueError, match=r"runs\[1\].*method.hypersolid.alfa"):
        load_sweep(f)
    f.write_text(yaml.safe_dump({"base": "x.yaml"}))
    with pytest.raises(ValueError, match="'runs'"):
        load_sweep(f)


def test_roundtrip_and_config_yaml(tmp_path: Path) -> None:
    cfg = load_config(REPO / "configs/quickstart.yaml", ["optim.lr=2e-3"])
    path = save_config(cfg, tmp_path)
    again = load_config(path, [])
    assert to_dict(again) == to_dict(cfg) == to_dict(from_dict(to_dict(cfg)))


def test_fingerprint_ignores_how_long_and_where_but_not_what() -> None:
    base = load_config(None, [])
    same = load_config(None, ["epochs=7", "max_steps=5", "run_dir=/elsewhere", "tracking.experiment=x",
                              "checkpoint.keep_last=9", "data.num_workers=0"])
    other = load_config(None, ["method.hypersolid.alpha=0.8"])
    assert fingerprint(base) == fingerprint(same)
    assert fingerprint(base) != fingerprint(other)
    assert config_diff(to_dict(base), to_dict(other)) == ["method.hypersolid.alpha: 0.9 -> 0.8"]


def test_every_config_error_is_a_config_error_and_a_value_error(tmp_path: Path) -> None:
    for override in (["optim.lrr=1"], ["optim.lr=fast"], ["optim.name=lamb"], ["optim.lr"], ["optim.lr_scaling=linear"],
                     ["data.batch_size_per_gpu=0"]):
        with pytest.raises(ConfigError) as err:
            load_config(None, override)
        assert isinstance(err.value, ValueError)


def test_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  lr: 0.1\n   name: sgd\n")
    with pytest.raises(ConfigError, match=rf"config file '{f}' is not valid YAML at line 3, column 8") as err:
        load_config(f, [])
    assert "\n" not in str(err.value)
    f.write_text("optim: [lr, 0.1\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line 2, column 1"):
        load_config(f, [])


def test_unknown_key_says_whether_it_came_from_the_file_or_an_override(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("optim:\n  momentun: 0.9\n")
    with pytest.raises(ConfigError, match=rf"optim.momentun.*\(in {f}\)"):
        load_config(f, [])
    f.write_text("optim:\n  momentum: 0.9\n")
    with pytest.raises(ConfigError, match=r"optim.lrr.*\(from the command-line override 'optim.lrr=1'\)"):
        load_config(f, ["optim.lrr=1"])
    # A whole section that does not exist, named by an override, while a file is given too.
    with pytest.raises(ConfigError, match=r"unknown config key 'foo'.*optim.*\(from the command-line override "
                                          r"'foo.bar='\)$") as err:
        load_config(f, ["optim.lr=0.1", "foo.bar="])
    assert str(f) not in str(err.value)
    # An interpolation that cannot be resolved is found only when converting: still blamed on its override.
    with pytest.raises(ConfigError, match=r"optim.lr.*\(from the command-line override 'optim.lr=\$\{nope\}'\)"):
        load_config(f, ["optim.lr=${nope}", "optim.momentum=0.8"])
    f.write_text("optim:\n  lr: ${nope}\n")
    with pytest.raises(ConfigError, match=rf"optim.lr.*\(in {f}\)"):
        load_config(f, ["optim.momentum=0.8"])


def test_dist_backend_is_read_as_dist_transport(tmp_path: Path, capsys: pytest.CaptureFixture,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Like every former key (config/former_keys.py): read under its new name with a note, an error only when
    both spellings in one layer disagree."""
    monkeypatch.setattr(former_keys, "_noted", set())
    assert load_config(None, ["dist.transport=gloo"]).dist.transport == "gloo"
    assert load_config(None, ["dist.backend=gloo"]).dist.transport == "gloo"
    assert ("note: config key 'dist.backend' (the override 'dist.backend=gloo') is read as 'dist.transport'"
            in capsys.readouterr().err)
    f = tmp_path / "c.yaml"
    f.write_text("dist:\n  backend: nccl\n")
    assert load_config(f, []).dist.transport == "nccl"
    assert load_config(f, ["dist.transport=gloo"]).dist.transport == "gloo"  # a later layer wins
    f.write_text("dist:\n  backend: nccl\n  transport: gloo\n")
    with pytest.raises(ConfigError, match=r"'dist.backend' = 'nccl' and 'dist.transport' = 'gloo' \(in .*\) disagree"):
        load_config(f, [])
    with pytest.raises(ConfigError, match="dist.transport.*auto | gloo | nccl"):
        load_config(None, ["dist.transport=mpi"])
    # A config stored by an older version (in a checkpoint) is read under the new name, and resumes.
    old = to_dict(load_config(None, ["dist.transport=gloo"]))
    old["dist"]["backend"] = old["dist"].pop("transport")
    assert from_dict(old).dist.transport == "gloo"
    assert fingerprint(old) == fingerprint(load_config(None, ["dist.transport=nccl"]))


def test_configs_stored_by_older_versions_read_and_compare_as_the_same_training():
    # A checkpoint's config from before data.format and dist.transport existed: the storage format was
    # data.dataset, the transport dist.backend, and keys added since are absent.
    new = to_dict(load_config(None, ["data.format=webdataset", "data.path=/d", "dist.transport=gloo"]))
    old = {**new, "data": {k: v for k, v in new["data"].items() if k not in ("format", "eval_train_path")},
           "dist": {("backend" if k == "transport" else k): v for k, v in new["dist"].items()}}
    old["data"]["dataset"] = "webdataset"
    read = from_dict(old)
    assert read.data.format == "webdataset" and read.data.dataset is None and read.dist.transport == "gloo"
    assert config_diff(old, new) == []
    # builtin: the old default name equals the new unset name; a real change is still reported
    builtin = to_dict(load_config(None, []))
    old_builtin = {**builtin, "data": {**{k: v for k, v in builtin["data"].items() if k != "format"},
                                       "dataset": "fashion_mnist"}}
    assert config_diff(old_builtin, builtin) == []
    changed = to_dict(load_config(None, ["data.dataset=digits"]))
    assert config_diff(old_builtin, changed) == ["data.dataset: 'fashion_mnist' -> 'digits'"]
