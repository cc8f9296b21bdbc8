#!/usr/bin/env bash
# The CPU image built and run on this machine, with no image registry: `make image` (CI: .ci/run, after the tests).
#
#   1. engine: Debian's podman, runc and debootstrap (apt); a containers.conf of its own (CONTAINERS_CONF):
#      no default ulimits (a sandbox may refuse raising RLIMIT_NOFILE/NPROC) and runc (crun refuses hybrid cgroups)
#   2. base: `debootstrap --variant=minbase bookworm`, imported as localhost/hs-debian:bookworm-minbase
#   3. wheels: torch/torchvision and their requirements downloaded once into a folder on this disk, by this
#      machine's pip (its indexes and CA bundle); the build installs torch from that folder alone
#   4. image: docker/Dockerfile.cpu with the base as BASE_IMAGE, --network=host (pip reaches the package
#      registries this machine reaches), the wheel folder and the CA bundle mounted into the build
#   5. run: the README's container command (a quickstart training with torchrun, 2 processes) cut to 20 steps, then
#      launch/eval.py on its checkpoint,
#      as the image's non-root user, runs/ mounted from this machine and Fashion-MNIST read-only
#   6. check, from this machine: the checkpoint loads, the MLflow store has the run with its metrics; and
#      the image runs as a non-root user with no compiler left in it
#
# Prints each stage's wall time and the image size. Environment: HS_IMAGE_WORK (default /var/tmp/hs-image:
# the base's root file system, the wheels, the runs; kept between runs, so a second build reuses them),
# HS_IMAGE_TAG (default hypersolid:cpu), HS_IMAGE_STEPS (default 20), PYTHON (the checks' python, default
# .venv/bin/python), FASHION_MNIST (default /usr/share/datasets/fashion-mnist). Root only (apt, debootstrap).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
work=${HS_IMAGE_WORK:-/var/tmp/hs-image}
tag=${HS_IMAGE_TAG:-hypersolid:cpu}
steps=${HS_IMAGE_STEPS:-20}
python=${PYTHON:-$repo/.venv/bin/python}
fmnist=${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
base=localhost/hs-debian:bookworm-minbase
need_gb=${HS_IMAGE_NEED_GB:-16}
torch_pins=$(sed -n 's/^TORCH_VERSION=//p; s/^TORCHVISION_VERSION=//p' "$repo/docker/install.sh" | paste -sd' ')
read -r torch_version torchvision_version <<<"$torch_pins"

[[ $(id -u) == 0 ]] || { echo "error: run as root (apt-get, debootstrap and podman's storage need it)" >&2; exit 2; }
[[ -d $fmnist ]] || { echo "error: no Fashion-MNIST in $fmnist (apt-get install dataset-fashion-mnist, or set FASHION_MNIST)" >&2; exit 2; }
[[ -x $python ]] || { echo "error: $python not found: run make setup first, or set PYTHON" >&2; exit 2; }
mkdir -p "$work"

t0=$SECONDS
stage() { printf '>> [%4ds] %s\n' $((SECONDS - t0)) "$*"; }
declare -A took
timed() {  # timed NAME COMMAND...: run it, remember its wall time
    local name=$1 start=$SECONDS
    shift
    "$@"
    took[$name]=$((SECONDS - start))
}

engine() {
    local missing=()
    for p in podman runc debootstrap uidmap; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
    printf '[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n' >"$work/containers.conf"
}

base_image() {
    podman image exists "$base" && return
    rm -rf "$work/rootfs"
    debootstrap --variant=minbase bookworm "$work/rootfs" http://deb.debian.org/debian >"$work/debootstrap.log"
    tar -C "$work/rootfs" -c . | podman import --message "debootstrap --variant=minbase bookworm" - "$base" >/dev/null
    rm -rf "$work/rootfs"
}

wheels() {  # this machine's pip, with its own indexes, find-links and CA bundle (pip config list)
    "$python" -m pip download -q --dest "$work/wheels" "torch==$torch_version" "torchvision==$torchvision_version" \
        2>&1 | grep -v 'is ignored: it is neither a file nor a directory' || true
    compgen -G "$work/wheels/torch-$torch_version-*.whl" >/dev/null || { echo "error: no torch $torch_version wheel in $work/wheels" >&2; exit 1; }
}

free_gb() { echo $(( $(df -Pk "$1" | awk 'NR == 2 {print $4}') / 1024 / 1024 )); }

build() {
    local cert=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-}} mounts=(-v "$work/wheels:/wheels:ro")
    [[ -z $cert ]] || mounts+=(-v "$cert:/etc/hs-pip-ca.crt:ro")
    # An earlier build that failed leaves its stage behind (gigabytes, untagged): gone before this one. Committing
    # a layer holds its files about three times over (the container's files, the archive, the layer), and a
    # stage's working container holds its files beside its layers until the build ends: 13.6 GB at the peak
    # measured from nothing (the torch stage's last layer; benchmarks/results/image/cpu_image_layers.txt), so
    # $need_gb GB free where podman keeps its layers. Short of that, the image this build replaces goes first.
    podman image prune -f >/dev/null
    local store
    store=$(podman info --format '{{.Store.GraphRoot}}')
    if (( $(free_gb "$store") < need_gb )) && podman image exists "$tag"; then
        echo "only $(free_gb "$store") GB free under $store: removing the earlier $tag first"
        podman rmi -f "$tag" >/dev/null
        podman image prune -f >/dev/null
    fi
    if (( $(free_gb "$store") < need_gb )); then
        echo "error: $(free_gb "$store") GB free under $store; the image build needs about $need_gb GB (free some, or move podman's storage)" >&2
        exit 1
    fi
    local args=(--network=host --runtime runc "${mounts[@]}" -f "$repo/docker/Dockerfile.cpu" --build-arg "BASE_IMAGE=$base"
                --build-arg TORCH_WHEELS=/wheels --build-arg "PIP_CERT=${cert:+/etc/hs-pip-ca.crt}")
    # The torch stage first, by a build of its own: when it ends, its working container (the stage's gigabytes a
    # second time, beside its layers) goes, and the whole build below finds the stage's layers in the cache. In
    # one build that container stays until the final stage is committed.
    podman build "${args[@]}" --target torch -t "$tag-torch" "$repo"
    podman build "${args[@]}" -t "$tag" "$repo"
    podman untag "$tag-torch"  # the name only: its layers are the image's
    podman image prune -f >/dev/null  # the build stage and earlier builds' layers: gigabytes
}

