#!/usr/bin/env bash
# Installs hypersolid_scale and its pinned stack into the active Python environment.
# The Dockerfiles run exactly this (so that a plain venv can check the image's install steps without a
# Docker engine): docker/install.sh cpu|gpu [REPO_DIR]
#
#   cpu: torch/torchvision (CPU wheels when TORCH_INDEX_URL points at a CPU index), faiss-cpu, DeepSpeed
#        (pure Python, ops built on first use), the package with its dev extra.
#   gpu: torch/torchvision with CUDA, faiss-gpu instead of faiss-cpu (both ship the `faiss` module, so
#        faiss-cpu is removed first), FFCV (compiled against the system's OpenCV and libjpeg-turbo, which the
#        GPU Dockerfile installs), DeepSpeed, the package with all extras.
#
# Environment: TORCH_INDEX_URL  extra pip index for torch/torchvision (its +cpu/+cuXXX builds outrank the
#                               default index's for the same version); empty: the default index only
#              TORCH_WHEELS     a folder of wheels holding torch/torchvision and their requirements: they are
#                               installed from it alone (--no-index; docker/build_cpu_image.sh mounts one)
#              PIP_CERT         the CA bundle pip trusts; empty: pip's own
#              HS_EDITABLE=1    editable install of the package (for development images and checks)
#              HS_WHEELHOUSE    a folder: after the install, a wheel of the package and of every requirement pip
#                               had to build from source is written there (a build stage's output)
#              HS_TORCH_ONLY=1  stop after torch/torchvision (an image's layer of its own: the largest one)
#              HS_TORCH_REQUIRES=REGEX  install only those requirements of the pinned torch whose names match
#                               (e.g. '^nvidia-'), then stop: an image installs torch's CUDA libraries in
#                               layers of their own, so that no one layer commits gigabytes at once
#              HS_FIND_LINKS    a folder HS_WHEELHOUSE filled: install from wheels only (no compiler needed),
#                               the package from its wheel there (an image's final stage; REPO_DIR unused)
#              HS_PIP_COMPILE=0 skip compiling .pyc files (quick checks; images keep them for fast start-up)
set -euo pipefail

variant=${1:?usage: docker/install.sh cpu|gpu [REPO_DIR]}
repo=${2:-$(cd "$(dirname "$0")/.." && pwd)}
case $variant in
    cpu) extras="train,deepspeed,dev" ;;
    gpu) extras="all" ;;
    *) echo "error: variant must be cpu or gpu, got '$variant'" >&2; exit 2 ;;
esac
[[ -n ${HS_FIND_LINKS:-} || ${HS_TORCH_ONLY:-0} == 1 || -n ${HS_TORCH_REQUIRES:-} || -f $repo/pyproject.toml ]] || { echo "error: no pyproject.toml in $repo (pass the repository as 2nd argument)" >&2; exit 2; }
package=$repo  # what is installed: the checkout, or its wheel from the build stage
if [[ -n ${HS_FIND_LINKS:-} ]]; then
    package=$(compgen -G "$HS_FIND_LINKS/hypersolid_scale-*.whl" | head -n 1) \
        || { echo "error: no hypersolid_scale wheel in HS_FIND_LINKS=$HS_FIND_LINKS (docker/install.sh with HS_WHEELHOUSE makes one)" >&2; exit 2; }
fi

# Versions this project is tested with; pyproject.toml allows these as its upper bounds.
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
FAISS_GPU_VERSION=1.15.1

pip_opts=(--no-input --progress-bar off)
[[ ${HS_PIP_COMPILE:-1} != 0 ]] || pip_opts+=(--no-compile)
[[ -z ${HS_FIND_LINKS:-} ]] || pip_opts+=(--only-binary=:all: --find-links "$HS_FIND_LINKS")
pip_install() { python -m pip install "${pip_opts[@]}" "$@"; }
[[ -n ${PIP_CERT:-} ]] || unset PIP_CERT
torch_index=()
[[ -z ${TORCH_INDEX_URL:-} ]] || torch_index=(--extra-index-url "$TORCH_INDEX_URL")
[[ -z ${TORCH_WHEELS:-} ]] || torch_index=(--no-index --find-links "$TORCH_WHEELS")

