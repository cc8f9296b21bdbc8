"""The paper's setups by name: ``--config quickstart`` is ``configs/quickstart.yaml``, from a checkout or an
installed wheel.

configs/ stays at the top of the repository; the wheel carries it as the package data
``hypersolid_scale/configs/`` (pyproject.toml's package-dir mapping: one copy, nothing to keep in sync).
Stdlib only (and safety.errors): the training entry resolves ``--config`` before it imports torch.
"""

from __future__ import annotations

from pathlib import Path

from hypersolid_scale.safety.errors import ConfigError

SUFFIXES = (".yaml", ".yml")


def setups_dir() -> Path:
    """Where the setups are: the installed package's data, else the checkout's configs/."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "configs", package.parent / "configs"):  # a wheel; a checkout or editable install
        if candidate.is_dir():
            return candidate
    raise ConfigError(f"no packaged setups: neither {package / 'configs'} nor {package.parent / 'configs'} exists")


def setup_names() -> list[str]:
    """Every setup's name, e.g. ``quickstart`` or ``baselines/simclr_cifar10``: the top-level ones first."""
    root = setups_dir()
    found = [str(p.relative_to(root).with_suffix("")) for s in SUFFIXES for p in root.rglob(f"*{s}")]
    return sorted(found, key=lambda n: (n.count("/"), n))  # the top-level setups first


def resolve_config(config: str) -> str:
    """A YAML path as given if it exists; else the setup it names (``quickstart``, ``configs/cifar100.yaml``,
    ``baselines/simclr_cifar10``) as a path; else a ConfigError listing the setups."""
    if Path(config).expanduser().is_file():
        return config
    name = config.removeprefix("configs/")
    path = setups_dir() / (name if name.endswith(SUFFIXES) else f"{name}.yaml")
    if path.is_file():
        return str(path)
    names = setup_names()
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    raise ConfigError(
        f"config file {config!r} does not exist and is not a packaged setup; pass an existing YAML file or "
        f"a setup's name: {shown}"
    )
