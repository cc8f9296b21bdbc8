"""The one atomic write (``hypersolid_scale.safety.atomic``): a write that fails part-way leaves the previous
file as it was and no temporary file, a finished one is fsync'ed with its directory, and no other module
renames files into place by hand."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from hypersolid_scale.checkpoint.files import atomic_save
from hypersolid_scale.safety import atomic

ROOT = Path(__file__).resolve().parents[1]


class Midway(Exception):
    pass


def _fails_midway(f) -> None:
    f.write(b"half of the new")
    f.flush()
    raise Midway


@pytest.mark.parametrize("existed", [True, False])
def test_a_write_that_raises_midway_leaves_the_old_file_and_no_temporary_file(tmp_path: Path, existed: bool) -> None:
    path = tmp_path / "result.json"
    if existed:
        path.write_text('{"old": 1}')
    with pytest.raises(Midway):
        atomic.write_with(path, _fails_midway)
    assert (path.read_text() == '{"old": 1}') if existed else not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["result.json"] if existed else [])


def test_a_value_json_cannot_write_touches_nothing(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("old")
    with pytest.raises(TypeError):
        atomic.write_json(path, {"x": object()})
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_each_variant_writes_the_whole_value_and_creates_the_folder(tmp_path: Path) -> None:
    d = tmp_path / "new" / "folder"
    assert atomic.write_text(d / "a.txt", "héllo\n").read_text() == "héllo\n"
    assert atomic.write_bytes(d / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert json.loads(atomic.write_json(d / "c.json", {"k": [1, 2]}).read_text()) == {"k": [1, 2]}
    t = torch.arange(5.0)
    atomic.write_with(d / "d.pt", lambda f: torch.save({"t": t}, f))
    assert torch.equal(torch.load(d / "d.pt", weights_only=True)["t"], t)
    with atomic.atomic_path(d / "e.txt") as tmp:
        assert tmp.parent == d and tmp.name.endswith(".tmp") and not (d / "e.txt").exists()
        tmp.write_text("via path")
    assert (d / "e.txt").read_text() == "via path"
    assert not list(d.glob("*.tmp"))


def test_the_file_and_its_directory_are_fsynced_before_and_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("dir" if Path(f"/proc/self/fd/{fd}").resolve().is_dir() else "file")
        real_fsync(fd)

    def replace(src, dst) -> None:  # noqa: ANN001 - os.replace's own signature
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    atomic.write_text(tmp_path / "x.txt", "data")
    assert events == ["file", "replace", "dir"]
    events.clear()
    atomic_save({"step": 1}, tmp_path / "ckpt.pt")  # the checkpoint's writer goes through the same helper
    assert events == ["file", "replace", "dir"]


def test_a_checkpoint_write_that_fails_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "step.pt"
    atomic_save({"step": 1}, path)

    class Unpicklable:
        def __reduce__(self):  # noqa: ANN204 - pickle's protocol
            raise Midway

    with pytest.raises(Midway):
        atomic_save({"step": 2, "bad": Unpicklable()}, path)
    assert torch.load(path, weights_only=True) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["step.pt"]


# Who may rename a file, and why it is not a write of a result.
RENAMERS = {
    "hypersolid_scale/safety/atomic.py": "the helper itself",
    "hypersolid_scale/tracking/spool.py": "the outbox moves its own open file and its watermark to the run's name",
    "hypersolid_scale/tracking/runs.py": "calls the spool's rename above",
    "hypersolid_scale/checkpoint/resume.py": "checkpoint.resume=never moves a whole finished folder aside",
}
# A plain write of a whole file is one of the helper's, apart from these (none is a result of the package).
PLAIN_WRITERS = {
    "hypersolid_scale/safety/errors.py": "torchrun's error file, written once if absent (the first failure wins)",
    "hypersolid_scale/tracking/spool.py": "the tracking outbox (appended, fsync'ed by its own flush)",
}
_RENAME = re.compile(r"\bos\.(replace|rename)\(|\.rename\(|\bshutil\.move\(")
_PLAIN = re.compile(r"(?<!atomic)\.write_(text|bytes)\(|\bjson\.dump\(|\.savefig\(\s*(path|out|\w+_path)\b")


def _sources() -> list[Path]:
    bench = list((ROOT / "benchmarks").glob("*.py")) + [ROOT / "benchmarks/replication/runfiles.py"]
    return sorted(p for p in [*(ROOT / "hypersolid_scale").rglob("*.py"), *bench] if "__pycache__" not in p.parts)


def test_no_module_renames_or_writes_a_result_by_hand() -> None:
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if _RENAME.search(code) and rel not in RENAMERS:
                found.append(f"{rel}:{n}: {line.strip()}")
            if _PLAIN.search(code) and rel not in PLAIN_WRITERS and "/proc/" not in code:
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "write through hypersolid_scale.safety.atomic instead:\n" + "\n".join(found)


def test_a_write_that_need_not_survive_a_power_cut_skips_the_fsyncs(tmp_path, monkeypatch):
    """durable=False (the tracking spool's watermark at every sync): still renamed whole, never fsync'ed."""
    import os

    from hypersolid_scale.safety import atomic

    calls: list[int] = []
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append(fd))
    atomic.write_json(tmp_path / "mark.json", {"offset": 7}, indent=None, newline=False, durable=False)
    assert (tmp_path / "mark.json").read_text() == '{"offset": 7}' and calls == []
    atomic.write_json(tmp_path / "mark.json", {"offset": 8}, indent=None, newline=False)
    assert (tmp_path / "mark.json").read_text() == '{"offset": 8}' and len(calls) == 2  # the file and its folder
    assert not list(tmp_path.glob("*.tmp"))


def test_a_commit_that_must_not_replace_refuses_an_existing_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """replace=False (a new tracking store): the file appears whole; where one exists, whoever made it, it is
    kept, the commit raises FileExistsError, and the temporary file is gone either way."""
    path = tmp_path / "store.db"
    tmp = atomic.temp_path(path)
    tmp.write_bytes(b"first")
    assert atomic.commit(tmp, path, replace=False) == path and path.read_bytes() == b"first"
    tmp.write_bytes(b"second")
    with pytest.raises(FileExistsError):
        atomic.commit(tmp, path, replace=False)
    assert path.read_bytes() == b"first" and not list(tmp_path.glob("*.tmp"))
