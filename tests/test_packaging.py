"""The package as users install it: the wheel's contents, the light base install (``pip install hypersolid-scale``)
in a fresh virtual environment running the README's own-loop example, a missing extra named in one line, and the
[train] extra training with ``torchrun -m hypersolid_scale.train`` from the wheel, outside the checkout.

The environments are built once per session and shared: the base one (the wheel without extras; torch hard-linked
from this environment, tests/_venv.py), and the train one layered on it (a .pth file puts the base one's
site-packages on its path, so that pip adds only what [train] brings and the base one stays light).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from _venv import seed_pinned_torch
from packaging.requirements import Requirement

from hypersolid_scale.config.setups import resolve_config, setup_names
from hypersolid_scale.safety.errors import ConfigError
from hypersolid_scale.safety.extras import EXTRA_MODULES

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# The base install's imports (module: distribution), and the extras hypersolid_scale/safety/extras.py does not list.
BASE_MODULES = {"torch": "torch", "torchvision": "torchvision", "numpy": "numpy", "PIL": "pillow", "lightly": "lightly"}
OTHER_EXTRAS = {"ffcv": "ffcv", "numba": "ffcv", "deepspeed": "deepspeed", "fsspec": "remote"}
# Modules of the extras that the base install must not bring (lightly brings omegaconf, yaml and tqdm).
NOT_IN_BASE = ("mlflow", "faiss", "hdbscan", "sklearn", "scipy", "matplotlib", "kornia", "webdataset", "timm")
CLEAN_ENV = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", Requirement(requirement).name).lower()


def _extra_names(extra: str) -> set[str]:
    """The distributions of an extra, its hypersolid-scale[...] references expanded."""
    out: set[str] = set()
    for req in PYPROJECT["project"]["optional-dependencies"][extra]:
        r = Requirement(req)
        if _name(req) == "hypersolid-scale":
            for sub in r.extras:
                out |= _extra_names(sub)
        else:
            out.add(_name(req))
    return out


# ------------------------------------------------------------------------------------ what is declared
def test_every_import_of_the_package_is_declared_in_the_base_or_an_extra() -> None:
    """A new third-party import must go into the base dependencies or an extra (and extras.py's table)."""
    known = {**BASE_MODULES, **OTHER_EXTRAS, **{m: d for mods in EXTRA_MODULES.values() for m, d in mods.items()}}
    undeclared: dict[str, str] = {}
    for path in (REPO / "hypersolid_scale").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for top in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"hypersolid_scale"}:
                if top not in known:
                    undeclared[top] = str(path.relative_to(REPO))
    assert not undeclared, f"imports in no dependency list (pyproject.toml, hypersolid_scale/safety/extras.py): {undeclared}"


def test_base_dependencies_and_extras_match_what_the_parts_import() -> None:
    base = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert base == set(BASE_MODULES.values()), base
    for extra, modules in EXTRA_MODULES.items():
        assert _extra_names(extra) == set(modules.values()), (extra, _extra_names(extra) ^ set(modules.values()))
    # `make` installs [all], and [all] holds every other extra.
    everything = set(PYPROJECT["project"]["optional-dependencies"]) - {"all", "gpu"}
    assert {e for r in PYPROJECT["project"]["optional-dependencies"]["all"] for e in Requirement(r).extras} == everything
    assert '-e ".[all]"' in (REPO / "Makefile").read_text()


