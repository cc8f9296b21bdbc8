#!/usr/bin/env bash
# The GPU benchmark suite: CUDA tests, repulsion backends, training throughput, loaders, photos; JSON + PNG.
#
#     bash benchmarks/gpu_suite.sh [--device cuda|cpu] [--quick] [--out DIR] [--parts a,b]
#         (default out: runs/bench/gpu-<UTC date-time>; parts: cuda_tests,repulsion,ring_hop,train_throughput,loaders,
#          photo,speed; default all)
#
# Budget: each part has its own time limit (23 minutes together on a GPU; a 10-minute device call holds a few
# parts: the CUDA tests, the photo part and the speed part each take a call of their own, --parts NAME); a part
# that cannot run records `skipped: <reason>` and the suite goes on. `--device cpu --quick` runs the same code on
# tiny sizes.
# The committed results (benchmarks/results/gpu) are written only with --out naming them.
# Results: DIR/summary.json (card, torch, date, command, every part's status and numbers, failure tails),
# DIR/<part>.json, DIR/<part>.png, DIR/<part>.log. The photo part rebuilds its photo set from the source
# photographs in $PHOTO_SOURCES (default benchmarks/results/photo_sources.npz: no scikit-image needed).
# On a machine that got a copy of the tree (no .git, or a stale one), name the commit that was sent:
#     HYPERSOLID_GIT_COMMIT=<git rev-parse HEAD here> bash benchmarks/gpu_suite.sh ...
set -u
cd "$(dirname "$0")/.." || exit 1

DEVICE=cuda
QUICK=0
PARTS=cuda_tests,repulsion,ring_hop,train_throughput,loaders,photo,speed
OUT=runs/bench/gpu-$(date -u +%Y%m%d-%H%M%S)
COMMAND="bash benchmarks/gpu_suite.sh $*"
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="$2"; shift 2 ;;
    --device=*) DEVICE="${1#*=}"; shift ;;
    --quick) QUICK=1; shift ;;
    --out) OUT="$2"; shift 2 ;;
    --out=*) OUT="${1#*=}"; shift ;;
    --parts) PARTS="$2"; shift 2 ;;
    --parts=*) PARTS="${1#*=}"; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "gpu_suite.sh: unknown argument '$1' (expected --device cuda|cpu, --quick, --out DIR, --parts LIST)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_suite.sh: --device must be cuda or cpu, got '$DEVICE'" >&2; exit 2 ;; esac

PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv/bin/python
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
mkdir -p "$OUT"
SUITE_START=$(date +%s)

# part NAME LIMIT_S CMD...: run one part under a time limit; record rc and seconds; never stop the suite.
part() {
  local name="$1" limit="$2"; shift 2
  local t0 rc
  case ",$PARTS," in *",$name,"*) ;; *) echo "== $name: not in --parts"; return 0 ;; esac
  t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  tail -n 25 "$OUT/$name.log"
  printf '{"rc": %d, "seconds": %d, "limit_s": %d, "timed_out": %s}\n' "$rc" "$(( $(date +%s) - t0 ))" "$limit" \
    "$([ "$rc" = 124 ] || [ "$rc" = 137 ] && echo true || echo false)" > "$OUT/$name.status.json"
  echo "== $name: rc=$rc in $(( $(date +%s) - t0 ))s"
}

if [ "$QUICK" = 1 ]; then
  REP_ARGS=(--sizes 256 1024 --regimes spread --dtypes fp32 bf16 --backends dense tiled neighbors-flat
            --inprocess --share --share-batch 1 --share-res 64 32 --share-steps 1 --share-global-batches 16 64
            --budget-s 60)
  TT_ARGS=(--quick --budget-s 100)
  LD_ARGS=(--images 32 --batch 16 --workers 2 --sizes 224 --loaders "webdataset+PIL,ffcv,tensor")
  # Photo set of 256 images; loader rows over 64; trainer ResNet-18 on 32/16 px crops.
  PH_LD_ARGS="--images 64 --batch 16 --workers 2 --set-images 256"
  PH_TR_ARGS="--quick --workers 2 --budget-s 20 --set-images 256"
  SP_ARGS="--quick --workers 2 --budget-s 20"
  ST_ARGS="--quick"
  RH_ARGS=(--quick)
  LIMITS=(240 150 200 120 240 600 60)
