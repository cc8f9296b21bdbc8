"""Sending a spool's pending records to MLflow, in order, without ever stopping training.

Sends fail fast (the client makes one attempt with a short HTTP timeout, see ``client.py``); after a
failure the outbox goes offline, prints one warning, and later calls retry with exponential backoff. When
the server is back the backlog goes out in order. Records carry their own timestamps and MLflow drops exact
duplicate metrics, so a record sent twice (after a kill between a send and its watermark) counts once. A run
that could not be created at start is created first (``runs.py``), with the same backoff.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import Any

from hypersolid_scale.tracking.client import make_client
from hypersolid_scale.tracking.records import BATCH_LIMITS
from hypersolid_scale.tracking.runs import create_pending
from hypersolid_scale.tracking.spool import Spool

log = logging.getLogger(__name__)

# Errors that mean "this record will never be accepted", as opposed to "the server is not there".
PERMANENT_ERRORS = {
    "INVALID_PARAMETER_VALUE",
    "BAD_REQUEST",
    "INVALID_STATE",
    "RESOURCE_DOES_NOT_EXIST",
    "RESOURCE_ALREADY_EXISTS",
    "MALFORMED_REQUEST",
}
_MAX_BACKOFF_S = 60.0


def is_permanent(err: Exception) -> bool:
    if isinstance(err, FileNotFoundError):
        return True  # a staged artifact that vanished will never upload
    return getattr(err, "error_code", None) in PERMANENT_ERRORS


class Outbox:
    """Sends a spool's pending records in order; goes offline on failure and retries with backoff.

    ``client``: None to make it at the first send. ``to_create``: the run is not created yet (``run_id`` is a
    local id): what creating it needs; once created, ``run_id`` is the run's id and the spool is named after it.
    """

    def __init__(
        self, client: Any, uri: str, run_id: str, spool: Spool, sync_every_s: float, to_create: dict | None = None
    ):
        self.client, self.uri, self.run_id, self.spool = client, uri, run_id, spool
        self.to_create = to_create
        self.sync_every_s = sync_every_s
        self.online = True
        self._backoff = 1.0
        self._retry_at = 0.0
        self._last_sync = time.monotonic()
        self.refused = 0
        self._refusals_warned: set[tuple[str, str]] = set()

    def sync(self, force: bool = False) -> bool:
        """Send what is due; True when nothing is left pending. Never raises for a missing server."""
        pending = self.spool.pending
        now = time.monotonic()
        if not pending and self.to_create is None:
            return True
        if not force and (
            now < self._retry_at or (self.online and now - self._last_sync < self.sync_every_s and len(pending) < 1000)
        ):
            return False
        try:
            if self.client is None:
                self.client = make_client(self.uri)
            if self.to_create is not None:
                local_id = self.run_id
                self.run_id = create_pending(self.client, self.uri, self.spool, self.to_create, local_id)
                self.to_create = None
                log.info("MLflow run %s created at %s (spooled as %s)", self.run_id, self.uri, local_id)
        except Exception as err:  # noqa: BLE001 - the store is still not usable: try again later
            self.went_offline(err, time.monotonic())
            return False
        sent = 0
        while pending:
            batch = self._next_batch()
            try:
                self._send(batch)
            except Exception as err:  # noqa: BLE001 - any failure to reach the store is handled alike
                if not is_permanent(err) or not self._send_one_by_one(batch):
                    self.went_offline(err, time.monotonic())
                    return False
            for _ in batch:
                pending.popleft()
            self.spool.mark_synced(batch[-1]["_end"])
            sent += len(batch)
        if not self.online:
            log.info("tracking server %s is back: sent %d buffered records", self.uri, sent)
        self.online, self._backoff, self._last_sync = True, 1.0, now
        return True

    def _next_batch(self) -> list[dict]:
        """The longest prefix of pending records that fits one log_batch call (or one other call)."""
        first = self.spool.pending[0]
        if first["kind"] not in BATCH_LIMITS:
            return [first]
        counts = dict.fromkeys(BATCH_LIMITS, 0)
        batch: list[dict] = []
        for record in self.spool.pending:
            kind = record["kind"]
            if kind not in BATCH_LIMITS:
                break
            counts[kind] += len(record["values"])
            if batch and (counts[kind] > BATCH_LIMITS[kind] or sum(counts.values()) > 1000):
                break
            batch.append(record)
        return batch

    def _send(self, batch: list[dict]) -> None:
        from mlflow.entities import Metric, Param, RunTag

        kind = batch[0]["kind"]
        if kind == "artifact":
            staged = Path(batch[0]["staged"])
            if not staged.exists():
                raise FileNotFoundError(f"staged artifact {staged} is gone")
            self.client.log_artifact(self.run_id, str(staged), batch[0].get("artifact_path"))
            shutil.rmtree(staged.parent, ignore_errors=True)
        elif kind == "status":
            if batch[0]["status"] == "RUNNING":
                self.client.update_run(self.run_id, status="RUNNING")
            else:
                self.client.set_terminated(self.run_id, batch[0]["status"], end_time=batch[0]["time"])
        else:
            metrics = [
                Metric(k, v, r["time"], r["step"])
                for r in batch
                if r["kind"] == "metrics"
                for k, v in r["values"].items()
            ]
            params = [Param(k, v) for r in batch if r["kind"] == "params" for k, v in r["values"].items()]
            tags = [RunTag(k, v) for r in batch if r["kind"] == "tags" for k, v in r["values"].items()]
            self.client.log_batch(self.run_id, metrics=metrics, params=params, tags=tags)

    def _send_one_by_one(self, batch: list[dict]) -> bool:
        """After a refusal, send each value alone and drop (with a warning) only those refused."""
        for record in batch:
            items = (
                [{**record, "values": {k: v}} for k, v in record["values"].items()] if "values" in record else [record]
            )
            for item in items:
                try:
                    self._send([item])
                except Exception as err:  # noqa: BLE001
                    if not is_permanent(err):
                        return False
                    self.refused += 1
                    reason = (record["kind"], getattr(err, "error_code", type(err).__name__))
                    if reason not in self._refusals_warned:  # once per kind of refusal, not per record
                        self._refusals_warned.add(reason)
                        log.warning(
                            "MLflow refused a %s record for run %s; dropped: %s",
                            record["kind"],
                            self.run_id,
                            str(err).splitlines()[0],
                        )
        return True

    def went_offline(self, err: Exception, now: float, announce: bool = True) -> None:
        if self.online and announce:
            log.warning(
                "tracking server %s is unreachable (%s); training goes on, records are kept in %s "
                "and sent when it is back",
                self.uri,
                str(err).splitlines()[0][:200],
                self.spool.path,
            )
        self.online = False
        self._retry_at = now + self._backoff
        self._backoff = min(self._backoff * 2, _MAX_BACKOFF_S)
