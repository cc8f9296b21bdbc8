#!/usr/bin/env bash
# `make demo`: Fashion-MNIST -> 2-process CPU training -> evaluation against a random-init copy -> summary.
#
#   bash launch/demo.sh                 # after `make setup` (the venv is .venv)
#   HS_DEMO_RUN_DIR=runs/my-demo bash launch/demo.sh
#
# The trained network and its randomly initialised copy (same seed, same code: the run's step-0 weights)
# are evaluated the same way on the Fashion-MNIST test split: cosine kNN (K=20, backbone features,
# train split as the memory bank) and K-Means (k = 10 classes) NMI/ARI.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${HS_PYTHON:-.venv/bin/python}
RUN_DIR=${HS_DEMO_RUN_DIR:-runs/quickstart-$(date +%Y%m%d-%H%M%S)}
CONFIG=configs/quickstart.yaml
# kNN and K-Means on the full test split; one DBSCAN radius and a 2000-sample HDBSCAN keep the demo short
# (the full sweeps: launch/eval.py --suite cluster).
EVAL_ARGS=(--suite knn,cluster eval.knn_k=[20] eval.cluster_max_samples=10000 eval.dbscan_eps=[0.1]
           eval.hdbscan_max_samples=2000 eval.batch_size=1000)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one core per process: two processes share two cores

say() { printf '\n\033[1m>> %s\033[0m\n' "$*"; }
[[ -x $PY ]] || { echo "error: $PY not found; run 'make setup' first (or set HS_PYTHON)"; exit 1; }

say "1/4 Fashion-MNIST (Debian package dataset-fashion-mnist)"
"$PY" - <<'EOF'
from hypersolid_scale.data.builtin import fashion_mnist_dir, load_fashion_mnist
tr, te = load_fashion_mnist("train"), load_fashion_mnist("test")
print(f"Fashion-MNIST in {fashion_mnist_dir()}: {len(tr.labels)} train / {len(te.labels)} test images, 10 classes")
EOF

say "2/4 training: torchrun --nproc_per_node=2 launch/train.py --config $CONFIG run_dir=$RUN_DIR"
t0=$(date +%s)
"$PY" -m torch.distributed.run --standalone --nproc_per_node=2 launch/train.py --config "$CONFIG" "run_dir=$RUN_DIR"
train_s=$(( $(date +%s) - t0 ))
CKPT=$(ls "$RUN_DIR"/checkpoints/step_*.pt | sort | tail -n 1)

say "3/4 evaluation of $CKPT and of its random-init copy"
"$PY" - "$CKPT" "$RUN_DIR/init/step_00000000.pt" <<'EOF'
import sys
from hypersolid_scale.checkpoint import atomic_save, load_checkpoint, random_init_checkpoint
atomic_save(random_init_checkpoint(load_checkpoint(sys.argv[1])), sys.argv[2])
print(f"random-init baseline (the run's initial weights): {sys.argv[2]}")
EOF
t0=$(date +%s)
"$PY" launch/eval.py --checkpoint "$CKPT" --output-dir "$RUN_DIR/eval/trained" "${EVAL_ARGS[@]}"
"$PY" launch/eval.py --checkpoint "$RUN_DIR/init/step_00000000.pt" --output-dir "$RUN_DIR/eval/random_init" \
    --no-mlflow "${EVAL_ARGS[@]}"
eval_s=$(( $(date +%s) - t0 ))

say "4/4 summary"
"$PY" - "$RUN_DIR" "$train_s" "$eval_s" <<'EOF'
import json, sys
from pathlib import Path
run, train_s, eval_s = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
trained = json.loads((run / "eval/trained/report.json").read_text())["metrics"]
init = json.loads((run / "eval/random_init/report.json").read_text())["metrics"]
rows = [("kNN@20 top-1 (%)", "knn_k20_weighted"), ("K-Means NMI", "kmeans_nmi"), ("K-Means ARI", "kmeans_ari")]
print(f"{'Fashion-MNIST test split':26s} {'random init':>12s} {'trained':>10s} {'change':>9s}")
for name, key in rows:
    a, b = init.get(key), trained.get(key)
    if a is None or b is None:
        continue
    print(f"{name:26s} {a:12.3f} {b:10.3f} {b - a:+9.3f}")
print(f"wall time: training {train_s} s, evaluation {eval_s} s")
learned = all(trained[k] > init[k] for _, k in rows[:2] if k in trained and k in init)
print("the trained network beats its random initialisation" if learned else
      "WARNING: the trained network does NOT beat its random initialisation on every metric")
EOF
URI="sqlite:///$(cd "$RUN_DIR" && pwd)/mlflow.db"
echo
echo "Run directory: $RUN_DIR (checkpoints/, config.yaml, plots/, eval/)"
echo "MLflow:        $PY -m mlflow ui --backend-store-uri $URI   # then open http://127.0.0.1:5000"
