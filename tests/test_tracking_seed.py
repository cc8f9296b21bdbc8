"""A new SQLite store seeded from the cached empty store (hypersolid_scale/tracking/sqlite_seed.py) is the store
MLflow would have made by replaying its migrations: same schema, same rows, the default experiment under the
new store's own artifact root; an existing store is never replaced; a damaged template is made again."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from hypersolid_scale.tracking import sqlite_seed
from hypersolid_scale.tracking.client import make_client

# Columns that hold the time a row was made: equal only up to when each store was made.
TIME_COLUMNS = {"creation_time", "last_update_time"}


def _clauses(sql: str | None) -> list[str]:
    """A CREATE statement's clauses, sorted: MLflow's own migrations write a table's constraints in an order
    that changes from one store to the next (alembic's batch mode rebuilds tables from a set)."""
    return sorted(line.strip().rstrip(",").strip() for line in (sql or "").splitlines())


def _dump(db: Path) -> tuple[list, dict]:
    """The schema (every CREATE statement, as its clauses) and every table's rows, time columns left out."""
    con = sqlite3.connect(db)
    try:
        schema = sorted((kind, name, _clauses(sql)) for kind, name, sql in con.execute(
            "SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"))
        rows = {}
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
            cur = con.execute(f'SELECT * FROM "{table}"')
            keep = [i for i, d in enumerate(cur.description) if d[0] not in TIME_COLUMNS]
            rows[table] = sorted(tuple(r[i] for i in keep) for r in cur.fetchall())
        return schema, rows
    finally:
        con.close()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv(sqlite_seed.CACHE_ENV, str(folder))
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root (./mlruns) under tmp_path for both stores
    return folder


def test_a_seeded_store_is_the_store_mlflow_makes(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(sqlite_seed.SWITCH_ENV, "0")
    mine = make_client(f"sqlite:///{tmp_path / 'migrated' / 'mlflow.db'}")  # MLflow replays its migrations
    assert not cache.exists()
    monkeypatch.setenv(sqlite_seed.SWITCH_ENV, "1")
    seeded = make_client(f"sqlite:///{tmp_path / 'seeded' / 'mlflow.db'}")
    templates = list(cache.glob("mlflow-*-empty.db"))
    assert len(templates) == 1 and not list(cache.glob(".template-*"))  # made once, its work folder gone
    assert _dump(tmp_path / "migrated" / "mlflow.db") == _dump(tmp_path / "seeded" / "mlflow.db")
    assert [e.name for e in seeded.search_experiments()] == ["Default"]
    assert seeded.get_experiment("0").artifact_location == mine.get_experiment("0").artifact_location
    # The template itself has no default experiment: MLflow makes it per store, with that store's root.
    with sqlite3.connect(templates[0]) as con:
        assert con.execute("SELECT count(*) FROM experiments").fetchone() == (0,)
    con.close()
    # Both stores take a run alike.
    for client in (mine, seeded):
        run = client.create_run(client.create_experiment("e"))
        client.log_metric(run.info.run_id, "loss", 0.5, step=3)
        assert client.get_metric_history(run.info.run_id, "loss")[0].value == 0.5

    # A store that exists is never replaced, even an empty file; a damaged template is made again.
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"")
    assert not sqlite_seed.seed_new_store(existing) and existing.read_bytes() == b""
    templates[0].write_bytes(b"not a database")
    again = tmp_path / "again" / "mlflow.db"
    again.parent.mkdir()
    assert sqlite_seed.seed_new_store(again)
    assert sqlite_seed._intact(templates[0]) and _dump(again)[0] == _dump(tmp_path / "seeded" / "mlflow.db")[0]


def test_without_a_cache_folder_the_store_is_left_to_mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv(sqlite_seed.CACHE_ENV, str(blocked / "cache"))
    db = tmp_path / "run" / "mlflow.db"
    db.parent.mkdir()
    assert not sqlite_seed.seed_new_store(db) and not db.exists()  # MLflow makes it when it opens it
