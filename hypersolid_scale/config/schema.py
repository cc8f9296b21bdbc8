"""The whole run as one typed dataclass tree: YAML files + ``section.key=value`` overrides.

Every section owned by another package (data, model, method, optim, dist, checkpoint, tracking, eval) is imported
from it, so one definition per field exists in the project. ``load_config`` fails *before any work starts* with a
:class:`~hypersolid_scale.safety.errors.ConfigError` (a ``ValueError``) that names the offending file or key and
what is allowed: a YAML syntax error (with its line and column), an unknown key, a value of the wrong type
or a value outside its allowed set.

Example::

    cfg = load_config("configs/quickstart.yaml", ["optim.lr=3e-4", "data.global_batch_size=256"])
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import GrammarParseError, OmegaConfBaseException

from hypersolid_scale.checkpoint.config import CHOICES as CHECKPOINT_CHOICES
from hypersolid_scale.checkpoint.config import RANGES as CHECKPOINT_RANGES
from hypersolid_scale.checkpoint.config import CheckpointConfig
from hypersolid_scale.config.combinations import check_combinations
from hypersolid_scale.config.former_keys import rename_former_keys
from hypersolid_scale.config.nested import flatten
from hypersolid_scale.data.batch import check_batch_overrides, drop_other_batch_key
from hypersolid_scale.data.config import DataConfig, chosen_format_section, drop_missing_format_sections
from hypersolid_scale.distributed.config import CHOICES as DIST_CHOICES
from hypersolid_scale.distributed.config import RANGES as DIST_RANGES
from hypersolid_scale.distributed.config import DistConfig
from hypersolid_scale.eval.config import EvalConfig
from hypersolid_scale.losses.config import drop_missing_backend_sections
from hypersolid_scale.methods import MethodConfig
from hypersolid_scale.methods.config import chosen_section, drop_missing_sections
from hypersolid_scale.models import ModelConfig
from hypersolid_scale.models.config import chosen_model_section, drop_missing_model_sections
from hypersolid_scale.safety import atomic
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.safety.run_lock import not_a_directory
from hypersolid_scale.tracking import TrackingConfig
from hypersolid_scale.tracking import validate_config as validate_tracking
from hypersolid_scale.training.optim import LR_SCALINGS, OptimConfig
from hypersolid_scale.training.optim import check as check_optim

# ----------------------------------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run_dir: str = "runs/default"
    seed: int = 0
    deterministic: bool = False  # deterministic kernels; same seed + same world size -> same parameters
    epochs: int = 100
    max_steps: int = 0  # > 0 stops after this many optimizer steps (before `epochs` if smaller)
    progress: bool = True  # tqdm bar on rank 0


# Values with a closed set of choices, checked after merging so that the message can list them. Sections
# owned by other packages may validate more in their own __post_init__ (run by OmegaConf.to_object).
CHOICES: dict[str, tuple[Any, ...] | Callable[[], tuple[Any, ...]]] = {
    "optim.name": ("adamw", "sgd", "lars"),
    "optim.schedule": ("constant", "cosine"),
    "optim.lr_scaling": LR_SCALINGS,
    **DIST_CHOICES,
    **CHECKPOINT_CHOICES,
}

# (key, predicate, what is allowed) for numeric ranges.
RANGES: list[tuple[str, Any, str]] = [
    ("optim.lr", lambda v: v > 0, "a positive float"),
    ("optim.weight_decay", lambda v: v >= 0, "a float >= 0"),
    ("optim.momentum", lambda v: 0 <= v < 1, "a float in [0, 1)"),
    ("optim.warmup_epochs", lambda v: v >= 0, "a float >= 0"),
    ("optim.min_lr", lambda v: v >= 0, "a float >= 0"),
    ("optim.grad_clip", lambda v: v >= 0, "a float >= 0 (0 disables clipping)"),
    ("optim.accumulate_steps", lambda v: v >= 1, "an int >= 1 (1: no accumulation)"),
    ("optim.betas", lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two floats in [0, 1)"),
    ("optim.reference_batch_size", lambda v: v is None or v >= 1, "an int >= 1 (a global batch) or null"),
    ("optim.lars_trust_coefficient", lambda v: v > 0, "a positive float"),
    ("epochs", lambda v: v >= 1, "an int >= 1"),
    ("max_steps", lambda v: v >= 0, "an int >= 0 (0 = run all epochs)"),
    *DIST_RANGES,
    *CHECKPOINT_RANGES,
]

# ----------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------


def _get(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def _explain(err: OmegaConfBaseException, schema: DictConfig) -> ConfigError:
    """Turn an OmegaConf error into a ConfigError naming the key and what would have been accepted."""
    key = getattr(err, "full_key", None) or "?"
    first_line = str(err).splitlines()[0]
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(schema, parent_key) if parent_key else schema
    if isinstance(err, KeyError) and isinstance(parent, DictConfig):
        allowed = ", ".join(sorted(str(k) for k in parent.keys()))
        where = f"section '{parent_key}'" if parent_key else "the top level"
        return ConfigError(f"unknown config key '{key}': {first_line}. Keys allowed in {where}: {allowed}")
    expected = ""
    if isinstance(parent, DictConfig) and leaf in parent:
        node = parent._get_node(leaf)
        expected = f" (expected {node._metadata.ref_type})" if node is not None else ""
    return ConfigError(f"bad value for config key '{key}'{expected}: {first_line}")


def validate(cfg: Config) -> None:
    """Check closed choices and numeric ranges; raise ConfigError naming the key and the allowed values.

    The data, model, method, tracking and eval sections are checked by their own packages' ``validate``
    (their ValueErrors become ConfigErrors: a bad value in a config is always the user's to fix); the chosen
    method then checks what it cannot be combined with.
    """
    try:
        for section in (cfg.data, cfg.model, cfg.method, cfg.eval):
            section.validate()
        validate_tracking(cfg.tracking)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None
    for key, listed in CHOICES.items():
        choices = listed() if callable(listed) else listed
        value = _get(cfg, key)
        if isinstance(value, str):
            value = value.lower()
        if value not in choices:
            allowed = " | ".join(str(c) for c in choices)
            raise ConfigError(f"config key '{key}' = {value!r} is not allowed; choose one of: {allowed}")
    for key, ok, what in RANGES:
        value = _get(cfg, key)
        if not ok(value):
            raise ConfigError(f"config key '{key}' = {value!r} is invalid; expected {what}")
    if cfg.optim.min_lr > cfg.optim.lr:
        raise ConfigError(
            f"config key 'optim.min_lr' = {cfg.optim.min_lr} is above optim.lr = {cfg.optim.lr}; "
            "the cosine schedule decays from optim.lr down to optim.min_lr"
        )
    check_optim(cfg.optim)
    check_combinations(cfg)  # across sections: config/combinations.py


def _read_yaml(path: str | Path) -> DictConfig:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; pass an existing YAML file (see configs/)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML{where}: {err.problem or err.context}; "
            "fix the syntax there (indent with spaces, one 'key: value' per line)"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of sections, got {type(data).__name__}")
    return OmegaConf.create(rename_former_keys(data, f"in {path}"))


def parse_override(ov: str) -> DictConfig:
    """One ``section.key=value`` override as a config, its value read as YAML (as OmegaConf reads it); a
    ConfigError naming the override and how to write it when it has no ``=`` or its value cannot be parsed."""
    if "=" not in ov or ov.startswith("="):
        raise ConfigError(f"override {ov!r} is malformed; write it as section.key=value, e.g. optim.lr=1e-3")
    try:
        return OmegaConf.from_dotlist([ov])
    except yaml.YAMLError as err:
        problem = f"not valid YAML: {getattr(err, 'problem', None) or str(err).splitlines()[0]}"
    except GrammarParseError as err:
        problem = f"a bad ${{...}} interpolation: {str(err).splitlines()[0]}"
    key, value = ov.split("=", 1)
    raise ConfigError(
        f"override {ov!r} cannot be parsed: its value {value!r} is {problem}. Write a list as "
        f"{key}=[a,b] with every bracket closed, and quote text holding [ ] {{ }} : # @ * ! or ${{, "
        f"e.g. {key}=\"'text'\" (the outer quotes are for the shell)"
    )


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> DictConfig:
    """All overrides as one config, later ones winning (see :func:`parse_override` for the errors)."""
    return cast(DictConfig, OmegaConf.merge(OmegaConf.create(), *(parse_override(ov) for ov in overrides)))


@cache
def _schema() -> DictConfig:
    """The defaults as an OmegaConf tree, built once per process (half of a load's time): a load merges into a
    copy (``OmegaConf.merge`` copies its first argument) and never changes this one."""
    return OmegaConf.structured(Config)


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Defaults <- YAML file <- ``a.b=c`` overrides, type-checked and validated.

    Raises:
        ConfigError (a ValueError): a missing or unparsable file, an unknown key, a wrong type, a value outside
        its allowed set, a malformed override, a run_dir that is a file; it blames the file or the override.
    """
    schema = _schema()
    given = [(ov.split("=", 1)[0], f"from the command-line override {ov!r}", _renamed_override(ov)) for ov in overrides]
    check_batch_overrides([key for key, _, _ in given])
    layers = ([("", f"in {path}", _read_yaml(path))] if path is not None else []) + given
    merged, where = schema, ""
    try:  # one layer at a time, so that an error is blamed on the file or on the override that caused it
        for _, where, layer in layers:  # noqa: B007 - `where` names the failing layer in the except below
            merged = cast(DictConfig, OmegaConf.merge(drop_other_batch_key(merged, layer), layer))
        where = ""
        cfg = cast(Config, OmegaConf.to_object(merged))
    except OmegaConfBaseException as err:
        if not where:  # found converting (an interpolation): blame the key's last override, else the file
            k = getattr(err, "full_key", None) or "?"
            where = next(
                (w for key, w, _ in reversed(given) if f"{key}.".startswith(f"{k}.") or f"{k}.".startswith(f"{key}.")),
                f"in {path}" if path is not None else "",
            )
        raise ConfigError(f"{_explain(err, schema)}{f' ({where})' if where else ''}") from None
    cfg.dist.precision = cfg.dist.precision.lower()
    validate(cfg)
    if (why := not_a_directory(cfg.run_dir)) is not None:
        raise ConfigError(
            f"config key 'run_dir' = {cfg.run_dir!r} {why}, not a directory; choose another "
            "run_dir (a new or an existing directory), e.g. run_dir=runs/my_run"
        )
    return cfg


# to_dict's answers by repr(cfg), newest last: a run converts the same config at every checkpoint (twice, with
# its fingerprint), and OmegaConf's conversion takes ~35 ms. A dataclass's repr names every field's value
# exactly (1 and 1.0 differ), so equal reprs convert alike; callers get a copy (some edit what they get).
_AS_DICT: dict[str, dict[str, Any]] = {}


def to_dict(cfg: Config, *, stored: bool = False) -> dict[str, Any]:
    """Plain nested dict (what ``config.yaml`` holds); ``stored``: with the chosen method's, format's and backbone's
    sections only (what a checkpoint stores, so that removing another one's module leaves it readable)."""
    key = repr(cfg)
    if key not in _AS_DICT:
        _AS_DICT[key] = cast(dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True))
        while len(_AS_DICT) > 16:
            del _AS_DICT[next(iter(_AS_DICT))]
    d = copy.deepcopy(_AS_DICT[key])
    if not stored:
        return d
    chosen = {"method": chosen_section(d["method"]), "data": chosen_format_section(d["data"])}
    return {**d, **chosen, "model": chosen_model_section(d["model"])}


def _renamed_override(ov: str) -> DictConfig:
    """One override with a former key under its present name (config/former_keys.py)."""
    layer = parse_override(ov)
    d = cast(dict[str, Any], OmegaConf.to_container(layer))
    renamed = rename_former_keys(d, f"the override {ov!r}")
    return layer if renamed == d else OmegaConf.create(renamed)


def migrate(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict stored by an older version (a checkpoint's), as this version names it: former keys under
    their present names (config/former_keys.py), and the sections of methods, formats or backbones not installed
    here left out."""
    where = "a stored config"
    d = drop_missing_backend_sections(drop_missing_sections(rename_former_keys(d, where), where), where)
    return drop_missing_model_sections(drop_missing_format_sections(d, where), where)


def from_dict(d: dict[str, Any]) -> Config:
    """Inverse of :func:`to_dict`; keys unknown to this version are reported as errors, configs stored by
    older versions (checkpoints) are read through :func:`migrate`."""
    try:
        cfg = cast(Config, OmegaConf.to_object(OmegaConf.merge(_schema(), OmegaConf.create(migrate(d)))))
    except OmegaConfBaseException as err:
        raise _explain(err, _schema()) from None
    return cfg


def to_yaml(cfg: Config) -> str:
    """``config.yaml``: the stored form (:func:`to_dict` with ``stored``: the chosen method's and format's
    sections only), which :func:`load_config` reads back as the same config."""
    return OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg, stored=True)))


def save_config(cfg: Config, run_dir: str | Path) -> Path:
    return atomic.write_text(Path(run_dir) / "config.yaml", to_yaml(cfg))


__all__ = [
    "CheckpointConfig",
    "Config",
    "DistConfig",
    "OptimConfig",
    "flatten",
    "from_dict",
    "migrate",
    "load_config",
    "parse_override",
    "parse_overrides",
    "save_config",
    "to_dict",
    "to_yaml",
    "validate",
]
