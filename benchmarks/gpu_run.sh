#!/usr/bin/env bash
# The one command for the GPU machine (no network): `bash benchmarks/gpu_run.sh`, with .whl/ carried along
# (fill it first, here: bash benchmarks/gpu_wheels.sh). Installs the wheels into /tmp/site, runs the suite
# under `timeout $SUITE_TIMEOUT_S` (default 480: a 10-minute device call with room for the install) into
# $OUT/gpu, then leaves at most 8 files in $OUT: gpu_suite.log, summary.json (every part's numbers),
# gpu_results.tar.gz (the whole results folder) and the PNGs.
#     OUT=/tmp/out GPU_SUITE_ARGS="--device cpu --quick" bash benchmarks/gpu_run.sh     # a dry run on a CPU
set -u
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/gpu_out}
SITE=${SITE:-/tmp/site}
ARGS=${GPU_SUITE_ARGS:---device cuda}
PY=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
SUITE_TIMEOUT_S=${SUITE_TIMEOUT_S:-480}
mkdir -p "$OUT"
{
  echo "== $(date -u +%FT%TZ) $(hostname); python: $(command -v "$PY")"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl \
      2>&1 | grep -v "^WARNING: Target directory" || true
  else
    echo "skipped: no wheels in .whl/ (run benchmarks/gpu_wheels.sh and carry .whl)"
  fi
  export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
  "$PY" - <<'PY'
import importlib
for name in ("torch", "omegaconf", "kornia", "lightly", "webdataset", "faiss", "deepspeed", "mlflow", "ffcv"):
    try:
        mod = importlib.import_module(name)
        print(f"import {name:10s} {getattr(mod, '__version__', '?'):12s} {mod.__file__}")
    except Exception as err:
        print(f"import {name:10s} skipped: {type(err).__name__}: {err}")
PY
  # shellcheck disable=SC2086  # ARGS is a list of words
  PYTHON="$PY" timeout --kill-after=15 "$SUITE_TIMEOUT_S" bash benchmarks/gpu_suite.sh $ARGS --out "$OUT/gpu"
  echo "== suite exit code $? at $(date -u +%FT%TZ)"
} 2>&1 | tee "$OUT/gpu_suite.log"
tar -czf "$OUT/gpu_results.tar.gz" -C "$OUT" gpu 2>/dev/null || echo "no results folder to pack" | tee -a "$OUT/gpu_suite.log"
[ -f "$OUT/gpu/summary.json" ] && cp "$OUT/gpu/summary.json" "$OUT/summary.json"
for png in "$OUT"/gpu/*.png; do [ -f "$png" ] && cp "$png" "$OUT/"; done
rm -rf "$OUT/gpu"  # its files are in the tarball; the device hands back at most 8 files
ls -l "$OUT"
