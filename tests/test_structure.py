"""The package's shape: layers import only downwards, files stay small, every import is a declared dependency.

The layer map is the one docs/design.md §6 describes; a module may import its own layer or lower ones, so
that e.g. the evaluation library never depends on the trainer and the tracker never on the config.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import networkx as nx
import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "hypersolid_scale"

# Low -> high. Names are the package's top-level modules and subpackages, or a dotted module inside a
# package where that module sits in another layer than its package (the longest name that matches counts).
LAYERS: list[set[str]] = [
    {"safety", "config.nested", "config.registry", "config.sections", "checkpoint.config"},
    {"distributed", "training.optim"},
    {"models", "losses", "data", "methods"},
    {"eval", "tracking"},
    {"config"},
    {"checkpoint"},
    {"training", "train", "export"},
    {"eval.app", "eval.__main__", "eval.source", "eval.mlflow_log"},
    {"study", "compare"},
]
MAX_LINES = 400


def _component(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _module(path: Path) -> str:
    """training/optim.py -> "training.optim"; a package's __init__.py is the package."""
    parts = list(path.relative_to(PKG).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> int:
    """The layer of the longest LAYERS name that is ``module`` or a package holding it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        for i, names in enumerate(LAYERS):
            if ".".join(parts[:n]) in names:
                return i
    raise AssertionError(f"hypersolid_scale.{module} is in no layer: add it to LAYERS in {__file__} "
                         "and to docs/design.md's layer map")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, including those inside functions."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # from hypersolid_scale.training import optim: the submodule, not its package's layer
            folder = ROOT.joinpath(*node.module.split("."))
            subs = [a.name for a in node.names if node.module.split(".")[0] == "hypersolid_scale"
                    and ((folder / f"{a.name}.py").exists() or (folder / a.name / "__init__.py").exists())]
            if len(subs) < len(node.names):
                out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{name}") for name in subs]
    return out


def _package_files() -> list[Path]:
    # The package's own __init__ only documents it (checked: it imports nothing of the package).
    return sorted(p for p in PKG.rglob("*.py") if "__pycache__" not in p.parts and p != PKG / "__init__.py")


def test_no_module_imports_a_layer_above_it():
    bad = []
    for path in _package_files():
        mine = _layer(_module(path))
        for line, mod in _imports(path):
            if not mod.startswith("hypersolid_scale.") or mod == "hypersolid_scale":
                continue
            other = mod.removeprefix("hypersolid_scale.")
            if _layer(other) > mine:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod} (layer {_layer(other)} > {mine})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_layer_check_catches_an_upward_import(tmp_path):
    # The check above must be able to fail: an eval module importing the trainer is an upward import.
    fake = PKG / "eval" / "_probe_upward.py"
    fake.write_text("from hypersolid_scale.training.trainer import main\n")
    try:
        with pytest.raises(AssertionError, match="_probe_upward"):
            test_no_module_imports_a_layer_above_it()
    finally:
        fake.unlink()


def _runtime_imports(path: Path) -> set[str]:
    """The package modules ``path`` imports when it runs: `_imports` (inside functions too) less the imports under
    ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {n.lineno for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in
                   ast.unparse(node.test) for stmt in node.body for n in ast.walk(stmt) if hasattr(n, "lineno")}
    return {mod.removeprefix("hypersolid_scale.") for line, mod in _imports(path)
            if line not in typing_only and mod.startswith("hypersolid_scale.")}


def _import_circles(files: list[Path]) -> list[list[str]]:
    """Groups of modules that import each other, directly or through others (the graph's strongly connected
    components, as networkx finds them)."""
    graph = nx.DiGraph()
    for f in files:
        graph.add_edges_from((_module(f), dep) for dep in _runtime_imports(f) - {_module(f)})
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_circle():
    """No module imports one that imports it back, directly or through others, counting imports inside
    functions: a circle works only while its imports stay in a lucky order or inside functions."""
    circles = _import_circles(_package_files())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_the_circle_check_catches_a_circle(tmp_path, monkeypatch):
    # Two modules importing each other, one of them only inside a function, form a circle; a TYPE_CHECKING
    # import does not.
    pkg = tmp_path / "hypersolid_scale"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from hypersolid_scale.a.y import f\n")
    (pkg / "a" / "y.py").write_text("def f():\n    from hypersolid_scale.a import x\n")
    (pkg / "a" / "z.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from hypersolid_scale.a import x\n")
    (pkg / "a" / "w.py").write_text("from hypersolid_scale.a import z\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)  # `_imports` tells submodules from names there
    files = sorted(p for p in pkg.rglob("*.py"))
    assert _import_circles(files) == [["a.x", "a.y"]]


def test_a_format_s_files_are_imported_by_it_alone():
    """A format's own files (data/formats/<name>/ or <name>.py) are imported by that format only: the package
    reaches a format through the registry (data.formats), so removing a format's folder breaks nothing else."""
    bad = []
    for path in _package_files():
        here = _module(path)
        own = here.split(".")[2] if here.startswith("data.formats.") else None
        for line, mod in _imports(path):
            parts = mod.split(".")
            if parts[:3] == ["hypersolid_scale", "data", "formats"] and len(parts) > 3 and parts[3] != own:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {mod}")
    assert not bad, "a format's own module imported from outside it: " + "; ".join(bad)


def test_torch_distributed_only_under_distributed():
    bad = [f"{p.relative_to(ROOT)}:{line}" for p in _package_files() if _component(p) != "distributed"
           for line, mod in _imports(p) if mod.startswith("torch.distributed")]
    assert not bad, "torch.distributed imported outside hypersolid_scale/distributed/: " + ", ".join(bad)


@pytest.mark.parametrize("folder", ["hypersolid_scale", "launch", "benchmarks"])
def test_files_stay_under_the_line_limit(folder):
    long = [f"{p.relative_to(ROOT)}: {n}" for p in sorted((ROOT / folder).rglob("*.py"))
            if "__pycache__" not in p.parts and (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, f"files over {MAX_LINES} lines (split them by concept): " + ", ".join(long)


def _declared() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + [r for group in meta["optional-dependencies"].values() for r in group]
    names = {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in reqs}
    return {n.lower().replace("_", "-") for n in names}


def test_every_third_party_import_is_declared():
    dists = md.packages_distributions()
    # Modules a distribution other than their importable name provides, for packages not installed here.
    known = {"faiss": ["faiss-cpu", "faiss-gpu"]}
    probed = {"s3fs"}  # imported only to check the message a user gets while it is missing
    declared = _declared()
    missing = set()
    for folder in ("hypersolid_scale", "launch", "benchmarks", "tests"):
        # A folder's modules import each other (benchmarks/replication/run.py imports its plan.py), and the tests
        # import the benchmark scripts they check.
        trees = [ROOT / folder, *([ROOT / "benchmarks"] if folder == "tests" else [])]
        own = {folder} | {p.stem for t in trees for p in t.rglob("*.py")}
        own |= {p.parent.name for t in trees for p in t.rglob("*.py")}  # script folders: benchmarks/replication
        for path in sorted((ROOT / folder).rglob("*.py")):
            for _line, mod in _imports(path):
                top = mod.split(".")[0]
                if (top in sys.stdlib_module_names or top in ("hypersolid_scale", "__future__") or top in own
                        or top in probed):
                    continue
                owners = known.get(top) or dists.get(top)
                if owners is None:
                    missing.add(f"{top} (imported by {path.relative_to(ROOT)}; no installed distribution)")
                elif not {o.lower().replace("_", "-") for o in owners} & declared:
                    missing.add(f"{top} from {owners} (imported by {path.relative_to(ROOT)})")
    assert not missing, "imports not declared in pyproject.toml: " + "; ".join(sorted(missing))


def _top_level_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _broken_test_imports(tests_dir: Path) -> list[str]:
    """``from <tests module> import name`` (also inside functions) where that module defines no ``name``."""
    local = {p.stem: p for p in tests_dir.glob("*.py")}
    broken = []
    for path in sorted(tests_dir.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in local:
                defined = _top_level_names(local[node.module])
                broken += [f"{path.name}:{node.lineno} imports {a.name} from {node.module}, which has none"
                           for a in node.names if a.name not in defined]
    return broken


def test_tests_import_only_names_their_helpers_define():
    """A helper moved between test modules must not leave an import behind (it fails only when that
    test runs, which may be a slow one)."""
    broken = _broken_test_imports(ROOT / "tests")
    assert not broken, "; ".join(broken)


def test_the_test_import_check_catches_a_missing_name(tmp_path):
    (tmp_path / "helpers.py").write_text("def present():\n    pass\n")
    (tmp_path / "test_x.py").write_text("def test_y():\n    from helpers import present, gone\n")
    assert _broken_test_imports(tmp_path) == ["test_x.py:2 imports gone from helpers, which has none"]


# Command-line entries that a launcher runs by module name, which live at the root for that name's sake.
ENTRY_MODULES = {"train.py": "torchrun -m hypersolid_scale.train (the trainer's body is in training/)"}


def test_the_package_root_holds_only_packages():
    """Folder names tell the architecture: every module lives in a package named for its part."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", *ENTRY_MODULES))
    assert not loose, f"modules loose in {PKG.relative_to(ROOT)}/ (move them into a package): " + ", ".join(loose)


def _repeated_file_names(folder: Path) -> list[str]:
    """File names that stand more than once under ``folder`` (``__init__.py`` and ``__main__.py`` excepted)."""
    seen: dict[str, list[str]] = {}
    for p in sorted(folder.rglob("*.py")):
        if "__pycache__" not in p.parts and p.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(p.name, []).append(str(p.relative_to(folder)))
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(seen.items()) if len(paths) > 1]


def test_no_file_name_repeats_in_data():
    """One name, one file: a format's files live in its folder under data/formats/ (its registry entry is the
    folder's __init__.py) under names of their own. (Package-wide, config.py, app.py and others repeat by
    design: one per package; data/ is where a repeated name was ambiguous.)"""
    repeated = _repeated_file_names(PKG / "data")
    assert not repeated, "file names that repeat under hypersolid_scale/data/ (rename one): " + "; ".join(repeated)


def test_the_file_name_check_catches_a_repeat(tmp_path):
    for rel in ("a/x.py", "b/x.py", "a/__init__.py", "b/__init__.py", "c/__main__.py", "__main__.py", "a/y.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    assert _repeated_file_names(tmp_path) == ["x.py: a/x.py, b/x.py"]


def test_a_training_or_evaluation_start_imports_no_clustering_library():
    """``hypersolid_scale.eval`` resolves its names on first use: the config schema reaches it for
    ``EvalConfig``, and a training that never clusters must not pay scikit-learn's, SciPy's and HDBSCAN's
    import (~1 s a start). Nor does the evaluation's start (a kNN-only evaluation never needs them): the
    clustering suite, the protocol and the plots import them when they run. Every name the package exports
    still resolves to its defining module's object."""
    code = (
        "import importlib, sys\n"
        "import hypersolid_scale.training.trainer\n"
        "from hypersolid_scale.config.schema import load_config\n"
        "load_config('configs/quickstart.yaml')\n"
        "print(*sorted(m for m in ('sklearn', 'scipy', 'hdbscan') if m in sys.modules))\n"
        "import hypersolid_scale.eval.app\n"
        "print(*sorted(m for m in ('sklearn', 'hdbscan', 'matplotlib') if m in sys.modules))\n"
        "import hypersolid_scale.eval as E\n"
        "for name in E.__all__:\n"
        "    assert getattr(E, name) is getattr(importlib.import_module(E.__name__ + '.' + E._SOURCES[name]), name)\n"
        "print(sorted(E.__all__) == sorted(E._SOURCES), 'sklearn' in sys.modules)\n"
    )
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["", "", "True True"], proc.stdout
