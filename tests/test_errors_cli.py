"""``errors.run_cli`` in one process: what it prints, the exit codes, the log file, what it hands torchrun."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hypersolid_scale.safety.errors import ConfigError, DataError, run_cli


def _fail(err: BaseException):
    def main(_argv):
        raise err
    return main


@pytest.fixture
def launched(monkeypatch):
    """As a worker of a 2-process torchrun job, with ``rank``."""
    def set_rank(rank: int, tmp_path: Path) -> Path:
        error_file = tmp_path / f"error-{rank}.json"
        for key, value in {"RANK": str(rank), "WORLD_SIZE": "2", "TORCHELASTIC_ERROR_FILE": str(error_file)}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("HS_DEBUG", raising=False)
        return error_file
    return set_rank


def test_a_user_error_is_one_line_exit_2_and_the_traceback_goes_to_the_log(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HS_DEBUG", raising=False)
    log = tmp_path / "logs" / "errors.log"
    assert run_cli(_fail(DataError("shard x is damaged")), [], log_file=lambda: log) == 2
    assert capsys.readouterr().err == "error: shard x is damaged\n"
    assert "Traceback" in log.read_text() and "DataError: shard x is damaged" in log.read_text()


def test_with_hs_debug_the_error_propagates_and_is_still_logged(tmp_path, monkeypatch):
    monkeypatch.setenv("HS_DEBUG", "1")
    log = tmp_path / "errors.log"
    with pytest.raises(DataError):
        run_cli(_fail(DataError("shard x is damaged")), [], log_file=lambda: log)
    assert "DataError: shard x is damaged" in log.read_text()


def test_the_printed_line_is_handed_to_torchrun_as_the_root_cause(tmp_path, capsys, launched):
    error_file = launched(0, tmp_path)
    assert run_cli(_fail(DataError("shard x is damaged")), []) == 2
    line = capsys.readouterr().err.strip()
    assert line == "[rank 0] error: shard x is damaged"
    entry = json.loads(error_file.read_text())["message"]
    assert entry["message"] == line and entry["extraInfo"]["py_callstack"] == line


def test_a_rank_that_does_not_print_a_shared_error_hands_torchrun_the_same_line_a_second_later(
    tmp_path, capsys, launched
):
    """Every rank meets a bad config; rank 0 alone prints it. Rank 1's error file holds the same line, so
    torchrun's root cause is that line even when rank 1's exit is the one it dates first."""
    error_file = launched(1, tmp_path)
    before = int(time.time())
    assert run_cli(_fail(ConfigError("model.arch: 'resnet7' is not one of ...")), []) == 2
    assert capsys.readouterr().err == ""
    entry = json.loads(error_file.read_text())["message"]
    assert entry["message"] == "error: model.arch: 'resnet7' is not one of ..."
    assert before + 1 <= int(entry["extraInfo"]["timestamp"]) <= int(time.time()) + 1


def test_a_rank_stopped_by_a_lost_peer_points_at_the_other_rank(tmp_path, capsys, launched):
    error_file = launched(1, tmp_path)
    gone = RuntimeError("[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [127.0.0.1]:51846")
    before = int(time.time())
    assert run_cli(_fail(gone), []) == 1
    err = capsys.readouterr().err
    assert err.startswith("[rank 1] error: stopped because another rank stopped first") and "internal" not in err
    # Dated a second later than now: torchrun takes the earliest failure (in whole seconds) as the root
    # cause, so the rank that really failed wins a tie.
    dated = int(json.loads(error_file.read_text())["message"]["extraInfo"]["timestamp"])
    assert before + 1 <= dated <= int(time.time()) + 1


def test_a_bug_on_one_process_is_still_called_internal(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HS_DEBUG", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    gone = RuntimeError("Connection closed by peer")  # no other rank to blame without a launcher
    assert run_cli(_fail(gone), []) == 1
    assert "an internal error" in capsys.readouterr().err
