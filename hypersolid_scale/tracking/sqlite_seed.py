"""A new SQLite store starts as a copy of an empty one at MLflow's current schema, made once per MLflow version.

MLflow creates a new SQLite store's schema by replaying all of its migrations (alembic, about 1.7 s of CPU on
a 2-core machine, and 5-10 s of wall time waiting on the disk: each migration commits on its own). Every run
has its own store by default (``<run_dir>/mlflow.db``), so every new run paid that at its start. Here the
first new store of an MLflow version is created by MLflow itself in a cache folder, its default experiment
removed (MLflow recreates it when it opens a store that has none, with the artifact root of that store); every
later new store is a copy of that file. MLflow opens the copy as it opens any store it made: it checks the
schema revision against its own head and refuses a store it does not know (``_verify_schema``), so a cache of
another version can never be used silently, and the key includes the version anyway.

No library does this: MLflow has no option to skip or batch its migrations for a new SQLite file. A damaged
template is made again; anything else that goes wrong here (no cache folder, no hard links) leaves the new
store to MLflow, as before: the copy is only a shortcut. Called under the schema lock of
``client._schema_lock``, so one process seeds a store.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from hypersolid_scale.safety.atomic import commit, temp_path

# Where the templates live: $HYPERSOLID_CACHE_DIR, else $XDG_CACHE_HOME/hypersolid_scale, else
# ~/.cache/hypersolid_scale. Setting HYPERSOLID_MLFLOW_SEED=0 turns the shortcut off.
CACHE_ENV = "HYPERSOLID_CACHE_DIR"
SWITCH_ENV = "HYPERSOLID_MLFLOW_SEED"


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hypersolid_scale"


def seed_new_store(db: Path) -> bool:
    """Copy the template into ``db`` if ``db`` does not exist yet; whether it did. Never replaces a file: the
    copy is committed with ``replace=False``, which fails if another process made the store meanwhile."""
    if os.environ.get(SWITCH_ENV, "1") == "0":
        return False
    try:
        if db.exists():
            return False
        tmp = temp_path(db)
        try:
            shutil.copyfile(_template(), tmp)
            commit(tmp, db, replace=False)  # whole or not at all, and never over a store that exists
        finally:
            tmp.unlink(missing_ok=True)
        return True
    except Exception:  # noqa: BLE001 - only a shortcut: MLflow makes the store itself, as without it
        return False


def _template() -> Path:
    """The empty store at this MLflow version's schema, made now if the cache has none."""
    import mlflow

    folder = cache_dir()
    path = folder / f"mlflow-{mlflow.__version__}-empty.db"
    if path.is_file():
        if _intact(path):
            return path
        path.unlink(missing_ok=True)  # damaged (a disk error, a hand edit): made again below
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".template-") as work:
        made = Path(work) / "empty.db"
        _create_with_mlflow(made, Path(work) / "artifacts")
        with sqlite3.connect(made) as con:
            # The default experiment names the artifact root of the store it was made in: MLflow makes it
            # again, with the right root, when it opens a store without one.
            con.execute("DELETE FROM experiment_tags WHERE experiment_id = 0")
            con.execute("DELETE FROM experiments WHERE experiment_id = 0")
        con.close()
        commit(made, path)  # two processes making it at once: the last one's file, both complete
    return path


def _intact(path: Path) -> bool:
    """A SQLite file that passes SQLite's own check and carries one schema revision (milliseconds)."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ok = con.execute("PRAGMA quick_check").fetchone() == ("ok",)
            return ok and len(con.execute("SELECT version_num FROM alembic_version").fetchall()) == 1
        finally:
            con.close()
    except sqlite3.Error:
        return False


def _create_with_mlflow(db: Path, artifacts: Path) -> None:
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{db}"
    store = SqlAlchemyStore(uri, str(artifacts))
    store.engine.dispose()
    engines = getattr(SqlAlchemyStore, "_engine_map", None)
    if isinstance(engines, dict):
        engines.pop(uri, None)
