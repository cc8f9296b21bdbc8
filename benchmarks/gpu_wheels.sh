#!/usr/bin/env bash
# Fill .whl/ with the wheels the GPU machine lacks (it has no network; see benchmarks/gpu_run.sh).
#
#     bash benchmarks/gpu_wheels.sh            # run here, with network, from the repository root
#
# Versions are those of this project's venv. The GPU image already holds torch, numpy, timm, numba,
# pytorch-lightning, einops, msgpack, ninja, py-cpuinfo, nvidia-ml-py, psutil, packaging, pyyaml, tqdm,
# typing-extensions, matplotlib, scikit-learn, scipy, opencv, pillow: those are not carried.
# Not carried because they do not fit or are not needed: faiss-gpu (135 MB; faiss-cpu is carried),
# mlflow (the suite runs with tracking off), ffcv (needs system libraries), hydra-core (lightly's
# DINOTransform does not import it).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-.venv/bin/python}
DEST=${DEST:-.whl}
mkdir -p "$DEST"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude

binary() {  # wheels from the registry, for CPython 3.12 on x86-64 Linux
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST" "$@"
}

binary omegaconf==2.3.1 kornia==0.9.0 kornia_rs==0.2.0 lightly==1.6.0 webdataset==1.0.2 braceexpand==0.1.7 \
  hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
  faiss-cpu==1.15.1 hdbscan==0.8.44

# Published as source only: build pure-python wheels here. DeepSpeed without its CUDA ops (DS_BUILD_OPS=0):
# ZeRO-2 with torch's AdamW needs none of them; its setup imports torch, hence no build isolation.
"$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" deepspeed==0.19.8

ls -l "$DEST"
du -ch "$DEST"/*.whl | tail -1
