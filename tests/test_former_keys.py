"""The table of former config keys (config/former_keys.py): every config ever committed under configs/ still
loads, each former key is read under its present name with one note, and the table is the only place that
renames a key."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from hypersolid_scale.config import former_keys
from hypersolid_scale.config.former_keys import FORMER_KEYS, former_keys_in, rename_former_keys
from hypersolid_scale.config.schema import from_dict, load_config, to_dict
from hypersolid_scale.config.sweep import load_sweep
from hypersolid_scale.safety.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout


def _history() -> list[str]:
    """Every commit of this branch's history that changed configs/, oldest first. (This branch's, not
    ``--all``: another branch may add a key this code does not have yet.)"""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git checkout: the history of configs/ is not available")
    return _git("log", "--reverse", "--format=%H", "HEAD", "--", "configs/").split()


def _blobs(ids: set[str]) -> dict[str, bytes]:
    """The contents of git blobs, read by one ``git cat-file --batch`` (not one process per file and commit)."""
    order = sorted(ids)
    asked = "".join(f"{b}\n" for b in order).encode()
    raw = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch"], input=asked, capture_output=True,
                         check=True).stdout
    out, at = {}, 0
    for blob in order:  # each answer: "<sha> blob <size>\n<content>\n"
        header_end = raw.index(b"\n", at)
        sha, kind, size = raw[at:header_end].split()
        assert sha.decode() == blob and kind == b"blob", raw[at:header_end]
        out[blob] = raw[header_end + 1:header_end + 1 + int(size)]
        at = header_end + 1 + int(size) + 1
    return out


@pytest.fixture(scope="module")
def committed_configs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every distinct version of every file ever committed under configs/, as the tree of the first commit
    that held it (a sweep names its base from that tree): {"<sha8>:<path>": file}."""
    out: dict[str, Path] = {}
    seen: set[str] = set()
    trees = {sha: [line.split(None, 3)[2:] for line in _git("ls-tree", "-r", sha, "--", "configs/").splitlines()]
             for sha in _history()}
    blobs = _blobs({blob for files in trees.values() for blob, _ in files})
    for sha, files in trees.items():
        tree = tmp_path_factory.mktemp(sha[:8])
        for blob, path in files:
            dest = tree / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(blobs[blob])
            content = json.dumps(yaml.safe_load(dest.read_text()), sort_keys=True) if path.endswith(".yaml") else ""
            if content and content not in seen:  # versions differing only in comments load alike: once
                seen.add(content)
                out[f"{sha[:8]}:{path}"] = dest
    assert out, "no config was ever committed under configs/?"
    return out


@pytest.mark.slow  # ~150 configs, ~30 s on 2 cores
def test_every_config_ever_committed_still_loads(committed_configs: dict[str, Path], monkeypatch) -> None:
    failed = []
    for name, path in committed_configs.items():
        monkeypatch.chdir(path.parents[len(Path(name.split(":", 1)[1]).parts) - 1])  # that commit's root
        try:
            if "base" in (yaml.safe_load(path.read_text()) or {}):
                load_sweep(path)
            else:
                load_config(path, ["run_dir=runs/former-keys-test"])
        except ConfigError as err:
            failed.append(f"{name}: {err}")
    assert not failed, "\n".join(failed)


def test_old_configs_in_history_use_former_keys_and_read_like_today_s(committed_configs: dict[str, Path]) -> None:
    """The history holds configs written with former keys (else the test above proves nothing about the table),
    and such a config reads exactly as the same file written in present names."""
    olds: dict[tuple[str, ...], tuple[str, Path]] = {}  # one config per set of former keys used
    for name, path in committed_configs.items():
        raw = yaml.safe_load(path.read_text()) or {}
        if "base" not in raw and (used := tuple(former_keys_in(raw))):
            olds.setdefault(used, (name, path))
    assert olds, "no committed config uses a former key: the test above does not exercise the table"
    for name, path in olds.values():
        raw = yaml.safe_load(path.read_text())
        present = path.with_name(f"present-{path.name}")
        present.write_text(yaml.safe_dump(rename_former_keys(raw, name, note=False)))
        assert former_keys_in(yaml.safe_load(present.read_text())) == []
        run = ["run_dir=runs/x"]
        assert to_dict(load_config(path, run)) == to_dict(load_config(present, run)), name


