"""Which optional extra each part of the package needs, and the one-line error when it is not installed.

``pip install hypersolid-scale`` gives the losses, the methods and the models (torch, torchvision, numpy,
lightly); the trainer, the evaluation and the export need more, named by the extras of pyproject.toml.
A part calls :func:`require` before its own imports, so that a missing extra is one line naming the extra
(``pip install 'hypersolid-scale[train]'``), not a ``ModuleNotFoundError`` deep inside some module.

:data:`EXTRA_MODULES` lists, per extra, the modules this package imports from it; tests/test_packaging.py
checks it against pyproject.toml's extras. Stdlib only (and safety.errors, stdlib only too): it runs before
anything heavy is imported.
"""

from __future__ import annotations

import importlib.util

from hypersolid_scale.safety.errors import UserError

DIST = "hypersolid-scale"

# extra -> {module this package imports: the distribution pyproject.toml names for it}
_EVAL = {
    "omegaconf": "omegaconf",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
    "scipy": "scipy",
    "sklearn": "scikit-learn",
    "hdbscan": "hdbscan",
    "faiss": "faiss-cpu",
    "matplotlib": "matplotlib",
    "kornia": "kornia",
    "mlflow": "mlflow",  # an evaluation logs its report into the training run's MLflow store
    "safetensors": "safetensors",  # the export
    "timm": "timm",  # ViT backbones, published backbones
}
EXTRA_MODULES: dict[str, dict[str, str]] = {
    "eval": _EVAL,
    # The trainer imports the evaluation (its online kNN monitor), so [train] includes [eval].
    "train": {**_EVAL, "webdataset": "webdataset", "braceexpand": "braceexpand"},
}


# Declared by an extra but imported only where they are used, each with its own one-line error there: not
# required for the part to import. (MLflow: tracking.enabled=false trains and evaluates without it, and
# tracking/ says so when it is missing; tests/test_tracking.py.)
ON_USE = frozenset({"mlflow"})


class MissingExtra(UserError, ModuleNotFoundError):
    """An optional dependency is not installed; the message names the extra that installs it (a UserError: the
    entry points print it as one ``error:`` line and exit 2)."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` a part needs to import that cannot be imported here (checked without importing
    them; ON_USE's modules left out)."""
    return [m for m in EXTRA_MODULES[extra] if m not in ON_USE and importlib.util.find_spec(m) is None]


def require(extra: str, part: str) -> None:
    """Raise :class:`MissingExtra` (one line) if a module of ``extra`` is not installed; ``part`` is what needs it."""
    absent = missing(extra)
    if absent:
        names = ", ".join(EXTRA_MODULES[extra][m] for m in absent)
        raise MissingExtra(
            f"{part} needs the [{extra}] extra ({names} not installed): pip install '{DIST}[{extra}]'",
            name=absent[0],
        )


def require_module(module: str, extra: str, part: str) -> None:
    """Raise :class:`MissingExtra` (one line) if ``module``, one of ``extra``'s, is not installed: for a part of the
    base install that needs that one module only (the ViT backbone needs timm, not the whole extra)."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtra(
            f"{part} needs {EXTRA_MODULES[extra][module]}, from the [{extra}] extra: pip install '{DIST}[{extra}]'",
            name=module,
        )
