"""The ``method`` section of the run config: ``method.name`` picks the self-supervised method, and every
registered method has its own section ``method.<name>.*`` (its ``Config`` dataclass), read only when it is
the chosen one. The section's schema is built from the registry, so a new method file adds its keys.

A checkpoint stores only the chosen method's section (:func:`chosen_section`), so removing or renaming another
method's module leaves it readable; a config stored by an earlier version, with every method's section, reads
with the sections of methods not installed here left out (:func:`drop_missing_sections`), said in one line.

Earlier versions called this section ``loss``: Hypersolid's keys sat at ``loss.<key>`` and a baseline's at
``loss.<name>.<key>``; such a config is read through the table of former keys (``config/former_keys.py``).
"""

from __future__ import annotations

from typing import Any

from hypersolid_scale.config.sections import chosen_only, drop_missing, sectioned_class
from hypersolid_scale.methods.registry import get_method, method_names

DEFAULT_METHOD = "hypersolid"


def _section(self: Any) -> Any:
    """The chosen method's section (``method.<name>``)."""
    return getattr(self, self.name)


def _validate(self: Any) -> None:
    """Raise :class:`ConfigError` for an unknown method or the first bad key of the chosen method's section
    (the other sections are never read, so they are not checked)."""
    get_method(self.name).validate_section(self.section())


MethodConfig: Any = sectioned_class(
    "MethodConfig",
    __name__,
    [("name", str, DEFAULT_METHOD)],
    {name: get_method(name).Config for name in method_names()},
    namespace={"section": _section, "validate": _validate},
    doc="The ``method`` section: ``name`` and one section per registered method (``method.<name>.*``).",
)


def chosen_section(method: dict[str, Any]) -> dict[str, Any]:
    """A ``method`` section (a nested dict) cut to its ``name`` and the chosen method's own section."""
    return chosen_only(method, "name", DEFAULT_METHOD, [k for k in method if k != "name"])


def _chosen_not_installed(method: dict[str, Any], gone: list[str]) -> str:
    name = method.get("name", DEFAULT_METHOD)
    return f", and method.name={name} itself is not installed: only its backbone can be used" if name in gone else ""


def drop_missing_sections(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (a stored nested config dict) without the ``method.<name>`` sections of methods not installed here
    (config/sections.py)."""
    return drop_missing(d, where, "method", "methods", method_names(), _chosen_not_installed)