else
  # Dense up to where it fits (24 B/pair: 32k on 80 GB); neighbors (top-k search on the GPU) up to 128k.
  REP_ARGS=(--sizes 8192 32768 65536 131072 262144 --regimes spread --dtypes bf16 fp32
            --large-from 8192 --neighbors-max 131072 --share --share-batch 128 --share-steps 5 --budget-s 80)
  TT_ARGS=(--budget-s 135 --compile-reserve-s 50)
  LD_ARGS=(--images 1024 --batch 64 --workers 16 --sizes 224 --threads 4)
  # 5,120 images timed per row after the first batch, both view setups; the set (5,504 images) on all cores.
  PH_LD_ARGS="--images 5120 --batch 64 --workers 8 --set-images 5504"
  PH_TR_ARGS="--workers 8 --budget-s 36 --set-images 5504"
  # photo: on the H200 its loaders took 160 s (set build included) and its trainer 115 s, so 200 s cut the trainer.
  # speed: 11 rows of 20 s after their warm-up (the compiled row compiles for about a minute), the 2,048-image
  # photo set built first; one device call of 8 minutes with the wheels' install: --parts speed alone.
  # The stage alone (benchmarks.stage_alone: its chain's compile, then 2 x 8 batches of 128) first, in 90 s at most.
  SP_ARGS="--workers 12 --budget-s 170 --set-images 2048"
  ST_ARGS="--batch 128 --batches 8"
  # ring_hop: one hop's block and bf16 screen at m = 512..4096, D = 1024 (the cost model's per-hop compute).
  RH_ARGS=(--rows 512 1024 2048 4096 --repeat 10)
  # cuda_tests: on a cold H200 (2026-12-04: inductor's and Triton's caches empty) 16 of the 41 tests took the
  # 150 s the part had; warm, all 41 took 51 s. Run it in a call of its own: --parts cuda_tests (300 s).
  LIMITS=(300 120 150 50 300 420 40)
fi
[ "$DEVICE" = cpu ] && [ "$QUICK" = 0 ] && echo "note: --device cpu without --quick takes long"

if [ "$DEVICE" = cuda ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "skipped: --device cuda but torch.cuda.is_available() is False; the parts below will record their failure"
fi

# 1. The CUDA-marked tests (they skip themselves without a GPU), collected from the files that mark any (a
# file without "mark.cuda" has none to select; collecting all of tests/ costs ~15 s of imports).
mapfile -t CUDA_TEST_FILES < <(grep -l "mark\.cuda" tests/test_*.py)
part cuda_tests "${LIMITS[0]}" "$PY" -m pytest -m cuda -q -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$OUT/cuda_tests.xml" "${CUDA_TEST_FILES[@]:-tests/}"
# 2. Repulsion backends (+ their share of a ResNet-50 step).
part repulsion "${LIMITS[1]}" "$PY" -m benchmarks.repulsion --device "$DEVICE" "${REP_ARGS[@]}" --out "$OUT/repulsion"
# 2b. One hop of the ring backend: the block computed while the next one travels (docs/design.md §3f).
part ring_hop "${LIMITS[6]}" "$PY" -m benchmarks.ring_hop --device "$DEVICE" "${RH_ARGS[@]}" --out "$OUT"
# 3. Training throughput: trainer vs the plain reference loop (+ compile, + DeepSpeed ZeRO-2).
part train_throughput "${LIMITS[2]}" "$PY" -m benchmarks.train_throughput --device "$DEVICE" "${TT_ARGS[@]}" --out "$OUT"
# 4. Loaders at 224 px: WebDataset + PIL, FFCV (where it imports), the in-memory tensor path.
part loaders "${LIMITS[3]}" "$PY" -m benchmarks.loaders --device "$DEVICE" "${LD_ARGS[@]}" \
  --cache "${TMPDIR:-/tmp}/hs_gpu_suite_loaders" --out "$OUT"

# 5. Photographs: the photo set's JPEG shards through the PIL / device / FFCV loaders (images/s, host CPU per
#    image), then the trainer end to end from those shards against the trainer on synthetic tensors.
# The commands go to `bash -c` through the environment: `timeout` runs a program, not a shell function.
export PY DEVICE OUT PH_LD_ARGS PH_TR_ARGS PHOTO_CACHE="${TMPDIR:-/tmp}/hs_gpu_suite_photos"
export PHOTO_SOURCES=${PHOTO_SOURCES:-benchmarks/results/photo_sources.npz}
# shellcheck disable=SC2016,SC2086  # expanded by the inner shell; the argument lists split on purpose
part photo "${LIMITS[4]}" bash -c 'rc=0
  "$PY" -m benchmarks.photo_loaders --device "$DEVICE" --sources-npz "$PHOTO_SOURCES" --cache "$PHOTO_CACHE" \
    --out "$OUT" $PH_LD_ARGS || rc=$?
  "$PY" -m benchmarks.photo_trainer --device "$DEVICE" --sources-npz "$PHOTO_SOURCES" --cache "$PHOTO_CACHE" \
    --out "$OUT" $PH_TR_ARGS || rc=$?
  exit $rc'

# 6. The device stage alone on cached decoded batches (device ms per phase, host ms, blur on / off), then the
#    trainer against the model's own step, one row per way of feeding it (benchmarks.gpu_speed).
export SP_ARGS ST_ARGS
# shellcheck disable=SC2016,SC2086  # expanded by the inner shell; the argument lists split on purpose
part speed "${LIMITS[5]}" bash -c 'rc=0
  timeout 90 "$PY" -m benchmarks.stage_alone --device "$DEVICE" --out "$OUT" $ST_ARGS || rc=$?
  "$PY" -m benchmarks.gpu_speed --device "$DEVICE" --sources-npz "$PHOTO_SOURCES" \
    --cache "$PHOTO_CACHE" --out "$OUT" $SP_ARGS || rc=$?
  exit $rc'

"$PY" -m benchmarks.gpu_summary --out "$OUT" --device "$DEVICE" --quick "$QUICK" --command "$COMMAND" \
  --started "$SUITE_START"
echo "suite done in $(( $(date +%s) - SUITE_START ))s; results in $OUT"