# ------------------------------------------------------------------------------------ the paper's setups
def test_a_setup_name_resolves_to_its_yaml_and_a_path_stays_a_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # not the checkout: names must not depend on the working directory
    assert Path(resolve_config("quickstart")).read_bytes() == (REPO / "configs" / "quickstart.yaml").read_bytes()
    assert Path(resolve_config("configs/cifar100.yaml")).read_bytes() == (REPO / "configs/cifar100.yaml").read_bytes()
    assert Path(resolve_config("baselines/simclr_cifar10")).name == "simclr_cifar10.yaml"
    own = tmp_path / "quickstart"  # a file of that name in the working directory wins over the setup
    own.write_text("seed: 1\n")
    assert resolve_config("quickstart") == "quickstart"
    with pytest.raises(ConfigError) as err:
        resolve_config("no_such_setup")
    assert "\n" not in str(err.value) and "quickstart" in str(err.value), err.value
    assert setup_names()[0] != "ablations/" and "quickstart" in setup_names()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (an in-tree build/ could hold files deleted since)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("hypersolid_scale", "configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(src)], check=True, timeout=300)
    return next(out.glob("hypersolid_scale-*.whl"))


def test_the_wheel_carries_the_setups_byte_for_byte_and_every_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        packaged = {n.removeprefix("hypersolid_scale/configs/"): z.read(n) for n in names
                    if n.startswith("hypersolid_scale/configs/")}
    configs = {str(p.relative_to(REPO / "configs")): p.read_bytes() for p in (REPO / "configs").rglob("*.yaml")}
    assert len(configs) > 10 and packaged == configs
    modules = {str(p.relative_to(REPO)) for p in (REPO / "hypersolid_scale").rglob("*.py")}
    assert modules <= names, sorted(modules - names)[:5]
    assert not [n for n in names if n.startswith(("tests/", "launch/", "benchmarks/"))]


# ------------------------------------------------------------------------------------ installed
def _venv(path: Path) -> Path:
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(path)],
                   check=True, timeout=120)
    return next(path.glob("lib/python*/site-packages"))


def _pip(python: Path, *args: str) -> None:
    # This environment's pip, run for the new one (--python): a venv made --without-pip installs in seconds.
    out = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-compile",
                          *args], env=CLEAN_ENV, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-4000:]


def _run(python: Path, *args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**CLEAN_ENV, "OMP_NUM_THREADS": "1"}
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def base_python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """``pip install hypersolid-scale`` (no extras) in a fresh environment; torch hard-linked from this one."""
    root = tmp_path_factory.mktemp("base") / "venv"
    seed_pinned_torch(_venv(root))
    _pip(root / "bin" / "python", str(wheel))
    yield root / "bin" / "python"
    shutil.rmtree(root, ignore_errors=True)  # gigabytes (hard links, mostly); pytest would keep it otherwise