echo ">> pip, wheel, setuptools"
pip_install --upgrade pip wheel setuptools
if [[ -n ${HS_TORCH_REQUIRES:-} ]]; then
    # torch's own metadata names its requirements (pip reads it without installing anything); those of an
    # extra are left out, and pip evaluates each one's platform marker.
    torch_report=$(mktemp)
    python -m pip install "${pip_opts[@]}" "${torch_index[@]}" --quiet --dry-run --no-deps --ignore-installed \
        --report "$torch_report" "torch==$TORCH_VERSION"
    mapfile -t requires < <(python - "$torch_report" "$HS_TORCH_REQUIRES" <<'PY'
import json
import re
import sys

metadata = json.load(open(sys.argv[1]))["install"][0]["metadata"]
for requirement in metadata.get("requires_dist", []):
    name = re.match(r"[A-Za-z0-9._-]+", requirement).group(0)
    if "extra ==" not in requirement and re.search(sys.argv[2], name):
        print(requirement)
PY
)
    rm -f "$torch_report"
    ((${#requires[@]})) || { echo "error: no requirement of torch $TORCH_VERSION matches HS_TORCH_REQUIRES=$HS_TORCH_REQUIRES" >&2; exit 2; }
    echo ">> torch $TORCH_VERSION's requirements: ${requires[*]}"
    pip_install "${torch_index[@]}" "${requires[@]}"
    exit 0
fi
# torch first and pinned, so that no later dependency resolves to another build.
echo ">> torch==$TORCH_VERSION torchvision==$TORCHVISION_VERSION"
pip_install "${torch_index[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
[[ ${HS_TORCH_ONLY:-0} != 1 ]] || exit 0
# FFCV and DeepSpeed are built without isolation: they need numpy/cython/torch from this environment.
pip_install numpy cython pkgconfig

echo ">> hypersolid_scale[$extras]"
editable=()
[[ ${HS_EDITABLE:-0} != 1 ]] || editable=(-e)
# The constraint keeps the pinned torch: a dependency asking for torch must not replace it.
constraints=$(mktemp)
report=$(mktemp)
trap 'rm -f "$constraints" "$report"' EXIT
printf 'torch==%s\ntorchvision==%s\n' "$TORCH_VERSION" "$TORCHVISION_VERSION" > "$constraints"
DS_BUILD_OPS=0 pip_install --no-build-isolation -c "$constraints" --report "$report" "${editable[@]}" \
    "${package}[${extras}]"

if [[ -n ${HS_WHEELHOUSE:-} ]]; then
    # pip's installation report says where each requirement came from: a source archive was built here, and
    # only those (and the package) need this stage's compilers; every other one stays a plain wheel download.
    mapfile -t from_source < <(python - "$report" <<'PY'
import json
import sys

for item in json.load(open(sys.argv[1]))["install"]:
    info = item["download_info"]
    if "archive_info" in info and not info["url"].endswith(".whl"):
        print(f"{item['metadata']['name']}=={item['metadata']['version']}")
PY
)
    echo ">> wheels into $HS_WHEELHOUSE: hypersolid_scale ${from_source[*]}"
    DS_BUILD_OPS=0 python -m pip wheel --no-input --progress-bar off --no-deps --no-build-isolation -w "$HS_WHEELHOUSE" \
        -c "$constraints" "$repo" "${from_source[@]}"
fi

if [[ $variant == gpu ]]; then
    echo ">> faiss-gpu==$FAISS_GPU_VERSION (replaces faiss-cpu)"
    python -m pip uninstall -y faiss-cpu
    pip_install -c "$constraints" "faiss-gpu==$FAISS_GPU_VERSION"
fi

# Fail the build here, not at the first training run.
python - "$TORCH_VERSION" <<'PY'
import sys

import deepspeed  # noqa: F401
import faiss
import torch
import torchvision

import hypersolid_scale
from hypersolid_scale.config.schema import load_config

want = sys.argv[1]
assert torch.__version__.split("+")[0] == want, f"torch {torch.__version__} installed, {want} expected"
load_config(None, [])
print(f"ok: hypersolid_scale {getattr(hypersolid_scale, '__version__', '?')}, torch {torch.__version__}, "
      f"torchvision {torchvision.__version__}, faiss {faiss.__version__}")
PY
