"""Typed configuration of the Hypersolid objective (the ``method.hypersolid`` section of the run config).

The objective's keys (``alpha``, ``norm_weight``, ``pooling``, ``repel``), the ``backend`` and the keys several
backends read (``tile_size``, ``screen``) sit in ``method.hypersolid``; a backend's own keys in its section
``method.hypersolid.<backend>`` (``method.hypersolid.neighbors.k``, ``method.hypersolid.auto.by``), built from its
registration (``Backend.options``) as a method's section is from the method registry, so a new backend, its keys
included, needs no change here. Earlier versions had them flat (``method.hypersolid.k``): config/former_keys.py.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from hypersolid_scale.config.sections import drop_missing, sectioned_class
from hypersolid_scale.losses.backends import SECTION, backend_names, get_backend
from hypersolid_scale.losses.repulsion import REPEL_MODES

POOLINGS = ("max", "mean")
# off: columns exchanged and compared in the input's precision; bf16: exchanged and screened in bfloat16, every
# pair the proven rounding bound cannot decide recomputed in full precision (exact; docs/design.md §2, screening).
SCREENS = ("off", "bf16")


class LossConfigBase:
    """Hyperparameters of :class:`~hypersolid_scale.losses.HypersolidLoss` (what :data:`LossConfig`, built from the
    backend registry, holds besides its fields).

    Defaults are the paper's (alpha 0.9, lambda 1e-6, max-pooled targets, repulsion over all pairs).

    Attributes:
        alpha: exclusion threshold on cosine similarity.
        norm_weight: lambda of the L2 normalization term; 0 disables it.
        pooling: target per image: "max" (paper) | "mean" (ablation).
        repel: which pairs are repelled: "all" (paper) | "negatives" | "positives".
        backend: a registered backend (losses/backends/): "dense" (reference) | "tiled" (exact, bounded memory) |
            "neighbors" (candidate search) | "auto" (tiled or neighbors per step; docs/design.md §3c) | "ring"
            (tiled, rows passed round the ranks; §3f).
        tile_size: tiled, ring, and the torch search: rows/columns per block.
        screen: tiled, ring: "off" | "bf16" (columns sent and screened in bf16, decisions exact; §2).
        <backend>: each registered backend's own section (its ``options``).
    """

    alpha: float
    norm_weight: float
    pooling: str
    repel: str
    backend: str
    tile_size: int
    screen: str

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first invalid field and what it accepts."""
        if not -1.0 < float(self.alpha) < 1.0:
            raise ValueError(f"{SECTION}.alpha must be in the open interval (-1, 1), got {self.alpha}")
        if self.norm_weight < 0:
            raise ValueError(f"{SECTION}.norm_weight must be >= 0, got {self.norm_weight}")
        for name, value, allowed in (
            ("pooling", self.pooling, POOLINGS),
            ("repel", self.repel, REPEL_MODES),
            ("backend", self.backend, backend_names()),
            ("screen", self.screen, SCREENS),
        ):
            if value not in allowed:
                raise ValueError(f"{SECTION}.{name}={value!r} is not valid; choose one of {', '.join(allowed)}")
        if int(self.tile_size) < 1:
            raise ValueError(f"{SECTION}.tile_size must be a positive integer, got {self.tile_size}")
        if self.screen != "off" and not get_backend(self.backend).screens:
            offer = [name for name in backend_names() if get_backend(name).screens]
            raise ValueError(
                f"{SECTION}.screen={self.screen!r} needs a backend that screens its columns "
                f"({', '.join(offer)}), not {SECTION}.backend={self.backend!r}; set {SECTION}.screen=off or "
                f"{SECTION}.backend={offer[0]}"
            )
        own = getattr(self, self.backend, None) if get_backend(self.backend).options is not None else None
        if own is not None and hasattr(own, "validate"):
            own.validate(f"{SECTION}.{self.backend}")
        get_backend(self.backend).check_config(self)  # what only this backend requires


COMMON: list[tuple[str, type, Any]] = [
    ("alpha", float, 0.9),
    ("norm_weight", float, 1e-6),
    ("pooling", str, "max"),
    ("repel", str, "all"),
    ("backend", str, "dense"),
    ("tile_size", int, 4096),
    ("screen", str, "off"),
]


def backend_sections() -> dict[str, type]:
    """The registered backends with a section of their own: name -> its options dataclass."""
    return {n: opts for n in backend_names() if (opts := get_backend(n).options) is not None}


LossConfig: Any = sectioned_class("LossConfig", __name__, COMMON, backend_sections(), base=LossConfigBase)


def loss_config(**options: Any) -> Any:
    """A :data:`LossConfig` from keyword options, as :class:`~hypersolid_scale.losses.HypersolidLoss` takes them:
    the common ones as values; a backend's section as its options dataclass or a dict of its keys
    (``neighbors={"k": 8}``); or one of a backend's keys by its own name (``k=8``) where exactly one backend's
    section has that key. Raises ValueError naming an option no field or section has."""
    sections = backend_sections()
    common = {f.name for f in dataclasses.fields(LossConfig)}
    given: dict[str, Any] = {}
    by_key: dict[str, dict[str, Any]] = {}  # a section's keys given by their own names
    for name, value in options.items():
        owners = [b for b, opts in sections.items() if name in {f.name for f in dataclasses.fields(opts)}]
        if name in common:
            given[name] = value
        elif len(owners) == 1:
            by_key.setdefault(owners[0], {})[name] = value
        else:
            valid = sorted(common | {f.name for opts in sections.values() for f in dataclasses.fields(opts)})
            raise ValueError(f"unknown loss option {name!r}; valid options: {', '.join(valid)}")
    for section, keys in by_key.items():
        if section in given:
            raise ValueError(f"{', '.join(keys)} and {section}= both set the section {section}; give one of them")
        given[section] = keys
    for name, value in given.items():
        if name in sections:
            base = value if not isinstance(value, dict) else sections[name](**value)
            given[name] = copy.deepcopy(base)  # a config of its own, not shared with the caller's
    return LossConfig(**given)


def drop_missing_backend_sections(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (a stored nested config dict) without the ``method.hypersolid.<backend>`` sections of backends not
    installed here (config/sections.py), said once."""
    method = d.get("method")
    if not isinstance(method, dict):
        return d
    known = {f.name for f in dataclasses.fields(LossConfig)}
    kept = drop_missing(method, where, SECTION.split(".")[1], "repulsion backends", known, shown="method.")
    return d if kept is method else {**d, "method": kept}
