"""Every user-facing error of training, through launch/train.py: one line ``error: ...`` naming the file or
key and the fix, exit code 2, no traceback (but a traceback with HS_DEBUG=1)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _errors import assert_one_error_line
from _net import free_port
from _warm_python import run_python

from hypersolid_scale import checkpoint as ck
from hypersolid_scale.checkpoint import initial_weights
from hypersolid_scale.config.fingerprint import fingerprint
from hypersolid_scale.config.schema import load_config, to_dict
from hypersolid_scale.safety.errors import CheckpointError

REPO = Path(__file__).resolve().parents[1]
LAUNCH = REPO / "launch" / "train.py"

# The real trainer on sklearn digits, shrunk until a step takes milliseconds, without tracking.
TINY = ["data.dataset=digits", "model.in_channels=1", "model.small_cnn.width=4", "method.hypersolid.num_layers=2",
        "method.hypersolid.hidden_dim=32", "method.hypersolid.out_dim=32", "data.num_local_views=2", "data.batch_size_per_gpu=32",
        "data.num_workers=0", "progress=false", "eval.every_n_epochs=0", "dist.device=cpu",
        "tracking.enabled=false", "data.max_pretrain_samples=128"]

# A script that runs launch/train.py as the program, with torch.save failing like a full disk from the
# second checkpoint on (after writing a few bytes, as a real ENOSPC does).
_FULL_DISK = r"""
import errno, runpy, sys, torch
real, calls = torch.save, [0]
def save(obj, f, *args, **kwargs):
    calls[0] += 1
    if calls[0] >= 2:
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(obj, f, *args, **kwargs)
torch.save = save
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""

# The same, failing the way torch's zip writer reports it when the file's write fails part-way through a large
# tensor: a RuntimeError of its own, raised while handling the file's OSError.
_TORCH_WRITER_FULL = _FULL_DISK.replace(
    'raise OSError(errno.ENOSPC, "No space left on device")',
    """try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 768 vs 662")""")
FULL_DISK_WRAPPERS = {"oserror": _FULL_DISK, "torch_writer": _TORCH_WRITER_FULL}