# Every leaf key of the table (a section such as loss.<method> moves as its leaves do; data.dataset: below).
LEAVES = [k for k, f in FORMER_KEYS.items() if f.when is None and "." in k and (k == "loss.name" or k[:5] != "loss.")]


@pytest.mark.parametrize("old", LEAVES)
def test_each_former_key_is_read_under_its_present_name_in_a_file_an_override_and_a_stored_config(
    tmp_path: Path, old: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(former_keys, "_noted", set())
    monkeypatch.delenv("RANK", raising=False)
    former = FORMER_KEYS[old]
    assert former.new is not None
    default = load_config(None, [])
    value = _a_value(to_dict(default), former.new)
    said = next((k for k, v in former.values.items() if v == value), value)  # its former spelling
    webdataset = former.new.startswith(("data.webdataset.", "data.views"))
    base = ["data.format=webdataset", "data.path=/d"] if webdataset else []
    want = to_dict(load_config(None, [*base, f"{former.new}={value}"]))
    assert to_dict(load_config(None, [*base, f"{old}={said}"])) == want
    assert f"'{old}' (the override '{old}={said}') is read as '{former.new}'" in capsys.readouterr().err
    f = tmp_path / "c.yaml"
    layer: dict = {}
    for part in reversed(old.split(".")):
        layer = {part: layer or said}
    f.write_text(yaml.safe_dump(layer))
    assert to_dict(load_config(f, base)) == want
    stored = to_dict(load_config(None, [*base, f"{former.new}={value}"]))
    section, _, leaf = former.new.rpartition(".")
    node = stored
    for part in section.split("."):
        node = node[part]
    node.pop(leaf)
    old_node = stored
    for part in old.split(".")[:-1]:
        old_node = old_node.setdefault(part, {})
    old_node[old.split(".")[-1]] = said
    assert to_dict(from_dict(stored)) == want


def _a_value(d: dict, dotted: str) -> object:
    """A value for ``dotted`` other than its default (so that reading it is seen), of the right type."""
    for part in dotted.split("."):
        d = d[part]
    choices = {
        "data.views_on": "device",
        "dist.precision": "fp32",
        "dist.transport": "gloo",
        "method.name": "simclr",
        "data.ffcv.order": "random",
        "data.max_pretrain_samples": 8,
        "data.webdataset.max_lost_fraction": 0.5,
    }
    if dotted in choices:
        return choices[dotted]
    if isinstance(d, bool):
        return not d
    if isinstance(d, (int, float)):
        return d + 3 if d else 3
    if d is None or isinstance(d, str):
        return "/somewhere/manifest.json"
    raise AssertionError(f"no test value for {dotted} = {d!r}")


# Where config keys may be renamed: the table, and the packages' own dataclasses (none of them may).
_RENAMING = re.compile(r"_RENAMED\b|move_loss_section|bf16_as_precision|_FORMAT_NAMES\b")


def test_the_table_is_the_only_place_that_renames_a_key() -> None:
    found = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in sorted((ROOT / "hypersolid_scale").rglob("*.py"))
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if _RENAMING.search(line)
    ]
    assert not found, found


def test_a_removed_key_is_left_out_with_a_note_saying_why(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(former_keys, "_noted", set())
    monkeypatch.delenv("RANK", raising=False)
    table = {**FORMER_KEYS, "optim.gone": former_keys.Former(None, "it never changed the training")}
    monkeypatch.setattr(former_keys, "FORMER_KEYS", table)
    d = {"optim": {"gone": 3, "lr": 0.5}, "seed": 1}
    assert rename_former_keys(d, "in x.yaml") == {"optim": {"lr": 0.5}, "seed": 1}
    assert d == {"optim": {"gone": 3, "lr": 0.5}, "seed": 1}  # the layer itself is not changed
    err = capsys.readouterr().err
    assert "note: config key 'optim.gone' (in x.yaml) is removed, and left out: it never changed the training" in err
    assert rename_former_keys(d, "in y.yaml") == {"optim": {"lr": 0.5}, "seed": 1}
    assert capsys.readouterr().err == ""  # said once per key and process
