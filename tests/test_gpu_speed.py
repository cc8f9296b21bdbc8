"""benchmarks.gpu_speed, the prepared GPU speed command, run on the CPU in its quick mode (same code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_rows_write_their_numbers_and_the_profile(tmp_path: Path) -> None:
    rows = ["step_cl_b128", "jpeg_device_cl_b128"]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_speed", "--device", "cpu", "--quick", "--workers", "1",
         "--budget-s", "1", "--set-images", "16", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"),
         "--rows", *rows],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "gpu_speed.json").read_text())
    assert {"card", "torch", "git_commit", "arch", "views", "rows"} <= set(res) and res["card"] == "cpu"
    assert list(res["rows"]) == rows
    for name in rows:
        r = res["rows"][name]
        assert "skipped" not in r, r.get("traceback")
        assert r["images_per_s"] > 0 and r["step_ms"] > 0 and r["host_cpu_ms_per_image"] > 0
        assert 0 <= r["data_wait_share"] < 1 and r["memory_format"] == "channels_last"
        assert r["ratio_to_model_step"] > 0
    assert res["rows"]["step_cl_b128"]["data_wait_share"] == 0  # views already on the device
    assert res["rows"]["step_cl_b128"]["ratio_to_model_step"] == 1
    assert res["rows"]["step_cl_b128"]["dist.compile_scope"] == "off"  # what dist.compile compiled, per row
    assert "cuda_graph_of_the_whole_step" in res["not_measured"]
    jpeg = res["rows"]["jpeg_device_cl_b128"]  # the stage thread's host time, within the process's
    assert 0 < jpeg["device_stage_cpu_ms_per_image"] <= jpeg["host_cpu_ms_per_image"]
    assert jpeg["photometric_chain"] == "eager (compile off)"  # the CPU default (compiled on CUDA)
    profile = (tmp_path / "out" / "gpu_speed_profile.txt").read_text()
    assert profile.startswith("two steps of jpeg_device_cl_b128") and "aten::" in profile
    assert (tmp_path / "out" / "gpu_speed.png").stat().st_size > 0
