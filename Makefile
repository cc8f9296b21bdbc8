# hypersolid_scale — the two commands of the README:
#   make demo   set up everything, prepare Fashion-MNIST, train 2 processes on the CPU, evaluate
#   make test   set up everything, lint (ruff check and format, mypy), run the whole test suite (slow end-to-end tests included)
#   make image  build the CPU container image here (podman, a debootstrapped base) and train and evaluate in it
# Both work on a fresh Debian machine as root: they install the apt packages, create .venv and install
# the package with all extras. Setup is skipped when already done (stamp files in .venv/).

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
APT_PACKAGES := pkg-config libopencv-dev libturbojpeg0-dev dataset-fashion-mnist \
                slurmctld slurmd slurm-client munge
PYTEST_ARGS ?=
# Test processes (pytest-xdist); one file's tests stay in one process, in order (their shared fixtures).
PYTEST_WORKERS ?= 2
# Torch threads per test process: the cores shared among the workers (on 2 cores, 1 each: with two 2-thread
# processes on 2 cores, each parallel region waits until the OS runs its other thread). OMP_NUM_THREADS set wins.
TEST_THREADS = $(shell n=$$(( $$(nproc) / $(PYTEST_WORKERS) )); [ $$n -gt 0 ] && echo $$n || echo 1)
# What ruff and mypy check (mypy reads the same list from pyproject.toml's [tool.mypy] files).
LINT_PATHS := hypersolid_scale launch benchmarks

.PHONY: setup apt venv lint test test-fast demo bench image clean

setup: apt venv

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "error: missing apt packages:$$missing (run as root or install them)"; exit 1; fi; \
	  echo ">> apt-get install$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

venv: $(VENV)/.stamp-install

$(VENV)/.stamp-install: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip wheel setuptools
	# torch first, pinned, so that no dependency pulls another build
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	# FFCV's build needs numpy and the build tools present (no build isolation).
	$(PIP) install -q numpy cython pkgconfig
	DS_BUILD_OPS=0 $(PIP) install -q --no-build-isolation -e ".[all]"
	# DeepSpeed compiles its CPU shared-memory op at the first deepspeed.initialize (about a minute, cached in
	# ~/.cache/torch_extensions): compile it here, with the install, not inside the first DeepSpeed run.
	set -o pipefail; $(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" 2>&1 | tail -1
	@touch $@

# Lint, format and types, configured in pyproject.toml (`ruff format $(LINT_PATHS)` fixes what the format
# check finds); mypy keeps its cache in .mypy_cache (a warm run takes seconds).
lint: setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

test: setup lint
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(TEST_THREADS)} $(PY) -m pytest -v -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --timeout=1800 --durations=15 $(PYTEST_ARGS)

test-fast: setup
	$(PY) -m pytest -q -m "not slow" $(PYTEST_ARGS)

demo: setup
	bash launch/demo.sh

# make bench [BENCH_ARGS="--sizes 1024 4096"] [BENCH_STRICT=1]: the repulsion benchmark into runs/bench/, then
# what got slower or heavier than the committed benchmarks/results/repulsion.json (BENCH_STRICT=1: fail then).
bench: BENCH_OUT ?= runs/bench/repulsion
bench: setup
	$(PY) -m benchmarks.repulsion --out $(BENCH_OUT) $(BENCH_ARGS)
	$(PY) -m benchmarks.repulsion_compare $(BENCH_OUT).json $(if $(BENCH_STRICT),--strict)

# The CPU image, built and run with no image registry (docker/build_cpu_image.sh: stages, wall times, image size).
# Not part of `make test`; .ci/run runs it after the tests.
image: setup
	PYTHON=$(abspath $(PY)) bash docker/build_cpu_image.sh

clean:
	rm -rf $(VENV) runs outputs .pytest_cache .mypy_cache .ruff_cache
