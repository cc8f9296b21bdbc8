"""Bad input to ``launch/eval.py``, run as a user runs it: one ``error:`` line that names the file or key and
the fix, exit code 2, no traceback (unless HS_DEBUG=1; it always goes to ``<output dir>/errors.log``)."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import torch
from _errors import assert_one_error_line
from _eval_helpers import TINY_MODEL, make_checkpoint, run_launch_eval

from hypersolid_scale.checkpoint import initial_weights
from hypersolid_scale.config.schema import load_config

# Words of an instruction: every message must say what to do, not only what went wrong.
FIX = re.compile(r"\b(use|pass|point|choose|write|evaluate|copy|list|set|upgrade|correct|drop|remove)\b", re.IGNORECASE)


def assert_error_with_fix(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The single ``error:`` line of a run that exited 2; it holds every needle and an instruction."""
    line = assert_one_error_line(proc, *needles)
    assert FIX.search(line), f"no instruction in {line!r}"
    return line


def evaluate(checkpoint: Path, *args: str, debug: bool = False) -> subprocess.CompletedProcess:
    return run_launch_eval("--checkpoint", str(checkpoint), "--no-mlflow", "--suite", "knn", *args, debug=debug)


def test_missing_checkpoint(tmp_path: Path) -> None:
    missing = tmp_path / "run" / "checkpoints" / "step_00000001.pt"
    line = assert_error_with_fix(evaluate(missing), str(missing))
    assert "does not exist" in line
    assert not (tmp_path / "run" / "eval").exists()  # no output folder, no errors.log for a mistyped path


def test_truncated_checkpoint(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert_error_with_fix(evaluate(path), str(path))


def test_random_bytes_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "step_00000001.pt"
    path.write_bytes(random.Random(0).randbytes(4096))
    assert_error_with_fix(evaluate(path), str(path))


def test_model_override_is_refused(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    line = assert_error_with_fix(evaluate(path, "model.arch=resnet18"), "'model.arch=resnet18'", str(path))
    assert "not allowed" in line


def test_weights_of_another_architecture(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run", ["model.arch=resnet18"])
    ckpt = torch.load(path, weights_only=True)
    ckpt["model"] = initial_weights(load_config(None, TINY_MODEL))[0]  # small_cnn weights
    torch.save(ckpt, path)
    line = assert_error_with_fix(evaluate(path), str(path), "resnet18")
    assert "architecture" in line


def test_projector_features_of_a_checkpoint_without_its_head(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    ckpt = torch.load(path, weights_only=True)
    ckpt["method"] = None  # a backbone alone: no projection head to read
    torch.save(ckpt, path)
    line = assert_error_with_fix(evaluate(path, "--features", "projector"), "--features projector",
                                 "no projection head")
    assert "--features backbone" in line


def test_unknown_override_key(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    line = assert_error_with_fix(evaluate(path, "eval.no_such_key=1"), "eval.no_such_key", str(path))
    assert "knn_k" in line  # the keys that section does accept


def test_unknown_suite(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    assert_error_with_fix(run_launch_eval("--checkpoint", str(path), "--no-mlflow", "--suite", "knn,tsne"),
                          "eval.suites", "'tsne'")


def test_missing_evaluation_data(tmp_path: Path) -> None:
    # A checkpoint trained elsewhere: its config records a data folder that this machine does not have.
    elsewhere = tmp_path / "other_machine" / "fashion_mnist"
    path = make_checkpoint(tmp_path / "run", ["data.dataset=fashion_mnist", f"data.path={elsewhere}"])
    assert_error_with_fix(evaluate(path), str(elsewhere), "data.path=")


def test_traceback_in_the_log_and_with_hs_debug(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    out = tmp_path / "out"
    assert_error_with_fix(evaluate(path, "--output-dir", str(out), "eval.no_such_key=1"), "eval.no_such_key")
    log = (out / "errors.log").read_text()
    assert "Traceback" in log and "ConfigError" in log and "eval.no_such_key" in log
    debug = evaluate(path, "eval.no_such_key=1", debug=True)
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ConfigError" in debug.stderr


def test_unparsable_override(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    line = assert_error_with_fix(evaluate(path, "eval.knn_k=[5"), "'eval.knn_k=[5'", "not valid YAML",
                                 "eval.knn_k=[a,b]")
    assert "ParserError" not in line


def test_a_directory_as_checkpoint_names_the_file_in_it(tmp_path: Path) -> None:
    path = make_checkpoint(tmp_path / "run")
    for given in (tmp_path / "run", path.parent):
        line = assert_error_with_fix(evaluate(given), f"{str(given)!r} is a directory", str(path))
        assert "does not exist" not in line
    (tmp_path / "empty").mkdir()
    assert_error_with_fix(evaluate(tmp_path / "empty"), "is a directory", "holds no step_*.pt")
