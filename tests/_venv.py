"""A fresh virtual environment with this environment's pinned torch in it, for the tests that install the
package the way users do (tests/test_docker.py: the image's install script; tests/test_packaging.py: the wheel)."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
from pathlib import Path

from packaging.requirements import Requirement


def _requirement_closure(names: list[str]) -> list[md.Distribution]:
    """Installed distributions of `names` and everything they require (on this platform), extras included:
    torch asks for `cuda-toolkit[cublas,cudart,...]`, whose CUDA libraries are requirements only under those
    extras; missing them would leave pip gigabytes of wheels to unpack into the new environment."""
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo: list[tuple[str, str]] = [(name, "") for name in names]
    while todo:
        name, extra = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if (key, extra) in done:
            continue
        done.add((key, extra))
        try:
            dist = seen.get(key) or md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional or other-platform requirement
        seen[key] = dist
        for req in dist.requires or []:
            r = Requirement(req)
            if r.marker is None or r.marker.evaluate({"extra": extra}):
                todo += [(r.name, e) for e in ("", *sorted(r.extras))]
    return list(seen.values())


def seed_pinned_torch(site_packages: Path) -> None:
    """Hard-link this environment's torch/torchvision (the pinned versions) and their requirements into a new
    environment: the several-GB CUDA wheels then need no download or unpacking, and pip sees them as
    already installed there. Everything else the script installs comes from the package index."""
    for dist in _requirement_closure(["torch", "torchvision"]):
        root = Path(dist.locate_file(""))
        for f in dist.files or []:
            src = root / f
            dst = (site_packages / f).resolve()
            if not src.is_file() or site_packages.resolve() not in dst.parents:
                continue  # console scripts outside site-packages are not needed
            dst.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copy2(src, dst)
