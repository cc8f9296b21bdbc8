"""Config sections that belong to registered plugins: ``method.<name>`` (a method's options) and
``data.<format>`` (a file format's), one per registered entry, read only for the chosen one.

One helper for every such section:
* :func:`sectioned_class`: the section's dataclass, its own fields and one sub-section per registered plugin;
* :func:`chosen_only`: what a checkpoint stores, the section cut to the chosen plugin's own sub-section, so that
  removing or renaming another plugin leaves the checkpoint readable;
* :func:`drop_missing`: a stored config (a checkpoint's, an earlier version's) without the sub-sections of
  plugins not installed here, said once per section and process (rank 0), naming where the config comes from.
  A mistyped scalar key stays, and fails as an unknown key.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any

_said: set[str] = set()  # the sections whose dropped sub-sections this process has already reported


def sectioned_class(
    name: str,
    module: str,
    own: list[tuple[str, type, Any]],
    plugins: Mapping[str, type],
    *,
    base: type | None = None,
    namespace: dict[str, Any] | None = None,
    doc: str | None = None,
) -> type:
    """A dataclass ``name`` (defined in ``module``: picklable, and named where it is) with the fields ``own``
    ((name, type, default), in order), then one field per entry of ``plugins`` (plugin name -> its options
    dataclass, defaulting to its defaults); methods from ``base`` or ``namespace``. Built from a registry when its
    module is imported, so that a new plugin's keys need no edit of the section's module."""
    fields: list[Any] = [(n, kind, dataclasses.field(default=default)) for n, kind, default in own]
    fields += [(n, options, dataclasses.field(default_factory=options)) for n, options in plugins.items()]
    cls = dataclasses.make_dataclass(name, fields, bases=(base,) if base else (), namespace=namespace)
    cls.__module__ = module
    cls.__doc__ = doc if doc is not None else (base.__doc__ if base is not None else None)
    return cls


def chosen_only(section: dict[str, Any], chooser: str, default: str, plugins: Collection[str]) -> dict[str, Any]:
    """``section`` (a nested dict) without the sub-sections of the plugins in ``plugins`` other than the one
    ``section[chooser]`` names (``default`` when unset); its other keys stay."""
    chosen = section.get(chooser, default)
    return {k: v for k, v in section.items() if k == chosen or k not in plugins}


def drop_missing(
    d: dict[str, Any],
    where: str,
    name: str,
    kind: str,
    known: Collection[str],
    also: Callable[[dict[str, Any], list[str]], str] = lambda section, gone: "",
    shown: str = "",
) -> dict[str, Any]:
    """``d`` (a stored nested config, or a section of one) without the dict-valued keys of its section ``name``
    that are not in ``known`` (sub-sections of ``kind`` not installed here); the note names them (as
    ``<shown><name>.<key>``), ``where`` the config came from, and ends with ``also(section, gone)``."""
    section = d.get(name)
    if not isinstance(section, dict):
        return d
    gone = sorted(k for k, v in section.items() if isinstance(v, dict) and k not in known)
    if not gone:
        return d
    if shown + name not in _said and os.environ.get("RANK", "0") == "0":
        _said.add(shown + name)
        names = ", ".join(f"{shown}{name}.{g}" for g in gone)
        note = f"note: {where} has sections of {kind} not installed here ({names}); they are left out"
        print(note + also(section, gone), file=sys.stderr, flush=True)
    return {**d, name: {k: v for k, v in section.items() if k not in gone}}
