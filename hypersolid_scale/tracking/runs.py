"""Creating a tracker's MLflow run: at start, or later when the store could not be used at start.

A tracker whose store fails at start (a server that is down, a SQLite store that is locked or being created by
another process) trains under a local run id: its spool is ``spool-<local id>.jsonl``, and its header holds
what creating the run needs (``pending``). When the store answers, the run is created with the tag
``hypersolid.local_run_id`` and the spool (with its watermark) is renamed after the run's MLflow id; then
everything it holds is sent, in order. A try that created the run but died before the rename is found again by
that tag, so a run is never created twice.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hypersolid_scale.tracking.records import now_ms
from hypersolid_scale.tracking.spool import Spool, read_header, spool_path

LOCAL_ID_TAG = "hypersolid.local_run_id"


def run_spec(experiment: str, run_name: str, parent_run_id: str | None) -> dict:
    """What creating the run needs; its start time is now, when training starts."""
    return {"experiment": experiment, "run_name": run_name, "parent_run_id": parent_run_id, "start_time": now_ms()}


def _artifact_root(uri: str) -> str | None:
    if not uri.startswith("sqlite:///"):
        return None
    # Without this MLflow puts artifacts in ./mlruns of whatever directory we were started from.
    return (Path(uri[len("sqlite:///") :].split("?", 1)[0]).resolve().parent / "mlartifacts").as_uri()


def _experiment_id(client: Any, name: str, *, create_for: str | None = None) -> str | None:
    """The id of experiment ``name``; created (for the store ``create_for``) if missing, else None."""
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    if create_for is None:
        return None
    try:
        return client.create_experiment(name, artifact_location=_artifact_root(create_for))
    except Exception as err:  # another process created it first
        if getattr(err, "error_code", None) != "RESOURCE_ALREADY_EXISTS":
            raise
        return client.get_experiment_by_name(name).experiment_id


def find_created(client: Any, experiment: str, local_id: str) -> str | None:
    """The id of the run created for ``local_id`` in ``experiment``, or None."""
    from mlflow.entities import ViewType

    experiment_id = _experiment_id(client, experiment)
    if experiment_id is None:
        return None
    found = client.search_runs(
        [experiment_id], f"tags.`{LOCAL_ID_TAG}` = '{local_id}'", run_view_type=ViewType.ALL, max_results=1
    )
    return found[0].info.run_id if found else None


def open_run(client: Any, uri: str, spec: dict, local_id: str | None = None) -> str:
    """Create the run of ``spec`` (its experiment too if needed) and return its id; with ``local_id``, the run
    created for it earlier if there is one. Raises what MLflow raises."""
    experiment_id = _experiment_id(client, spec["experiment"], create_for=uri)
    tags = {"mlflow.parentRunId": spec["parent_run_id"]} if spec.get("parent_run_id") else {}
    if local_id is not None:
        found = find_created(client, spec["experiment"], local_id)
        if found is not None:
            return found
        tags[LOCAL_ID_TAG] = local_id
    run = client.create_run(experiment_id, start_time=spec.get("start_time"), run_name=spec["run_name"], tags=tags)
    return run.info.run_id


def create_pending(client: Any, uri: str, spool: Spool, spec: dict, local_id: str) -> str:
    """Create the run a spool was written for under ``local_id`` and give the spool the run's id."""
    run_id = open_run(client, uri, spec, local_id)
    spool.rename(run_id)
    return run_id


def pending_spec(path: Path, header: dict | None) -> dict | None:
    """What creating the run of the spool at ``path`` needs while it is not created (the spool still has the
    local id), else None."""
    if header is None or not isinstance(header.get("pending"), dict):
        return None
    return header["pending"] if path.name == spool_path(path.parent, str(header.get("run"))).name else None


def find_spool(directory: Path, run_id: str) -> Path | None:
    """The spool of ``run_id`` in ``directory``: its own, or, for a local id whose run has been created since,
    the spool renamed after the run."""
    path = spool_path(directory, run_id)
    if path.exists():
        return path
    for other in sorted(directory.glob("spool-*.jsonl")) if directory.is_dir() else []:
        header = read_header(other)
        if header is not None and header.get("pending") and header.get("run") == run_id:
            return other
    return None


def spool_run_id(path: Path) -> str:
    return os.path.basename(path)[len("spool-") : -len(".jsonl")]