def _train(args: list[str], *, debug: bool = False, wrapper: str | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("HS_DEBUG", None)
    if debug:
        env["HS_DEBUG"] = "1"
    prefix = ["-c", wrapper] if wrapper else []
    return run_python([*prefix, str(LAUNCH), *args], env=env, timeout=timeout)  # python [-c WRAPPER] LAUNCH ARGS


def assert_shows_traceback(args: list[str], **kw) -> None:
    proc = _train(args, debug=True, **kw)
    assert proc.returncode != 0 and "Traceback (most recent call last)" in proc.stderr, proc.stderr[-3000:]


# ----------------------------------------------------------------------------------------------------------
# Config files and keys
# ----------------------------------------------------------------------------------------------------------


def _bad_configs(tmp_path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (arguments, words the error line must hold)."""
    syntax = tmp_path / "syntax.yaml"
    syntax.write_text("optim:\n  lr: 0.1\n   name: sgd\n")  # a mis-indented key
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("optim:\n  momentun: 0.9\n")
    renamed = tmp_path / "renamed.yaml"
    renamed.write_text("dist:\n  backend: gloo\n  transport: nccl\n")  # a former key disagreeing with its successor
    return {
        "yaml_syntax": (["--config", str(syntax)], [str(syntax), "line 3, column 8", "not valid YAML"]),
        "unknown_key": (["--config", str(unknown)], ["optim.momentun", "momentum", str(unknown)]),
        "bad_value": (["optim.name=lamb"], ["optim.name", "adamw | sgd | lars"]),
        "renamed_key": (["--config", str(renamed)], ["dist.backend", "dist.transport", str(renamed)]),
        "missing_file": (["--config", str(tmp_path / "nope.yaml")], ["nope.yaml", "does not exist"]),
        "unparsable_override": (["optim.betas=[0.9"], ["'optim.betas=[0.9'", "not valid YAML", "optim.betas=[a,b]"]),
    }


@pytest.mark.parametrize("case", ["yaml_syntax", "unknown_key", "bad_value", "renamed_key", "missing_file",
                                  "unparsable_override"])
def test_a_bad_config_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    args, must = _bad_configs(tmp_path)[case]
    assert_one_error_line(_train([*args, f"run_dir={tmp_path / 'run'}"]), *must)
    assert not (tmp_path / "run").exists()  # nothing was started


def test_an_unknown_key_is_blamed_on_the_override_or_the_file_that_gave_it(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("optim:\n  lr: 0.1\n")
    run_dir = f"run_dir={tmp_path / 'run'}"
    line = assert_one_error_line(_train(["--config", str(config), "foo.bar=", run_dir]), "unknown config key 'foo'",
                                 "from the command-line override 'foo.bar='", "optim, progress, run_dir")
    assert str(config) not in line
    config.write_text("foo:\n  bar: 1\n")
    line = assert_one_error_line(_train(["--config", str(config), "optim.lr=0.1", run_dir]), "unknown config key 'foo'",
                                 f"(in {config})", "optim, progress, run_dir")
    assert "override" not in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("inside", [False, True])
def test_a_run_dir_that_is_a_file_is_one_line_and_exit_2(tmp_path: Path, inside: bool) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("not a run directory\n")
    run_dir = file / "run" if inside else file
    line = assert_one_error_line(_train([*TINY, f"run_dir={run_dir}", "max_steps=1"]), f"'run_dir' = '{run_dir}'",
                                 f"{file} is a file, not a directory" if inside else "is a file, not a directory",
                                 "choose another run_dir")
    assert "flock" not in line
    assert file.read_text() == "not a run directory\n"


@pytest.mark.slow
@pytest.mark.parametrize("case", ["yaml_syntax", "renamed_key"])
def test_a_bad_config_shows_its_traceback_with_hs_debug(tmp_path: Path, case: str) -> None:
    args, _ = _bad_configs(tmp_path)[case]
    assert_shows_traceback([*args, f"run_dir={tmp_path / 'run'}"])


# ----------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------

MISSING_DATA = {
    "builtin": ["data.dataset=fashion_mnist", "data.path={missing}"],
    "webdataset": ["data.format=webdataset", "data.dataset=cifar10", "model.in_channels=3", "data.path={missing}"],
}


def _missing_data_args(tmp_path: Path, kind: str) -> list[str]:
    missing = tmp_path / "no-such-data"
    return [*TINY, f"run_dir={tmp_path / 'run'}", *(a.format(missing=missing) for a in MISSING_DATA[kind])]


@pytest.mark.parametrize("kind", list(MISSING_DATA))
def test_missing_data_path_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    assert_one_error_line(_train(_missing_data_args(tmp_path, kind)), "data.path", str(tmp_path / "no-such-data"))
    assert not ck.list_checkpoints(tmp_path / "run") and not (tmp_path / "run" / "config.yaml").exists()


@pytest.mark.slow
def test_missing_data_path_shows_its_traceback_with_hs_debug(tmp_path: Path) -> None:
    assert_shows_traceback(_missing_data_args(tmp_path, "webdataset"))


@pytest.mark.slow
def test_missing_data_path_under_torchrun_is_reported_once(tmp_path: Path) -> None:
    """Both ranks fail alike; rank 0 alone prints our line. torchrun then adds its own report (the failed
    ranks, exit codes and the time), whose root cause is our line (each rank hands it over in its error
    file, whichever torchrun dates first) instead of a link to torch's docs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("HS_DEBUG", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
           str(LAUNCH), *_missing_data_args(tmp_path, "webdataset")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    ours = [line for line in out.splitlines() if line.startswith("error:") and "data.path" in line]
    assert len(ours) == 1, out[-5000:]
    assert "hypersolid_scale" not in out.split(ours[0])[1], out[-5000:]  # no traceback of ours after it
    root_cause = out.split("Root Cause")[1]
    assert f"traceback : {ours[0]}" in root_cause, out[-5000:]


# ----------------------------------------------------------------------------------------------------------
# Checkpoints given by checkpoint.path
# ----------------------------------------------------------------------------------------------------------


def _make_checkpoint(tmp_path: Path, kind: str) -> Path:
    """A checkpoint for TINY's run that is ``kind``: missing, truncated, random, architecture, config."""
    cfg = load_config(None, [*TINY, "method.hypersolid.alpha=0.5"] if kind == "config" else TINY)
    weights = load_config(None, [*TINY, "model.small_cnn.width=8"]) if kind == "architecture" else cfg
    model, method = initial_weights(weights)
    state = {"model": model, "method": method, "step": 3, "epoch": 0, "config": to_dict(cfg),
             "config_fingerprint": fingerprint(cfg), "mlflow_run_id": None, "tracking_uri": None}
    path = ck.save_checkpoint(tmp_path / "source", state)
    if kind == "missing":
        path.unlink()
    elif kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "random":
        path.write_bytes(os.urandom(4096))
    elif kind == "run_directory":
        return ck.run_dir_of(path)  # type: ignore[return-value]
    elif kind == "checkpoints_directory":
        return path.parent
    elif kind == "empty_directory":
        (tmp_path / "empty").mkdir()
        return tmp_path / "empty"
    return path


CHECKPOINT_CASES = {
    "missing": ["checkpoint.path", "does not exist"],
    "truncated": ["checkpoint.path", "cut short"],
    "random": ["checkpoint.path", "not a PyTorch checkpoint"],
    "architecture": ["another architecture", "model.arch=small_cnn"],
    "config": ["cannot resume from", "the config differs"],
    # A directory: named as such, with the newest step_*.pt in it (or in its checkpoints/) as the likely file.
    "run_directory": ["checkpoint.path", "is a directory", "checkpoints/step_00000003.pt"],
    "checkpoints_directory": ["checkpoint.path", "is a directory", "checkpoints/step_00000003.pt"],
    "empty_directory": ["checkpoint.path", "is a directory", "holds no step_*.pt"],
}


@pytest.mark.parametrize("kind", list(CHECKPOINT_CASES))
def test_an_unusable_checkpoint_path_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = _make_checkpoint(tmp_path, kind)
    proc = _train([*TINY, f"run_dir={tmp_path / 'run'}", f"checkpoint.path={path}", "max_steps=4"])
    assert_one_error_line(proc, str(path), *CHECKPOINT_CASES[kind])
    assert not ck.list_checkpoints(tmp_path / "run")


@pytest.mark.slow
def test_an_unusable_checkpoint_shows_its_traceback_with_hs_debug(tmp_path: Path) -> None:
    path = _make_checkpoint(tmp_path, "random")
    assert_shows_traceback([*TINY, f"run_dir={tmp_path / 'run'}", f"checkpoint.path={path}", "max_steps=4"])


def test_a_good_checkpoint_path_still_starts_the_run(tmp_path: Path) -> None:
    """The reference for the cases above: the same checkpoint, undamaged, is resumed from."""
    path = _make_checkpoint(tmp_path, "good")
    proc = _train([*TINY, f"run_dir={tmp_path / 'run'}", f"checkpoint.path={path}", "max_steps=4"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert f"resumed from {path} at step 3" in proc.stdout
    assert [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(tmp_path / "run")] == [4]


# ----------------------------------------------------------------------------------------------------------
# A full disk while saving
# ----------------------------------------------------------------------------------------------------------


def _full_disk_args(tmp_path: Path) -> list[str]:
    return [*TINY, f"run_dir={tmp_path / 'run'}", "max_steps=4", "checkpoint.every_n_steps=2", "checkpoint.keep_last=0"]


@pytest.mark.parametrize("failure", list(FULL_DISK_WRAPPERS))
def test_a_full_disk_while_saving_is_one_line_and_keeps_the_previous_checkpoint(tmp_path: Path, failure: str) -> None:
    run_dir = tmp_path / "run"
    proc = _train(_full_disk_args(tmp_path), wrapper=FULL_DISK_WRAPPERS[failure])
    assert_one_error_line(proc, str(ck.checkpoint_path(run_dir, 4)), "No space left on device", "MiB free", "keep_last")
    assert [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir)] == [2]  # intact, readable
    assert not list(ck.checkpoint_dir(run_dir).glob("*.tmp"))


@pytest.mark.slow
def test_a_full_disk_shows_its_traceback_with_hs_debug(tmp_path: Path) -> None:
    assert_shows_traceback(_full_disk_args(tmp_path), wrapper=_FULL_DISK)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0, reason="mounting a tmpfs needs root")
@pytest.mark.parametrize("tensors", ["small", "large"])
def test_a_really_full_tmpfs_gives_the_same_line(tmp_path: Path, tensors: str) -> None:
    """The same, on a filesystem that really fills up: a tmpfs with room for one checkpoint and a half.

    Small tensors go through Python's file buffer, whose flush fails with an OSError; a large one is written
    straight through and torch's zip writer reports the failure as a RuntimeError of its own.
    """
    model = ["method.hypersolid.hidden_dim=512", "method.hypersolid.out_dim=512"] if tensors == "large" else []
    ref = tmp_path / "ref"
    assert _train([*TINY, *model, f"run_dir={ref}", "max_steps=2"]).returncode == 0
    size = ck.list_checkpoints(ref)[-1].stat().st_size
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={(size * 3 // 2) // 4096 * 4096 + 4096}",
                              "tmpfs", str(disk)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        run_dir = disk / "run"
        proc = _train([*TINY, *model, f"run_dir={run_dir}", "max_steps=4", "checkpoint.every_n_steps=2",
                       "checkpoint.keep_last=0"])
        assert_one_error_line(proc, str(ck.checkpoint_path(run_dir, 4)), "No space left on device", "MiB free")
        assert [ck.load_checkpoint(p)["step"] for p in ck.list_checkpoints(run_dir)] == [2]
        assert not list(ck.checkpoint_dir(run_dir).glob("*.tmp"))
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_atomic_save_on_a_full_disk_names_the_path_and_leaves_no_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "step_00000002.pt"
    ck.atomic_save({"a": torch.zeros(3)}, target)

    def full(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    with pytest.raises(CheckpointError, match=r"cannot write checkpoint .*step_00000004\.pt.*MiB free"):
        ck.atomic_save({"a": torch.ones(3)}, tmp_path / "step_00000004.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002.pt"]
    monkeypatch.undo()
    assert torch.equal(torch.load(target, weights_only=True)["a"], torch.zeros(3))


# ----------------------------------------------------------------------------------------------------------
# The tracking store at start: a URI that cannot work stops the run, a server that is down does not
# ----------------------------------------------------------------------------------------------------------


def _tracking_args(tmp_path: Path, uri: str) -> list[str]:
    return [*TINY, f"run_dir={tmp_path / 'run'}", "max_steps=4", "tracking.enabled=true",
            f"tracking.tracking_uri={uri}"]


def test_a_tracking_uri_that_cannot_work_stops_before_anything_is_written(tmp_path: Path) -> None:
    proc = _train(_tracking_args(tmp_path, "foo://bar"))
    assert_one_error_line(proc, "foo://bar", "tracking.tracking_uri")
    run_dir = tmp_path / "run"
    assert not (run_dir / "config.yaml").exists()
    assert not ck.list_checkpoints(run_dir) and not (run_dir / "tracking").exists()


def test_a_tracking_server_down_at_start_does_not_stop_training(tmp_path: Path) -> None:
    mlflow = pytest.importorskip("mlflow")
    from hypersolid_scale.tracking import sync_spool

    proc = _train(_tracking_args(tmp_path, f"http://127.0.0.1:{free_port()}"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "error:" not in out, out[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if "MLflow run" in line]
    assert "could not start the MLflow run" in line and "connection refused" in line, line
    run_dir = tmp_path / "run"
    assert ck.list_checkpoints(run_dir)
    # What the run logged waits in its spool; the hand sync sends it to a store that can be used.
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sent, left = sync_spool(run_dir, store)
    assert sent > 0 and left == 0
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("hypersolid").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["max_steps"] == "4" and "train/loss" in run.data.metrics


@pytest.mark.slow
def test_a_tracking_uri_that_cannot_work_shows_its_traceback_with_hs_debug(tmp_path: Path) -> None:
    assert_shows_traceback(_tracking_args(tmp_path, "foo://bar"))
