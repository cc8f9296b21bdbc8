"""Config sections that belong to registered plugins: ``method.<name>`` (a method's options) and
``data.<format>`` (a file format's), one per registered entry, read only for the chosen one.

One helper for every such section:
* :func:`chosen_only`: what a checkpoint stores, the section cut to the chosen plugin's own sub-section, so that
  removing or renaming another plugin leaves the checkpoint readable;
* :func:`drop_missing`: a stored config (a checkpoint's, an earlier version's) without the sub-sections of
  plugins not installed here, said once per section and process (rank 0), naming where the config comes from.
  A mistyped scalar key stays, and fails as an unknown key.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection
from typing import Any

_said: set[str] = set()  # the sections whose dropped sub-sections this process has already reported


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