run_in_image() {
    runs=$work/runs
    rm -rf "$runs" && mkdir -p "$runs" && chown 1000:1000 "$runs"  # the image's user writes there
    local ctr=(podman run --rm --network=host --ipc=host -v "$runs:/workspace/runs" -v "$fmnist:/data/fashion-mnist:ro"
               "$tag")
    # The training: the README's own command (its block readme-example: image), runs/ and the data where this
    # check keeps them, with this check's run directory and step budget appended.
    local readme
    readme=$(awk '/<!-- readme-example: image -->/ {f = 1} f && /^podman run/ {p = 1}
                  p {cont = /\\$/; sub(/\\$/, ""); printf "%s ", $0; if (!cont) exit}' "$repo/README.md")
    [[ $readme == "podman run "* ]] || { echo "error: no podman run command in README.md's image block" >&2; exit 1; }
    # shellcheck disable=SC2016  # the README's literal $PWD is what is replaced
    readme=${readme//'"$PWD/runs:'/\"$runs:}
    readme=${readme//'/usr/share/datasets/fashion-mnist:'/"$fmnist:"}
    readme=${readme// hypersolid:cpu / $tag }
    echo "the README's command: $readme"
    eval "$readme" run_dir=/workspace/runs/quickstart max_steps="$steps" checkpoint.every_n_steps="$steps"
    took[train]=$((SECONDS - start_train))
    local start_eval=$SECONDS
    "${ctr[@]}" python launch/eval.py --checkpoint "/workspace/runs/quickstart/checkpoints/step_$(printf %08d "$steps").pt" \
        data.path=/data/fashion-mnist eval.max_train_samples=2000 eval.max_test_samples=2000
    took[eval]=$((SECONDS - start_eval))
}

check() {  # from this machine: the files the container wrote; and the image's hygiene
    podman run --rm "$tag" sh -c 'test "$(id -u)" != 0 || { echo "error: the image runs as root" >&2; exit 1; }
        for c in gcc cc make; do ! command -v "$c" >/dev/null || { echo "error: $c in the final image" >&2; exit 1; }; done'
    "$python" - "$runs/quickstart" "$steps" <<'PY'
import sys
from pathlib import Path

import torch
from mlflow.tracking import MlflowClient

run_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
ckpt = torch.load(run_dir / "checkpoints" / f"step_{steps:08d}.pt", map_location="cpu", weights_only=False)
assert ckpt["step"] == steps, ckpt.get("step")
client = MlflowClient(f"sqlite:///{run_dir}/mlflow.db")
runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
run = next((r for r in runs if r.info.run_id == ckpt["mlflow_run_id"]), None)
assert run is not None, f"the checkpoint's MLflow run {ckpt['mlflow_run_id']} is not in {run_dir}/mlflow.db"
evaluated = sorted(k for k in run.data.metrics if k.startswith("eval/"))
assert "train/loss" in run.data.metrics and evaluated, sorted(run.data.metrics)
print(f"ok: checkpoint step {ckpt['step']} loads; MLflow run {run.info.run_name}: train/loss "
      f"{run.data.metrics['train/loss']:.4f}, {len(evaluated)} eval/ metrics, e.g. {evaluated[0]}")
PY
}

export CONTAINERS_CONF=$work/containers.conf
stage "engine: podman, runc, debootstrap";          timed engine engine
stage "base image $base (debootstrap minbase)";     timed base base_image
stage "torch $torch_version wheels into $work/wheels"; timed wheels wheels
stage "build $tag from docker/Dockerfile.cpu";      timed build build
stage "run: $steps steps of quickstart, then launch/eval.py"; start_train=$SECONDS; run_in_image
stage "check from the host";                        timed check check
size=$(podman image inspect "$tag" --format '{{.Size}}')
stage "done"
printf 'stage seconds: engine %s, base %s, wheels %s, build %s, train %s, eval %s, check %s; total %s\n' \
    "${took[engine]}" "${took[base]}" "${took[wheels]}" "${took[build]}" "${took[train]}" "${took[eval]}" \
    "${took[check]}" $((SECONDS - t0))
printf 'image %s: %s MB\n' "$tag" $((size / 1000000))
