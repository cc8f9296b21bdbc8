"""What a comparison trains: one training per (method, seed), each from its setting's config, at one budget.

The budget is matched in *images seen*: every training runs the same number of optimizer steps with the same
global batch (``data.global_batch_size``, or ``data.batch_size_per_gpu`` x processes), so each method sees the
same images the same number of times. Methods differ in views per image (DINO and SwaV add local crops, as their
papers do; Hypersolid's configs do too): a view is not an extra image, so it is reported next to the wall-clock,
not equalised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from omegaconf import OmegaConf

from hypersolid_scale.config.former_keys import rename_former_keys
from hypersolid_scale.config.schema import Config, load_config
from hypersolid_scale.data import plan_batch
from hypersolid_scale.methods import get_method, method_names
from hypersolid_scale.methods.config import DEFAULT_METHOD
from hypersolid_scale.safety.errors import ConfigError


@dataclass(frozen=True)
class Training:
    """One training of the comparison and where everything of it lives under the output directory."""

    method: str
    seed: int
    config: Path
    overrides: tuple[str, ...] = field(default=())
    # To the study engine (hypersolid_scale.study.plan.PlannedRun): a budget in steps, not epochs, and no stages.
    epochs: ClassVar[int] = 0
    pause_epochs: ClassVar[tuple[int, ...]] = ()

    @property
    def name(self) -> str:
        return f"{self.method}-seed{self.seed}"


def _trains(path: Path) -> str:
    """The method.name the config file at ``path`` sets (its default when it sets none)."""
    try:
        d = OmegaConf.to_container(OmegaConf.load(path))
    except Exception:  # noqa: BLE001 - an unreadable file is reported where check_budget loads it, with its cause
        return ""
    d = rename_former_keys({str(k): v for k, v in d.items()} if isinstance(d, dict) else {}, str(path), note=False)
    method = d.get("method")
    return str(method.get("name", DEFAULT_METHOD)) if isinstance(method, dict) else DEFAULT_METHOD


def setting_config(configs_dir: Path, setting: str, method: str) -> tuple[Path, tuple[str, ...]]:
    """The config and overrides that train ``method`` in ``setting``: ``configs/<setting>.yaml`` for the method
    it trains (Hypersolid's), else ``configs/baselines/<method>_<setting>.yaml`` where that file exists (a
    baseline's tuned settings), else ``configs/<setting>.yaml`` with ``method.name=<method>``: the method's
    defaults on the setting's data, backbone, batch and optimizer, and only the two global views when the
    method uses no others (``data.num_local_views=0``)."""
    base = configs_dir / f"{setting}.yaml"
    own = configs_dir / "baselines" / f"{method}_{setting}.yaml"
    if base.is_file() and _trains(base) == method:
        return base, ()
    if own.is_file():
        return own, ()
    if not base.is_file():
        have = sorted(p.stem for p in configs_dir.glob("*.yaml"))
        raise ConfigError(
            f"no setting {setting!r} for {method}: neither {base} nor {own} exists"
            + (f"; the settings are {', '.join(have)}" if have else "")
            + "; pick one with --setting or add the file"
        )
    views = () if get_method(method).uses_local_views else ("data.num_local_views=0",)
    return base, (f"method.name={method}", *views)


def parse_methods(text: str) -> list[str]:
    """``all`` or a comma-separated list of registered methods, in the registry's order, without repeats."""
    known = method_names()
    if text.strip() == "all":
        return list(known)
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in known]
    if unknown or not names:
        raise ConfigError(
            f"--methods {text!r}: unknown {', '.join(unknown) or '(empty)'}; choose from {', '.join(known)} or 'all'"
        )
    return [m for m in known if m in names]


def roles(subject: str, references: str) -> frozenset[str]:
    """The methods that get the full ``--seeds``: the subject (``--subject``, the method under study) and the
    references (``--references``, comma-separated); each a registered method, else a ConfigError."""
    names = [subject, *(r.strip() for r in references.split(",") if r.strip())]
    known = method_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"--subject/--references: {', '.join(unknown)} is not a method; choose from {', '.join(known)}"
        )
    return frozenset(names)


def plan(
    configs_dir: Path,
    setting: str,
    methods: list[str],
    seeds: int,
    baseline_seeds: int,
    overrides: list[str],
    *,
    full: frozenset[str] = frozenset({"hypersolid", "simclr"}),
) -> list[Training]:
    """The trainings, in the order of ``methods``: ``seeds`` seeds (0, 1, ...) for the subject and the
    references (``full``, :func:`roles`), ``baseline_seeds`` for the rest."""
    if seeds < 1 or baseline_seeds < 1:
        raise ConfigError(f"--seeds {seeds} / --baseline-seeds {baseline_seeds}: each method needs >= 1 seed")
    out = []
    for method in methods:
        n = seeds if method in full else baseline_seeds
        path, own = setting_config(configs_dir, setting, method)
        out += [Training(method, seed, path, (*own, *overrides)) for seed in range(n)]
    return out


def training_overrides(t: Training, *, steps: int, run_dir: Path) -> list[str]:
    """The overrides that make ``t``'s config the comparison's training: its seed, the matched step budget, its
    run directory. The online kNN monitor is off: every checkpoint gets the full evaluation afterwards."""
    return [*t.overrides, f"run_dir={run_dir}", f"seed={t.seed}", f"max_steps={steps}", "eval.every_n_epochs=0"]


@dataclass(frozen=True)
class Budget:
    steps: int
    global_batch: int
    views: dict[str, int]  # method -> views per image (global + local)

    @property
    def images_seen(self) -> int:
        return self.steps * self.global_batch


def _views(cfg: Config) -> int:
    local = cfg.data.num_local_views
    return 2 + (0 if local is None else int(local))


def check_budget(trainings: list[Training], *, steps: int, nproc: int, out_dir: Path) -> Budget:
    """Load every training's config as it will run (so that a bad override fails here, not an hour in) and
    require one global batch for all; return the matched budget."""
    if steps < 1 or nproc < 1:
        raise ConfigError(f"--steps {steps} / --nproc {nproc}: both must be >= 1")
    batches: dict[str, int] = {}
    views: dict[str, int] = {}
    for t in trainings:
        cfg = load_config(t.config, training_overrides(t, steps=steps, run_dir=out_dir / "runs" / t.name))
        if cfg.method.name != t.method:
            raise ConfigError(f"{t.config} trains method.name={cfg.method.name}, not {t.method}; fix its method.name")
        split = plan_batch(cfg.data, world_size=nproc, accumulate_steps=cfg.optim.accumulate_steps)
        batches[t.method] = split.global_batch
        views[t.method] = _views(cfg)
    if len(set(batches.values())) > 1:
        listed = ", ".join(f"{m} {b}" for m, b in batches.items())
        raise ConfigError(
            f"the methods' global batches differ ({listed}), so the same steps are not the same "
            "images seen; give every config the same data.global_batch_size (or pass "
            "data.global_batch_size=N to all of them)"
        )
    return Budget(steps=steps, global_batch=next(iter(batches.values())), views=views)
