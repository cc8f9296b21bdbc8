"""Things chosen by name in the config (methods, backbones, loss backends, data formats, engines): one registry per
kind, filled by the modules of the package that owns the kind.

Every module of that package (except those named in ``skip`` and those whose name starts with ``_``) is
imported on the first look-up, and registers its entries as it is imported; an entry registered at run time
(a test, a user's script) joins them. So a new method, backbone, backend or format is one new module in its
package and nothing else (docs/design.md §7).

One rule for all kinds:

* order: :meth:`Registry.names` sorts by the entry's ``order`` attribute (default 100, so the default of a
  kind, with a lower ``order``, comes first), then by name;
* errors: an unknown name, an empty or badly formed name, or a name registered twice raise
  :class:`RegistryError` (a ``ConfigError``, hence a ``ValueError``) naming the known names and the fix;
* ``unregister`` removes an entry (one registered at run time, typically by a test).

This module sits in the lowest layer, below the config tree that holds it (docs/design.md §6): it imports only
the error classes, and the packages it discovers are named by a string.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Callable, Collection
from typing import Generic, TypeVar

from hypersolid_scale.safety.errors import ConfigError

T = TypeVar("T")
DEFAULT_ORDER = 100


class RegistryError(ConfigError):
    """An unknown name, or a name that cannot be registered."""


class Registry(Generic[T]):
    """The entries of one kind, by name, discovered from the modules of ``package``.

    Args:
        kind: what an entry is, in messages ("method", "backbone").
        key: the config key that names an entry ("method.name"), in messages.
        package: the dotted package whose modules define the entries.
        skip: modules of ``package`` that define no entry (helpers, the registry's own users).
        identifier: names must be Python identifiers (they become config keys, e.g. ``method.<name>.*``).
        documented_by: what an entry is defined by, for its module (default: the entry, or its class).
    """

    def __init__(
        self,
        kind: str,
        key: str,
        package: str,
        *,
        skip: Collection[str] = (),
        identifier: bool = False,
        documented_by: Callable[[T], object] | None = None,
    ) -> None:
        self.kind, self.key, self.package = kind, key, package
        self.skip = frozenset(skip)
        self.identifier = identifier
        self.documented_by = documented_by
        self._entries: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str, entry: T) -> T:
        """Make ``entry`` the one named ``name`` (a name is registered once) and return it. The package's
        modules are discovered first, so an entry registered at run time cannot take a name one of them uses."""
        self.discover()
        if not name or (self.identifier and not name.isidentifier()):
            need = "a Python identifier (it is a config key)" if self.identifier else "a non-empty name"
            raise RegistryError(f"{self.kind} name {name!r} ({_describe(entry)}) is not {need}; rename it")
        if name in self._entries:
            raise RegistryError(
                f"two {self.kind}s are named {name!r}: {_describe(self._entries[name])} and {_describe(entry)} "
                "(registered twice); rename one"
            )
        self._entries[name] = entry
        return entry

    def unregister(self, name: str) -> T | None:
        """Remove ``name`` and return its entry (None when it was not registered)."""
        return self._entries.pop(name, None)

    def discover(self) -> None:
        """Import every module of the package once, so that each registers its entries."""
        if self._discovered:
            return
        self._discovered = True  # first: the modules imported below may look the registry up while they register
        try:
            package = importlib.import_module(self.package)
            for info in pkgutil.iter_modules(package.__path__):
                if info.name not in self.skip and not info.name.startswith("_"):
                    importlib.import_module(f"{self.package}.{info.name}")
        except BaseException:
            self._discovered = False  # a failed import is raised again at the next look-up, not hidden
            raise

    def names(self) -> tuple[str, ...]:
        """Every registered name, by ``order`` (the entry's attribute; default 100), then by name."""
        self.discover()
        return tuple(sorted(self._entries, key=lambda n: (getattr(self._entries[n], "order", DEFAULT_ORDER), n)))

    def get(self, name: str) -> T:
        """The entry named ``name``; a RegistryError naming the known ones and how to add one otherwise."""
        self.discover()
        if name not in self._entries:
            where = self.package.replace(".", "/")
            raise RegistryError(
                f"{self.key}={name!r} is not a known {self.kind}; choose one of: {' | '.join(self.names())} "
                f"(a new {self.kind} is a module in {where}/)"
            )
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        self.discover()
        return name in self._entries

    def print_names(self, argv: list[str] | None = None) -> int:
        """``python -m <package> [--list]``: print the registered names, one a line, each with the first sentence
        of the docstring of the module that defines it (the entry point of each kind's ``__main__``)."""
        args = sys.argv[1:] if argv is None else argv
        if args not in ([], ["--list"]):
            print(f"usage: python -m {self.package} [--list]   (lists the {self.kind}s {self.key} can name)")
            return 2
        for name in self.names():
            entry = self._entries[name]
            source = entry if self.documented_by is None else self.documented_by(entry)
            module = sys.modules.get(getattr(source, "__module__", None) or type(source).__module__)
            print(f"{name:<14} {_first_sentence(getattr(module, '__doc__', None))}".rstrip())
        return 0


def _first_sentence(doc: str | None) -> str:
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    return paragraph.split(". ")[0].removesuffix(".")


def _describe(entry: object) -> str:
    """``module.Qualname`` of a class or function, the repr of anything else."""
    if hasattr(entry, "__qualname__"):
        return f"{getattr(entry, '__module__', '?')}.{entry.__qualname__}"
    return repr(entry)[:160]
