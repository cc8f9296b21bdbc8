"""benchmarks.repulsion_compare: a slower or heavier row is flagged, an equal or noisy one is not."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _compare() -> ModuleType:
    from benchmarks import repulsion_compare

    return repulsion_compare


def _result(**seconds: float) -> dict:
    rows = [{"backend": name.replace("_", "-"), "m": 8192, "regime": "spread", "device": "cpu", "dtype": "fp32",
             "seconds": s, "peak_bytes": 500 * 2**20} for name, s in seconds.items()]
    return {"meta": {"device": "cpu", "torch": "2.14.1", "threads": 2}, "rows": rows}


def test_equal_results_flag_nothing() -> None:
    base = _result(neighbors_flat=1.25, tiled=4.0)
    out = _compare().compare(base, copy.deepcopy(base))
    assert out["matched"] == 2
    assert out["slower"] == out["heavier"] == out["faster"] == out["lost"] == out["env"] == []


def test_slower_row_is_flagged_with_its_ratio() -> None:
    mod = _compare()
    base, new = _result(neighbors_flat=1.25, tiled=4.0), _result(neighbors_flat=2.3, tiled=4.2)
    out = mod.compare(base, new, time_threshold=0.3)
    assert [r["backend"] for r in out["slower"]] == ["neighbors-flat"]  # tiled: +5 %, inside the allowance
    assert abs(out["slower"][0]["ratio"] - 2.3 / 1.25) < 1e-12
    text = "\n".join(mod.report(out, time_threshold=0.3, mem_threshold=0.2))
    assert "SLOWER (1)" in text and "neighbors-flat" in text and "x1.84" in text


def test_noise_threshold_and_floor() -> None:
    mod = _compare()
    base = _result(neighbors_flat=1.0, dense=0.01)
    new = _result(neighbors_flat=1.25, dense=0.03)  # +25 %: inside 30 %; x3 but 0.02 s: under the floor
    assert mod.compare(base, new, time_threshold=0.3, time_floor=0.05)["slower"] == []
    assert len(mod.compare(base, new, time_threshold=0.2, time_floor=0.05)["slower"]) == 1
    assert len(mod.compare(base, new, time_threshold=0.2, time_floor=0.0)["slower"]) == 2


def test_faster_and_heavier_and_lost_rows() -> None:
    mod = _compare()
    base, new = _result(tiled=4.0, dense=10.0, neighbors_ivf=3.0), _result(tiled=2.0, dense=10.0, neighbors_ivf=3.0)
    new["rows"][1]["peak_bytes"] = 650 * 2**20  # +150 MiB, +30 %
    new["rows"][2] = {"backend": "neighbors-ivf", "m": 8192, "regime": "spread", "skipped": "timed out"}
    new["meta"]["threads"] = 1
    out = mod.compare(base, new, mem_threshold=0.2, mem_floor_mib=32)
    assert [r["backend"] for r in out["faster"]] == ["tiled"] and out["slower"] == []
    assert [(r["backend"], round(r["ratio"], 2)) for r in out["heavier"]] == [("dense", 1.3)]
    assert [r["backend"] for r in out["lost"]] == ["neighbors-ivf"]
    assert ("threads", 2, 1) in out["env"]


def test_rows_are_matched_on_size_regime_and_dtype() -> None:
    base = _result(tiled=1.0)
    new = copy.deepcopy(base)
    new["rows"][0].update(m=16384, seconds=5.0)  # another size: not comparable
    assert _compare().compare(base, new)["matched"] == 0


def test_cli_exit_status_only_fails_when_strict(tmp_path: Path) -> None:
    base, new = tmp_path / "base.json", tmp_path / "new.json"
    base.write_text(json.dumps(_result(neighbors_flat=1.25)))
    new.write_text(json.dumps(_result(neighbors_flat=2.3)))
    cmd = [sys.executable, "-m", "benchmarks.repulsion_compare", str(new), "--baseline", str(base)]
    loose = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert loose.returncode == 0 and "SLOWER (1)" in loose.stdout
    assert subprocess.run([*cmd, "--strict"], cwd=ROOT, capture_output=True, text=True, check=False).returncode == 1
    same = subprocess.run([*cmd[:3], str(base), "--baseline", str(base), "--strict"], cwd=ROOT, capture_output=True,
                          text=True, check=False)
    assert same.returncode == 0 and "nothing slower" in same.stdout


def test_committed_results_are_compared_row_by_row() -> None:
    """The committed file is read as compare expects it: every timed row matches its twin, and one row made
    twice as slow (and one 50 % heavier) is flagged, that row alone."""
    committed = json.loads((ROOT / "benchmarks" / "results" / "repulsion.json").read_text())
    timed = [i for i, r in enumerate(committed["rows"]) if "seconds" in r and r["seconds"] >= 0.1]
    out = _compare().compare(committed, copy.deepcopy(committed))
    assert out["matched"] == sum("seconds" in r for r in committed["rows"]) >= len(timed) > 1
    assert not (out["slower"] or out["heavier"] or out["faster"] or out["lost"])
    changed = copy.deepcopy(committed)
    slow, heavy = (changed["rows"][i] for i in timed[:2])
    slow["seconds"] *= 2
    heavy["peak_bytes"] = int(heavy["peak_bytes"] * 1.5) + 64 * 2**20
    out = _compare().compare(committed, changed)
    assert [(r["backend"], r["m"]) for r in out["slower"]] == [(slow["backend"], slow["m"])]
    assert [(r["backend"], r["m"]) for r in out["heavier"]] == [(heavy["backend"], heavy["m"])]
