"""The registry of methods (``method.name``): every module of this package that defines a method registers
its class with :func:`register`, and :func:`method_names` / :func:`get_method` import them all on first use.

A new method is one new module here (plus its test): a :class:`~hypersolid_scale.methods.base.Method`
subclass with a ``name``, a ``Config`` dataclass (its ``method.<name>.*`` section) and the ``@register``
decorator. docs/design.md ("Extending") has a worked example.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from hypersolid_scale.safety.errors import ConfigError

if TYPE_CHECKING:
    from hypersolid_scale.methods.base import Method

_REGISTRY: dict[str, type[Method]] = {}
_NOT_METHODS = {"base", "config", "params", "registry"}  # this package's modules that define no method
_discovered = False


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` the method ``cls.name``. A second class under a taken name is an error."""
    name = getattr(cls, "name", "")
    if not name or not name.isidentifier():
        raise ValueError(f"{cls.__name__}.name={name!r}: a method needs a name usable as a config key")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"two methods are named {name!r}: {_REGISTRY[name].__qualname__} and {cls.__qualname__}")
    _REGISTRY[name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a method registered at run time (tests)."""
    _REGISTRY.pop(name, None)


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    package = importlib.import_module("hypersolid_scale.methods")
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_METHODS and not info.name.startswith("_"):
            importlib.import_module(f"hypersolid_scale.methods.{info.name}")


def method_names() -> tuple[str, ...]:
    """Every registered method, in ``order`` (Hypersolid first, then the baselines as the docs list them)."""
    _discover()
    return tuple(sorted(_REGISTRY, key=lambda n: (_REGISTRY[n].order, n)))


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; a ConfigError listing the known names otherwise."""
    _discover()
    if name not in _REGISTRY:
        raise ConfigError(f"method.name={name!r} is not a known method; choose one of: {' | '.join(method_names())}")
    return _REGISTRY[name]


def build_method(cfg: Any, backbone: Any, feature_dim: int, *, steps_per_epoch: int, model_cfg: Any = None) -> Method:
    """The method ``cfg.name`` (``cfg``: the ``method`` config section) with heads on ``feature_dim`` backbone
    features, configured by its section ``cfg.<name>``. ``backbone`` is only copied (momentum teachers start
    as copies): build the method before the backbone is trained. ``model_cfg`` is the run's model section
    (Hypersolid's projector shape). Raises ConfigError for an unknown method or a bad section."""
    cls = get_method(cfg.name)
    section = getattr(cfg, cfg.name)
    cls.validate_section(section)
    return cls.build(
        section, backbone=backbone, feature_dim=feature_dim, steps_per_epoch=steps_per_epoch, model_cfg=model_cfg
    )
