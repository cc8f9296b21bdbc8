#!/usr/bin/env bash
# Prepare what the GPU machine needs for benchmarks/replication/gpu.sh and has not: Fashion-MNIST and the wheels,
# within the device's 64 MiB (working tree included). Run here, from the repository root:
#     bash benchmarks/replication/gpu_carry.sh      # then carry [".whl_replication", ".fmnist"]
# .fmnist/: Debian's four idx files recompressed with xz (26 MB instead of 31 MB gzip); gpu.sh unpacks them.
# .whl_replication/: .whl/ (benchmarks/gpu_wheels.sh) less what training and evaluation do not import
# (DeepSpeed, hjson, pydantic and its dependencies).
set -euo pipefail
cd "$(dirname "$0")/../.." || exit 1
SRC=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
[ -d .whl ] || bash benchmarks/gpu_wheels.sh
mkdir -p .fmnist .whl_replication
for f in "$SRC"/*-ubyte.gz; do
  out=.fmnist/$(basename "$f" .gz).xz
  [ -s "$out" ] || gunzip -c "$f" | xz -9e -T2 > "$out"
done
rm -f .whl_replication/*.whl
for w in .whl/*.whl; do
  case "$(basename "$w")" in deepspeed-*|hjson-*|pydantic*|annotated_types-*|typing_inspection-*) ;; *) cp "$w" .whl_replication/ ;; esac
done
for d in .fmnist .whl_replication; do grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude; done
du -cb .fmnist .whl_replication | tail -1
