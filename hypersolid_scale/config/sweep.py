"""Sweeps: a YAML file ``base: configs/x.yaml`` + ``runs: [[override, ...], ...]``; ``launch/slurm/sweep.sbatch``
trains ``runs[i]`` as array element i. Every run is validated against the base config when the file is read."""

from __future__ import annotations

from pathlib import Path

import yaml

from hypersolid_scale.config.schema import load_config
from hypersolid_scale.safety.errors import ConfigError


def load_sweep(path: str | Path) -> tuple[str, list[list[str]]]:
    """Return ``(base_config_path, runs)``; every run is validated against the base config eagerly."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} does not exist")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict) or "base" not in data or "runs" not in data:
        raise ConfigError(
            f"sweep file {str(path)!r} needs two keys: 'base' (a config path) and 'runs' (a list of "
            "lists of section.key=value overrides)"
        )
    unknown = set(data) - {"base", "runs", "description"}
    if unknown:
        raise ConfigError(
            f"sweep file {str(path)!r} has unknown keys {sorted(unknown)}; allowed: base, runs, description"
        )
    runs = data["runs"]
    if not isinstance(runs, list) or not all(isinstance(r, list) and all(isinstance(o, str) for o in r) for r in runs):
        raise ConfigError(f"sweep file {str(path)!r}: 'runs' must be a list of lists of strings like 'optim.lr=1e-3'")
    base = str(data["base"])
    if not Path(base).is_file():
        # configs/sweeps/x.yaml names its base from the repository root: look upwards from the sweep file.
        for root in path.resolve().parents:
            if (root / base).is_file():
                base = str(root / base)
                break
    for i, run in enumerate(runs):
        try:
            load_config(base, run)
        except ValueError as err:
            raise ConfigError(f"sweep file {str(path)!r}, runs[{i}] = {run}: {err}") from None
    return base, [list(r) for r in runs]
