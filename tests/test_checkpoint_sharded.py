"""The sharded checkpoint (``checkpoint.format=sharded``, docs/design.md §5): resharded over world sizes
4 -> 3 -> 2 -> 4 under DDP and ZeRO 1/2, each rank reading only its part; a save that never finished is skipped.

The trainer's own use of it (launch/train.py, asynchronous saves, a resume on another world size bit-identical to
the single file's, evaluation reading the folder) is tested with the other resumes in tests/test_resume_world_size.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _sharded_worker import ENGINES, GLOBAL_BATCH, batch, loss_of, network, optimizer
from _warm_python import run_processes

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.checkpoint import sharded
from hypersolid_scale.checkpoint.collect import engine_parts
from hypersolid_scale.safety.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
CHAIN = [(4, 2), (3, 1), (2, 1), (4, 1)]  # (world size, steps trained) of each link


def _reference(steps: int) -> dict[str, torch.Tensor]:
    """The same training in one process, plain torch: what every engine's chain must end at."""
    model = network()
    adamw = optimizer(model.parameters())
    for t in range(steps):
        loss_of(model(batch(t))).backward()
        adamw.step()
        adamw.zero_grad()
    return model.state_dict()


@pytest.mark.slow
def test_reshard_chain(tmp_path: Path) -> None:
    prev = None
    reads = []
    for i, (world, steps) in enumerate(CHAIN):
        out = tmp_path / f"link{i}"
        argv = [REPO / "tests" / "_sharded_worker.py", "--out", out, "--steps", str(steps)]
        if prev is not None:
            argv += ["--prev", prev]
        proc = run_processes(argv, nproc=world, env=ENV, timeout=300)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
        reads.append(json.loads((out / "read.json").read_text()))
        prev = out
    total = sum(steps for _, steps in CHAIN)
    reference = _reference(total)
    for label in ENGINES:
        final = ck.load_checkpoint(ck.list_checkpoints(prev / label)[-1])  # read whole, in this process
        assert final["step"] == total
        for name, value in reference.items():
            torch.testing.assert_close(final["model"][name], value, rtol=0, atol=1e-6, msg=f"{label} {name}")
    for link in reads[1:]:
        for label, (per_rank, whole) in link["bytes_read"].items():
            assert len(per_rank) == link["world_size"]
            if label == "ddp":  # every rank holds (and reads) the whole optimizer state
                assert per_rank == [whole] * link["world_size"], (label, link)
            else:  # each rank reads its partition's slices, not the whole state
                assert max(per_rank) < whole, (label, link)
                assert sum(per_rank) < 2 * whole, (label, link)


def test_global_batch_fits_the_chain() -> None:
    assert all(GLOBAL_BATCH % world == 0 for world, _ in CHAIN)


class _Engine:
    """A one-process engine stand-in for the save/resume files: a model and its plain optimizer (no process group)."""

    def __init__(self) -> None:
        from hypersolid_scale.distributed.engines import build_engine

        self.engine = build_engine(
            network(), optimizer, engine="ddp", device=torch.device("cpu"), bf16=False, grad_clip=0.0, sync_bn=False
        )
        loss_of(self.engine.model(batch(0))).backward()
        self.engine.step()

    def save(self, run_dir: Path, step: int, *, asynchronous: bool) -> sharded.PendingSave:
        tensors, rest = engine_parts(self.engine)
        meta = {"step": step, "epoch": 0, "config": {}, "config_fingerprint": "", **rest}
        return sharded.save_sharded(run_dir, step, tensors, meta, keep_last=0, asynchronous=asynchronous,
                                    agree=lambda fn: fn())


def test_unfinished_save_is_skipped_and_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _Engine()
    engine.save(tmp_path, 1, asynchronous=False)
    engine.save(tmp_path, 2, asynchronous=True).wait()
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000001.dcp", "step_00000002.dcp"]

    import torch.distributed.checkpoint as dcp

    def crash(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dcp.FileSystemWriter, "write_data", crash)
    pending = engine.save(tmp_path, 3, asynchronous=True)
    said = "cannot write checkpoint .*step_00000003.dcp: .*No space left on device.*previous checkpoints are intact"
    with pytest.raises(CheckpointError, match=said):
        pending.wait()
    with pytest.raises(CheckpointError, match="step_00000004.dcp"):
        engine.save(tmp_path, 4, asynchronous=False)
    monkeypatch.undo()
    # The newest complete checkpoint is step 2; steps 3 and 4 are *.tmp folders, skipped, then deleted.
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "step_00000001.dcp", "step_00000002.dcp", "step_00000003.dcp.tmp", "step_00000004.dcp.tmp"
    ]
    found = ck.find_resume_checkpoint(tmp_path)
    assert found is not None and found[0].name == "step_00000002.dcp" and found[1]["step"] == 2
    assert sorted(p.name for p in ck.delete_stale_tmp(tmp_path)) == ["step_00000003.dcp.tmp", "step_00000004.dcp.tmp"]
    # A folder without DCP's .metadata (a save cut off after its rename, or a copy cut short) is not resumed from.
    (tmp_path / "checkpoints" / "step_00000002.dcp" / ".metadata").unlink()
    with pytest.warns(UserWarning, match="step_00000002.dcp.*no .metadata"):
        found = ck.find_resume_checkpoint(tmp_path)
    assert found is not None and found[0].name == "step_00000001.dcp"
    # Read whole (evaluation, export): the model's weights, and the optimizer state by parameter name.
    whole = ck.load_checkpoint(found[0])
    pieces, _ = engine.engine.optimizer_pieces()
    assert set(whole["optimizer"]["pieces"]) == set(pieces)
    for name, value in engine.engine.model.state_dict().items():
        assert torch.equal(whole["model"][name], value)


_STUCK_WRITE = r"""
import sys, threading
import torch
import torch.distributed.checkpoint as dcp
from hypersolid_scale.distributed import parts
from hypersolid_scale.safety.process_exit import leave_now

blocked = threading.Event()
dcp.FileSystemWriter.write_data = lambda *a, **k: blocked.wait()  # as a write waiting on a rank that is gone
parts.write({"w": torch.zeros(4)}, __import__("pathlib").Path(sys.argv[1]), asynchronous=True)
leave_now(3)  # the run failed: the interpreter's way out (threads joined, atexit handlers run)
"""


def test_a_failed_run_leaves_without_waiting_for_its_write(tmp_path: Path) -> None:
    """The background write is a daemon thread: a run that fails while it waits (on a peer that is gone) exits
    at once instead of when the save group's collective times out. ``dcp.async_save``'s executor thread was
    joined at exit: this process then never ended."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    cmd = [sys.executable, "-c", _STUCK_WRITE, str(tmp_path / "step.dcp.tmp")]
    proc = subprocess.run(cmd, timeout=60, capture_output=True, text=True, env=env)
    assert proc.returncode == 3, proc.stderr[-2000:]
