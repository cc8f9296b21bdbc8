"""The registry of methods (``method.name``): every module of this package that defines a method registers
its class with :func:`register`, and :func:`method_names` / :func:`get_method` import them all on first use.

A new method is one new module here (plus its test): a :class:`~hypersolid_scale.methods.base.Method`
subclass with a ``name``, a ``Config`` dataclass (its ``method.<name>.*`` section) and the ``@register``
decorator. docs/design.md ("Extending") has a worked example; ``python -m hypersolid_scale.methods`` lists the
installed methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hypersolid_scale.config.registry import Registry

if TYPE_CHECKING:
    from hypersolid_scale.methods.base import Method

_NOT_METHODS = {"base", "config", "model", "params", "registry"}  # this package's modules that define no method
METHODS: Registry[type[Method]] = Registry(
    "method", "method.name", "hypersolid_scale.methods", skip=_NOT_METHODS, identifier=True
)


def register(cls: type[Method]) -> type[Method]:
    """Class decorator: make ``cls`` the method ``cls.name``. A second class under a taken name is an error; a
    class without a ``display_name`` is displayed by its ``name``."""
    if not getattr(cls, "display_name", ""):
        cls.display_name = getattr(cls, "name", "")
    return METHODS.register(getattr(cls, "name", ""), cls)


def unregister(name: str) -> None:
    """Remove a method registered at run time (tests)."""
    METHODS.unregister(name)


def method_names() -> tuple[str, ...]:
    """Every registered method, in ``order`` (Hypersolid first, then the baselines), then by name."""
    return METHODS.names()


def get_method(name: str) -> type[Method]:
    """The method class registered as ``name``; a ConfigError listing the known names otherwise."""
    return METHODS.get(name)


def build_method(cfg: Any, backbone: Any, feature_dim: int, *, steps_per_epoch: int) -> Method:
    """The method ``cfg.name`` (``cfg``: the ``method`` config section) with heads on ``feature_dim`` backbone
    features, configured by its section ``cfg.<name>``. ``backbone`` is only copied (momentum teachers start
    as copies): build the method before the backbone is trained. Raises ConfigError for an unknown method or a
    bad section."""
    cls = get_method(cfg.name)
    section = getattr(cfg, cfg.name)
    cls.validate_section(section)
    return cls.build(section, backbone=backbone, feature_dim=feature_dim, steps_per_epoch=steps_per_epoch)
