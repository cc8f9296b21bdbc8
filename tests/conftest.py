"""Shared test setup: tests import their small reference helpers from this folder; shared fixtures."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
# The helper modules' assertions report their operands as a test's own do (pytest rewrites only test modules and
# conftest.py by itself); registered before any test imports them.
pytest.register_assert_rewrite("_data_helpers", "_errors", "_update")

# The MLflow client settings the tracker sets when the user has not: tests that create trackers restore them.
HTTP_ENV = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")


@pytest.fixture
def restore_http_env():
    saved = {name: os.environ.get(name) for name in HTTP_ENV}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def network_nodes():
    """``network_nodes(n)`` -> ``n`` nodes, each a network namespace of its own on one bridge (tests/_netns.py),
    removed with whatever still runs in them when the module's tests are done, failed or not. The namespaces
    a killed test run left behind are removed first; where namespaces cannot be made, the test is skipped."""
    import contextlib

    import _netns

    reason = _netns.unavailable()
    if reason is not None:
        pytest.skip(reason)
    _netns.remove_stale()
    with contextlib.ExitStack() as stack:
        yield lambda n: stack.enter_context(_netns.network_nodes(n))


# `make test` runs the files on 2 workers, one file at a time per worker (--dist loadfile, --no-loadscope-reorder):
# the files that take longest in all go first, so that the run does not end on one worker still in a long file
# while the other has nothing left. Slowest first, from `make test`'s durations on the 2-core machine; a file not
# named here keeps its place after them (each under 18 s in all).
SLOWEST_FILES = (
    "test_compare.py", "test_replication_runs.py", "test_train.py", "test_nodes.py", "test_slurm.py",
    "test_packaging.py", "test_gpu_suite.py", "test_demo.py", "test_ring.py", "test_docker.py", "test_data_ffcv.py", "test_run_lock.py",
    "test_torchrun_restart.py", "test_stage_cost.py", "test_baselines_train.py", "test_compile_step.py",
    "test_baselines_deepspeed.py", "test_accumulation_dist.py", "test_errors_train.py", "test_resume_world_size.py",
    "test_fp64_invariance.py", "test_tracking.py", "test_data_invariance.py", "test_eval_cli.py",
    "test_benchmark_eval.py",
)


_RENAMED_AWAY = [name for name in SLOWEST_FILES if not os.path.isfile(os.path.join(os.path.dirname(__file__), name))]
assert not _RENAMED_AWAY, f"tests/conftest.py SLOWEST_FILES names files that are not in tests/: {_RENAMED_AWAY}"


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order
