#!/usr/bin/env bash
# The replication study's gpu group: the one command for the lent GPU machine (no network), from the
# repository root, with .whl_replication/ and .fmnist/ carried (fill them here first:
# bash benchmarks/replication/gpu_carry.sh):
#     HYPERSOLID_GIT_COMMIT=<git rev-parse HEAD here> bash benchmarks/replication/gpu.sh
# (the variable names the commit sent: the machine's copy of the tree has no .git, or a stale one)
#     OUT=/tmp/x GPU_ARGS="--device cpu --quick" bash benchmarks/replication/gpu.sh     # a dry run on a CPU
# Installs the wheels into /tmp/site, runs run.py --group gpu under one 380 s deadline for the whole
# script (its --budget-s is what is left of it, at most 330 s), then leaves in $OUT: replication.log,
# replication.tar.gz (every run's JSON), replication/all.json (the same JSONs as one list) and
# replication/_skipped.json. One file per run would not come back: the device returns at most 8 files.
# Results also stay in benchmarks/results/replication/gpu, so a second call skips the runs that are done.
set -u
cd "$(dirname "$0")/../.." || exit 1
START=$(date +%s)
DEADLINE_S=${DEADLINE_S:-380}
OUT=${OUT:-/tmp/gpu_out}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl_replication}
ARGS=${GPU_ARGS:---device cuda}
PARALLEL=${PARALLEL:-12}  # 16 cores: 12 trainings/evaluations at once, 1 thread each, leave the rest to the driver
PY=${PYTHON:-python3}
[ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ] && PY=.venv/bin/python
RESULTS=benchmarks/results/replication
# A dry run's results stay out of the repository (and out of $OUT: only 8 files come back from there).
case " $ARGS " in *" --quick "*) RESULTS=/tmp/hs_replication/quick/results ;; esac
mkdir -p "$OUT/replication"

install_wheels() {  # the pattern of benchmarks/gpu_run.sh: the machine has no network, wheels travel in .whl/
  if ls "$WHEELS"/*.whl > /dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl 2>&1 | grep -v "^WARNING: Target directory" || true
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "no wheels in $WHEELS/: using the installed packages"
  fi
}

{
  echo "== $(date -u +%FT%TZ) $(hostname); python: $(command -v "$PY")"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  install_wheels
  # That machine has no Fashion-MNIST: unpack the copy gpu_carry.sh prepared (.fmnist/, carried) where the
  # builtin dataset looks for it.
  if ls .fmnist/*.xz > /dev/null 2>&1 && ! ls /usr/share/datasets/fashion-mnist/train-images* > /dev/null 2>&1; then
    mkdir -p /usr/share/datasets/fashion-mnist && "$PY" -c '
import glob, lzma, os
for f in glob.glob(".fmnist/*.xz"):
    with lzma.open(f) as src, open("/usr/share/datasets/fashion-mnist/" + os.path.basename(f)[:-3], "wb") as dst:
        dst.write(src.read())' && echo "Fashion-MNIST unpacked from .fmnist/"
  fi
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
  # What is left of the deadline, less 20 s to pack the results; the budget leaves 45 s more for the
  # trainings and evaluations already running when it is reached.
  LEFT=$(( DEADLINE_S - ($(date +%s) - START) - 20 ))
  BUDGET=$(( LEFT - 45 < 330 ? LEFT - 45 : 330 ))
  echo "== run.py: ${LEFT}s left, budget ${BUDGET}s"
  # shellcheck disable=SC2086  # ARGS is a list of words
  timeout --kill-after=10 "$LEFT" "$PY" -m benchmarks.replication.run --group gpu --parallel "$PARALLEL" \
    --budget-s "$BUDGET" --out "$RESULTS" $ARGS
  echo "== run.py exit code $? at $(date -u +%FT%TZ), $(( $(date +%s) - START ))s"
} 2>&1 | tee "$OUT/replication.log"

"$PY" - "$RESULTS/gpu" "$OUT/replication" <<'PY'
import json, pathlib, shutil, sys
src, dst = map(pathlib.Path, sys.argv[1:])
runs = [json.loads(p.read_text()) for p in sorted(src.glob("*.json")) if not p.name.startswith("_")]
(dst / "all.json").write_text(json.dumps(runs, indent=1) + "\n")
if (src / "_skipped.json").exists():
    shutil.copy(src / "_skipped.json", dst / "_skipped.json")
print(f"{len(runs)} run result(s) in {dst / 'all.json'}")
PY
tar -czf "$OUT/replication.tar.gz" -C "$RESULTS" gpu 2>/dev/null || echo "no results to pack" | tee -a "$OUT/replication.log"
ls -l "$OUT" "$OUT/replication"
