#!/usr/bin/env bash
# `make demo`: Fashion-MNIST -> 2-process CPU training -> evaluation against a random-init copy -> summary.
#
#   bash launch/demo.sh                 # after `make setup` (the venv is .venv)
#   HS_DEMO_RUN_DIR=runs/my-demo bash launch/demo.sh
#   HS_DEMO_STEPS=20 HS_DEMO_EVAL_SAMPLES=2000 bash launch/demo.sh   # a short run (CI: tests/test_demo.py)
#
# Environment:
#   HS_PYTHON             interpreter (default .venv/bin/python)
#   HS_DEMO_RUN_DIR       run directory (default runs/quickstart-<date>-<time>; relative to the repository)
#   HS_DEMO_STEPS         training steps (default: the config's budget, max_steps of configs/quickstart.yaml)
#   HS_DEMO_EVAL_SAMPLES  evaluate on a seeded random subset of this many images of each split, and let the
#                         online kNN monitor use as many (default: the whole splits, 60000 train / 10000 test)
#   HS_DEMO_EVAL_ARGS     more launch/eval.py overrides, space-separated (e.g. "eval.dbscan_max_edges=1000000")
#
# The trained network and its randomly initialised copy (same seed, same code: the run's step-0 weights)
# are evaluated the same way on the Fashion-MNIST test split: cosine kNN (K=20, backbone features,
# train split as the memory bank) and K-Means (k = 10 classes) NMI/ARI. A metric that cannot run on a
# network's embeddings (e.g. DBSCAN on the nearly collapsed random-init features) is reported as skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${HS_PYTHON:-.venv/bin/python}
RUN_DIR=${HS_DEMO_RUN_DIR:-runs/quickstart-$(date +%Y%m%d-%H%M%S)}
CONFIG=configs/quickstart.yaml
STEPS=${HS_DEMO_STEPS:-}
EVAL_SAMPLES=${HS_DEMO_EVAL_SAMPLES:-}
for v in STEPS EVAL_SAMPLES; do
    [[ -z ${!v} || ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "error: HS_DEMO_$v=${!v} must be a positive integer"; exit 1; }
done
# kNN, K-Means, HDBSCAN and the paper's DBSCAN eps sweep on the whole test split (10,000 images).
EVAL_ARGS=(--suite "knn,cluster" "eval.knn_k=[20]" eval.batch_size=1000)
read -r -a EXTRA_EVAL_ARGS <<< "${HS_DEMO_EVAL_ARGS:-}"
EVAL_ARGS+=("${EXTRA_EVAL_ARGS[@]}")
TRAIN_ARGS=()
if [[ -n $STEPS ]]; then TRAIN_ARGS+=("max_steps=$STEPS"); fi
if [[ -n $EVAL_SAMPLES ]]; then
    EVAL_ARGS+=("eval.max_train_samples=$EVAL_SAMPLES" "eval.max_test_samples=$EVAL_SAMPLES")
    TRAIN_ARGS+=("eval.monitor_max_samples=$EVAL_SAMPLES")
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one core per process: two processes share two cores

say() { printf '\n\033[1m>> %s\033[0m\n' "$*"; }
[[ -x $PY ]] || { echo "error: $PY not found; run 'make setup' first (or set HS_PYTHON)"; exit 1; }
STAGES=()
t_start=$(date +%s)
stage_done() { STAGES+=("$1=$(( $(date +%s) - t_start ))"); t_start=$(date +%s); }

say "1/4 Fashion-MNIST (Debian package dataset-fashion-mnist)"
"$PY" - <<'PYEOF'
from hypersolid_scale.data.loading.builtin_sets import fashion_mnist_dir, load_fashion_mnist
tr, te = load_fashion_mnist("train"), load_fashion_mnist("test")
print(f"Fashion-MNIST in {fashion_mnist_dir()}: {len(tr.labels)} train / {len(te.labels)} test images, 10 classes")
PYEOF
stage_done prepare

say "2/4 training: torchrun --nproc_per_node=2 launch/train.py --config $CONFIG run_dir=$RUN_DIR ${TRAIN_ARGS[*]}"
"$PY" -m torch.distributed.run --standalone --nproc_per_node=2 launch/train.py --config "$CONFIG" "run_dir=$RUN_DIR" \
    "${TRAIN_ARGS[@]}"
stage_done train
CKPTS=("$RUN_DIR"/checkpoints/step_*.pt)  # zero-padded step numbers: the glob's order is the step order
CKPT=${CKPTS[-1]}

say "3/4 evaluation of $CKPT and of its random-init copy"
"$PY" - "$CKPT" "$RUN_DIR/init/step_00000000.pt" <<'PYEOF'
import sys
from hypersolid_scale.checkpoint import atomic_save, load_checkpoint, random_init_checkpoint
atomic_save(random_init_checkpoint(load_checkpoint(sys.argv[1])), sys.argv[2])
print(f"random-init baseline (the run's initial weights): {sys.argv[2]}")
PYEOF
"$PY" launch/eval.py --checkpoint "$CKPT" --output-dir "$RUN_DIR/eval/trained" "${EVAL_ARGS[@]}"
stage_done eval_trained
"$PY" launch/eval.py --checkpoint "$RUN_DIR/init/step_00000000.pt" --output-dir "$RUN_DIR/eval/random_init" \
    --no-mlflow "${EVAL_ARGS[@]}"
stage_done eval_random_init

say "4/4 summary"
"$PY" - "$RUN_DIR" "${STAGES[@]}" <<'PYEOF'
import json, sys
from pathlib import Path

run, stages = Path(sys.argv[1]), dict(s.split("=") for s in sys.argv[2:])


def load(name: str) -> tuple[dict, dict]:
    report = json.loads((run / "eval" / name / "report.json").read_text())
    return report["metrics"], report.get("skipped", {})


(trained, t_skip), (init, i_skip) = load("trained"), load("random_init")
rows = [("kNN@20 top-1 (%)", "knn_k20_weighted"), ("K-Means NMI", "kmeans_nmi"), ("K-Means ARI", "kmeans_ari"),
        ("DBSCAN best NMI", "dbscan_best_nmi"), ("DBSCAN best eps", "dbscan_best_eps"), ("HDBSCAN NMI", "hdbscan_nmi")]


def cell(value: object, width: int) -> str:
    return f"{value:{width}.3f}" if isinstance(value, (int, float)) else f"{'skipped':>{width}s}"


print(f"{'Fashion-MNIST test split':26s} {'random init':>12s} {'trained':>10s} {'change':>9s}")
for name, key in rows:
    a, b = init.get(key), trained.get(key)
    change = f"{b - a:+9.3f}" if a is not None and b is not None else f"{'':9s}"
    print(f"{name:26s} {cell(a, 12)} {cell(b, 10)} {change}")
for label, skipped in (("random init", i_skip), ("trained", t_skip)):
    radii: dict[str, list[str]] = {}  # one line for the DBSCAN radii left out for the same reason
    for metric, why in skipped.items():
        if metric.startswith("dbscan_eps"):
            radii.setdefault(why, []).append(metric[len("dbscan_eps"):])
        else:
            print(f"skipped for {label}: {metric}: {why}")
    for why, eps in radii.items():
        where = eps[0] if len(eps) == 1 else f"{eps[0]} to {eps[-1]} ({len(eps)} values)"
        print(f"skipped for {label}: dbscan at eps {where}: {why}")
print("wall time (s): " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in stages.items()))
both = [k for _, k in rows[:2] if k in trained and k in init]
if not both:
    print("WARNING: neither kNN nor K-Means could be compared (see the skipped metrics above)")
elif all(trained[k] > init[k] for k in both):
    print("the trained network beats its random initialisation")
else:
    print("WARNING: the trained network does NOT beat its random initialisation on every metric")
PYEOF
URI="sqlite:///$(cd "$RUN_DIR" && pwd)/mlflow.db"
echo
echo "Run directory: $RUN_DIR (checkpoints/, config.yaml, plots/, eval/)"
echo "MLflow:        $PY -m mlflow ui --backend-store-uri $URI   # then open http://127.0.0.1:5000"
