"""The GPU benchmark suite, run end to end on the CPU in its quick mode (same code, tiny sizes)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PART_FILES = {"repulsion": "repulsion.json", "ring_hop": "ring_hop.json", "train_throughput": "train_throughput.json",
              "loaders": "loaders.json"}


def has_numbers_or_reason(row: dict, number_keys: tuple[str, ...]) -> bool:
    return any(isinstance(row.get(k), (int, float)) for k in number_keys) or bool(row.get("skipped"))


def committed_results() -> dict[str, str]:
    """{path: sha256} of the files git tracks under benchmarks/results/, as they are on disk."""
    files = subprocess.run(["git", "ls-files", "-z", "benchmarks/results"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    return {f: hashlib.sha256((ROOT / f).read_bytes()).hexdigest() for f in files if f and (ROOT / f).is_file()}


@pytest.mark.slow
def test_quick_cpu_suite_writes_every_part():
    # No --out: the suite's default, a run folder under runs/bench/; the committed results stay as they are.
    before = committed_results()
    # The photo part has its own test (tests/test_photo_bench.py): the suite's other parts here.
    parts = ",".join(["cuda_tests", *PART_FILES])
    proc = subprocess.run(["bash", "benchmarks/gpu_suite.sh", "--device", "cpu", "--quick", "--parts", parts],
                          cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**__import__("os").environ, "PYTHON": sys.executable})
    out = ROOT / proc.stdout.rstrip().rsplit("results in ", 1)[-1]
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert out.parent == ROOT / "runs" / "bench" and out.name.startswith("gpu-"), out
        changed = sorted(f for f, digest in committed_results().items() if before.get(f) != digest)
        assert not changed, f"the quick CPU suite rewrote committed results: {changed}"
        check_outputs(out)
    finally:
        if out.parent == ROOT / "runs" / "bench" and out.name.startswith("gpu-"):
            shutil.rmtree(out, ignore_errors=True)


def check_outputs(out: Path) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert {"card", "torch", "date", "command", "parts"} <= set(summary)
    assert "--quick" in summary["command"]
    assert set(summary["parts"]) == {"cuda_tests", *PART_FILES, "photo", "speed"}
    for name in ("photo", "speed"):  # not in --parts
        assert summary["parts"].pop(name)["skipped"].startswith("the part did not run")
    for name, part in summary["parts"].items():
        assert part["status"] in ("ok", "partial", "skipped", "failed"), name
        # A part without numbers says why.
        assert part["status"] == "ok" or part.get("skipped"), (name, part)
        assert (out / f"{name}.png").is_file(), name
    # No GPU here: the CUDA tests all skip themselves, and the summary says so.
    tests = summary["parts"]["cuda_tests"]
    assert tests["status"] == "skipped" and tests["results"]["skipped"] >= 7 and tests["results"]["passed"] == 0

    for name, file in PART_FILES.items():
        data = json.loads((out / file).read_text())
        assert summary["parts"][name]["results"] == data
    rep = json.loads((out / "repulsion.json").read_text())
    assert {"meta", "rows", "share"} <= set(rep)
    assert rep["rows"] and all(has_numbers_or_reason(r, ("seconds",)) for r in rep["rows"])
    measured = [r for r in rep["rows"] if "seconds" in r]
    assert {r["backend"] for r in measured} >= {"dense", "tiled"}
    assert {r["dtype"] for r in measured} == {"fp32", "bf16"}
    assert all(r["loss_rel_err"] < 1e-4 for r in measured if r["backend"] in ("tiled", "neighbors-flat"))
    assert rep["share"].get("cases") or rep["share"].get("skipped")

    hop = json.loads((out / "ring_hop.json").read_text())["rows"]
    assert {(r["regime"], r["rows"]) for r in hop} == {(g, m) for g in ("spread", "collapsed") for m in (64, 128)}
    assert all(r["block_s"] > 0 and r["screen_bf16_s"] > 0 and r["hop_bytes_bf16"] * 2 == r["hop_bytes_fp32"] for r in hop)
    # near collapse every column passes the screen (it is sent again in fp32); spread, few do
    assert all(r["columns_needed_after_screen"] == (1.0 if r["regime"] == "collapsed" else r["columns_needed_after_screen"]) for r in hop)
    assert all(r["columns_needed_after_screen"] < 0.5 for r in hop if r["regime"] == "spread")

    tt = json.loads((out / "train_throughput.json").read_text())
    assert [r["setup"] for r in tt["results"]] == ["cifar", "imagenet"]
    for r in tt["results"]:
        assert set(r["variants"]) == {"reference", "trainer", "reference+compile", "trainer+compile", "deepspeed"}
        for variant, v in r["variants"].items():
            assert has_numbers_or_reason(v, ("images_per_s",)), (r["setup"], variant, v)
        assert r["variants"]["reference"].get("images_per_s", 0) > 0

    loaders = json.loads((out / "loaders.json").read_text())
    assert {r["loader"] for r in loaders["results"]} == {"webdataset+PIL", "ffcv", "tensor"}
    assert all(has_numbers_or_reason(r, ("images_per_s",)) for r in loaders["results"])


# The device stage's test files (docs/design.md §3e): each of their tests that needs CUDA runs in the GPU command.
STAGE_TEST_FILES = ("test_device_stage.py", "test_device_decode.py", "test_stage_cost.py", "test_hot_path.py")


def test_every_cuda_test_of_the_device_stage_runs_in_the_gpu_command():
    """The suite's cuda_tests part runs `pytest -m cuda tests/`: every test of the stage's files that skips
    without CUDA carries the cuda mark (else the GPU command would never run it)."""
    import ast

    suite = (ROOT / "benchmarks" / "gpu_suite.sh").read_text()
    assert "part cuda_tests" in suite and "-m pytest -m cuda" in suite and "tests/" in suite
    found = []
    for name in STAGE_TEST_FILES:
        tree = ast.parse((ROOT / "tests" / name).read_text())
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            marks = [ast.unparse(d) for d in node.decorator_list]
            if any("cuda.is_available" in m or m == "cuda" for m in marks):
                found.append(node.name)
                assert "pytest.mark.cuda" in marks, f"{name}::{node.name} needs CUDA but has no pytest.mark.cuda"
    assert len(found) >= 4, found  # the sync-debug, decoder-overwrite, nvJPEG and hot-path tests at least