@pytest.fixture(scope="session")
def train_python(wheel: Path, base_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """hypersolid-scale[train], layered on the base environment (which stays as it was)."""
    root = tmp_path_factory.mktemp("train") / "venv"
    base_site = _run(base_python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=root.parent)
    (_venv(root) / "base.pth").write_text(base_site.stdout.strip() + "\n")
    _pip(root / "bin" / "python", f"{wheel}[train]")
    yield root / "bin" / "python"
    shutil.rmtree(root, ignore_errors=True)


def _readme_block(marker: str) -> str:
    from test_export import readme_block

    return readme_block(marker)


@pytest.mark.slow
def test_the_base_install_runs_the_readme_loss_loop_and_names_a_missing_extra(base_python: Path, tmp_path: Path):
    code = _readme_block("loss-loop") + "\nassert torch.isfinite(loss), loss\nprint('loss', float(loss))\n"
    out = _run(base_python, "-c", code, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("loss "), out.stderr[-3000:]
    where = _run(base_python, "-c", "import hypersolid_scale, hypersolid_scale.methods, hypersolid_scale.models; "
                 "print(hypersolid_scale.__file__)", cwd=tmp_path)
    assert where.returncode == 0 and str(base_python.parents[1]) in where.stdout, where.stdout + where.stderr
    present = _run(base_python, "-c", f"import importlib.util as u; print([m for m in {NOT_IN_BASE!r} if u.find_spec(m)])",
                   cwd=tmp_path)
    assert present.stdout.strip() == "[]", f"the base install brings extras' modules: {present.stdout}"
    # Importing a part whose extra is missing: the last line names the extra.
    ev = _run(base_python, "-c", "import hypersolid_scale.eval", cwd=tmp_path)
    last = ev.stderr.strip().splitlines()[-1]
    assert ev.returncode == 1 and last.startswith("hypersolid_scale.safety.extras.MissingExtra: "), ev.stderr[-2000:]
    assert "[eval] extra" in last and "pip install 'hypersolid-scale[eval]'" in last, last
    # A model of the base install that needs one module of an extra (the ViT backbone: timm): one line, too.
    vit = _run(base_python, "-c", "from hypersolid_scale.models import ModelConfig, ViTOptions, build_backbone; "
               "build_backbone(ModelConfig(arch='vit_tiny', vit_tiny=ViTOptions(img_size=32, patch_size=16)))", cwd=tmp_path)
    last = vit.stderr.strip().splitlines()[-1]
    assert vit.returncode == 1 and last.startswith("hypersolid_scale.safety.extras.MissingExtra: "), vit.stderr[-2000:]
    assert "vit_tiny" in last and "needs timm, from the [eval] extra" in last, last
    # The training entry: exactly one error line, exit 2.
    tr = _run(base_python, "-m", "hypersolid_scale.train", "--config", "quickstart", cwd=tmp_path)
    assert tr.returncode == 2 and tr.stderr.count("\n") == 1 and "[train] extra" in tr.stderr, tr.stderr[-2000:]


def _readme_commands(tmp_path: Path) -> dict[str, list[str]]:
    """The README's install block's torchrun / python -m lines, by module, with runs/ under tmp_path."""
    out = {}
    for line in _readme_block("install").splitlines():
        words = shlex.split(line.split("#")[0].replace("runs/", f"{tmp_path}/runs/"))
        if words and words[0] in ("torchrun", "python") and "-m" in words:
            module = words[words.index("-m") + 1]
            out[module] = (["-m", "torch.distributed.run"] if words[0] == "torchrun" else []) + words[1:]
    assert set(out) == {"hypersolid_scale.train", "hypersolid_scale.eval", "hypersolid_scale.export"}, out
    return out


@pytest.mark.slow
def test_the_train_extra_runs_the_readme_commands_from_the_wheel_outside_the_checkout(
    train_python: Path, tmp_path: Path
) -> None:
    """The README's `torchrun -m hypersolid_scale.train --config quickstart` (a packaged setup, by name; a
    2-step run), then its `python -m hypersolid_scale.eval` and `.export` lines on that checkpoint (step 2, not
    600; the kNN suite on a few hundred images), in an empty working directory."""
    cmds = {m: [a.replace("step_00000600", "step_00000002") for a in c] for m, c in _readme_commands(tmp_path).items()}
    run = tmp_path / "runs" / "quickstart"
    train = _run(train_python, *cmds["hypersolid_scale.train"], f"run_dir={run}", "max_steps=2",
                 "data.global_batch_size=16", "checkpoint.every_n_steps=2", "eval.every_n_epochs=0", cwd=tmp_path)
    assert train.returncode == 0, train.stderr[-3000:]
    ckpt = run / "checkpoints" / "step_00000002.pt"
    assert ckpt.is_file(), sorted(p.name for p in run.rglob("*"))
    ev = _run(train_python, *cmds["hypersolid_scale.eval"], "--suite", "knn", "--output-dir", str(tmp_path / "eval"),
              "eval.max_train_samples=500", "eval.max_test_samples=200", cwd=tmp_path)
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert list((tmp_path / "eval").glob("*.json")), sorted(p.name for p in (tmp_path / "eval").rglob("*"))
    ex = _run(train_python, *cmds["hypersolid_scale.export"], cwd=tmp_path)
    assert ex.returncode == 0 and (run / "export" / "backbone.safetensors").is_file(), ex.stderr[-3000:]
    # The run used the installed package, not this checkout.
    assert not [p for p in tmp_path.iterdir() if p.name in ("configs", "hypersolid_scale")]
