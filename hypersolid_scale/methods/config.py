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

import dataclasses
import os
import sys
from typing import Any

from hypersolid_scale.methods.registry import get_method, method_names

DEFAULT_METHOD = "hypersolid"


def _section(self: Any) -> Any:
    """The chosen method's section (``method.<name>``)."""
    return getattr(self, self.name)


def _validate(self: Any) -> None:
    """Raise :class:`ConfigError` for an unknown method or the first bad key of the chosen method's section
    (the other sections are never read, so they are not checked)."""
    get_method(self.name).validate_section(self.section())


def _method_config_class() -> type:
    fields: list[Any] = [("name", str, dataclasses.field(default=DEFAULT_METHOD))]
    for name in method_names():
        section = get_method(name).Config
        fields.append((name, section, dataclasses.field(default_factory=section)))
    cls = dataclasses.make_dataclass("MethodConfig", fields, namespace={"section": _section, "validate": _validate})
    cls.__module__ = __name__  # picklable, and named where it is defined
    cls.__doc__ = "The ``method`` section: ``name`` and one section per registered method (``method.<name>.*``)."
    return cls


MethodConfig: Any = _method_config_class()


def chosen_section(method: dict[str, Any]) -> dict[str, Any]:
    """A ``method`` section (a nested dict) cut to its ``name`` and the chosen method's own section."""
    name = method.get("name", DEFAULT_METHOD)
    return {"name": name, **({name: method[name]} if name in method else {})}


_said_dropped = False


def drop_missing_sections(d: dict[str, Any], where: str) -> dict[str, Any]:
    """``d`` (a stored nested config dict) without the ``method.<name>`` sections of methods not installed here,
    said once per process (rank 0) naming ``where`` the config comes from. A mistyped key stays (an error)."""
    global _said_dropped
    method = d.get("method")
    if not isinstance(method, dict):
        return d
    known = set(method_names())
    gone = sorted(k for k, v in method.items() if k != "name" and isinstance(v, dict) and k not in known)
    if not gone:
        return d
    if not _said_dropped and os.environ.get("RANK", "0") == "0":
        _said_dropped = True
        name = method.get("name", DEFAULT_METHOD)
        print(
            f"note: {where} has sections of methods not installed here ({', '.join(f'method.{g}' for g in gone)}); "
            "they are left out"
            + (
                f", and method.name={name} itself is not installed: only its backbone can be used"
                if name in gone
                else ""
            ),
            file=sys.stderr,
            flush=True,
        )
    return {**d, "method": {k: v for k, v in method.items() if k not in gone}}
