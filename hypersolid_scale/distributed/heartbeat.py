"""A rank or node that vanishes stops the others within ``dist.peer_timeout_s``, not ``dist.timeout_minutes``.

When a node loses power or its link, nothing resets the other ranks' connections: they wait in the step's
collective until the process group's timeout (30 minutes by default; NCCL does not notice a dead peer either).
A shorter collective timeout would also stop healthy runs whose ranks wait for one another for good reasons (rank 0
evaluating or writing a checkpoint to a slow disk, a first compiled step), and a watchdog on the step would need a
bound on every step. What is to be known is whether the peers are alive, so that is what is measured: a
heartbeat through the store the group met through (torchrun's agent store on node 0, or rank 0's under srun, at
MASTER_ADDR:MASTER_PORT). Each rank's daemon thread writes its own counter there every ``peer_timeout_s / 5``
and reads everybody's in the same round trip; a rank whose counter has not moved for ``peer_timeout_s`` (as of
the store's last answer) is lost, and so is the store when it has not answered for that long (node 0 down, or this
node cut off): :func:`verdict`. A second thread
judges from what the first has seen, since the store's calls can block past their own timeout on a cut link.
Both run while the main thread waits in a collective (which releases the GIL), and a slow rank keeps beating.

On a verdict the rank prints one line (the lost node and ranks, and the newest checkpoint, from which a rerun
resumes), hands it to torchrun as the failure's cause, and exits with :data:`EXIT_PEER_LOST` at once: a
collective blocked on a dead peer cannot be interrupted otherwise. Each surviving rank judges for itself, so the
ranks of a node leave together and torchrun's agent has no worker to wait for. A rank that leaves normally
(finished, preempted, or stopped by its own error) says so first, and is not reported.
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

import torch.distributed as dist

from hypersolid_scale.distributed.collectives import broadcast_object, get_rank, get_world_size
from hypersolid_scale.distributed.process_group import elastic_restart, has_process_group
from hypersolid_scale.safety.errors import peer_gone, tell_launcher

EXIT_PEER_LOST = 69  # EX_UNAVAILABLE: a peer (or the rendezvous store) is gone
LEFT = "left"  # a counter's last value when its rank stopped on purpose


def _node_label(master: str) -> str:
    """This rank's node, as the line names it: the launcher's node index, host name and the address it talks from."""
    node = os.environ.get("GROUP_RANK") or os.environ.get("SLURM_NODEID") or "0"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet: only the route is looked up
            probe.connect((master, 9))
            addr = probe.getsockname()[0]
    except OSError:
        addr = "?"
    return f"node {node} ({socket.gethostname()}, {addr})"


def _ranges(ranks: list[int]) -> str:
    """[2, 3, 4, 7] -> '2-4, 7'."""
    parts: list[str] = []
    for r in sorted(ranks):
        if parts and r == int(parts[-1].split("-")[-1]) + 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{r}"
        else:
            parts.append(str(r))
    return ", ".join(parts)


def verdict(
    now: float, answered: float, changed: list[float], left: list[bool], timeout: float
) -> tuple[float, list[int]] | None:
    """What a rank concludes at ``now`` (None: nothing lost): ``(silence, [])`` when the store has not answered for
    over ``timeout`` s since ``answered``, else ``(silence, ranks)`` when some rank's counter (last ``changed`` at
    those times; a rank that ``left`` on purpose is never silent) has not moved for over ``timeout``. A counter's
    silence is known only up to the store's last answer: measured to ``now``, a store that stopped answering (this
    node cut off) would make every peer look lost, this rank's own counter included, before the store itself did."""
    if now - answered > timeout:
        return now - answered, []
    silent = [0.0 if gone else answered - t for t, gone in zip(changed, left)]
    if max(silent) <= timeout:
        return None
    # The ranks of a node that died together beat at different moments: name every rank silent for over half the
    # timeout (a live one is at most two intervals behind, 0.4 of it).
    return max(silent), [r for r, quiet in enumerate(silent) if quiet > timeout / 2]


class Heartbeat:
    """This rank's heartbeat and its judgement of the others' (see the module docstring); :meth:`stop` ends it."""

    def __init__(self, timeout_s: float, newest_checkpoint: Callable[[], str]) -> None:
        self.rank, self.world = get_rank(), get_world_size()
        self.timeout, self.interval = timeout_s, timeout_s / 5
        self.newest_checkpoint = newest_checkpoint
        self.master = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        token = broadcast_object(uuid.uuid4().hex if self.rank == 0 else None)  # this group's keys, nobody else's
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self.store = dist.PrefixStore(f"/hypersolid/heartbeat/{token}", store)
        self.store.set(f"node/{self.rank}", _node_label(os.environ["MASTER_ADDR"]))
        self.store.set(f"beat/{self.rank}", "0")
        self.keys = [f"beat/{r}" for r in range(self.world)]
        self.store.wait(self.keys)  # every rank is past the process group's start: each writes its key at once
        self.nodes = [v.decode() for v in self.store.multi_get([f"node/{r}" for r in range(self.world)])]
        now = time.monotonic()
        self.seen: list[bytes] = [b""] * self.world  # each rank's counter when it last changed, and when that was
        self.changed, self.answered = [now] * self.world, now
        # stopping: stop() began (no more beats); stopped: this rank's LEFT is written (no more judging)
        self.stopping, self.stopped, self.decided = threading.Event(), threading.Event(), threading.Event()
        self.writing = threading.Lock()
        self.threads = [
            threading.Thread(target=self._beat, name="hypersolid-heartbeat", daemon=True),
            threading.Thread(target=self._judge, name="hypersolid-heartbeat-judge", daemon=True),
        ]
        for thread in self.threads:
            thread.start()

    def _beat(self) -> None:
        count = 0
        while not self.stopping.is_set():
            count += 1
            try:
                with self.writing:  # never after stop()'s LEFT
                    if self.stopping.is_set():
                        return
                    self.store.set(f"beat/{self.rank}", str(count))
                values = self.store.multi_get(self.keys)
            except Exception:  # noqa: BLE001 - unreachable, reset, timed out: the judge counts the silence
                self.stopping.wait(self.interval)
                continue
            now = time.monotonic()
            for r, value in enumerate(values):
                if value != self.seen[r]:
                    self.seen[r], self.changed[r] = value, now
            self.answered = now
            self.stopping.wait(self.interval)

    def _judge(self) -> None:
        while not self.stopped.wait(self.interval / 2):
            left = [value == LEFT.encode() for value in self.seen]
            found = verdict(time.monotonic(), self.answered, self.changed, left, self.timeout)
            if found is not None and not found[1]:
                self._leave(
                    f"lost the rendezvous store at {self.master} (on node 0: node 0 is down, or this node is cut "
                    f"off): no answer for {found[0]:.0f} s"
                )
            elif found is not None:
                self._leave(f"lost {self._name(found[1])}: no heartbeat for {found[0]:.0f} s")

    def _name(self, lost: list[int]) -> str:
        """'node 1 (host, 10.0.0.2; ranks 2-3)', or 'rank 3 of node 1 (...)' when the rest of that node is alive."""
        names = []
        for node in dict.fromkeys(self.nodes[r] for r in lost):
            of_node = [r for r in range(self.world) if self.nodes[r] == node]
            gone = [r for r in lost if self.nodes[r] == node]
            head, detail = node.split(" (", 1)
            if gone == of_node:
                names.append(f"{head} ({detail[:-1]}; rank{'s' * (len(gone) > 1)} {_ranges(gone)})")
            else:
                names.append(f"rank{'s' * (len(gone) > 1)} {_ranges(gone)} of {node}")
        return " and ".join(names)

    def _leave(self, what: str) -> None:
        if self.stopped.is_set():
            return
        self.decided.set()
        line = (
            f"[hypersolid] {what} (dist.peer_timeout_s={self.timeout:g}); stopping this rank with exit code "
            f"{EXIT_PEER_LOST}. {self.newest_checkpoint()}"
        )
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one line per node: its other ranks judge alike
            print(line, file=sys.stderr, flush=True)
            tell_launcher(line)
        sys.stdout.flush()
        os._exit(EXIT_PEER_LOST)  # the main thread may be blocked in a collective with the lost peer

    def stop(self) -> None:
        """This rank leaves on purpose: the others stop watching it."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        try:
            with self.writing:
                self.store.set(f"beat/{self.rank}", LEFT)
        except Exception:  # noqa: BLE001 - the store is gone too: nobody is left to mislead
            pass
        self.stopped.set()

    def explain(self, err: BaseException) -> None:
        """``err`` from a collective whose peer is gone (a killed node resets its connections at once): wait for
        the judgement, which names the peer and exits, before the error goes on to be reported as it is; not
        when a peer left on purpose (an error of its own, which it has reported).

        Not when torchrun will restart the group (``--max-restarts`` left): there this rank fails at once, and the
        group restarts without waiting ``peer_timeout_s`` for a line nobody reads (the agents' restart counts may
        then differ: the new group meets anyway, ``elastic_store``)."""
        restart = elastic_restart() or (0, int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0))
        if peer_gone(err) and not self.stopping.is_set() and restart[0] >= restart[1] and not self._peer_left():
            self.decided.wait(self.timeout + 2 * self.interval)

    def _peer_left(self) -> bool:
        """Whether another rank has left on purpose (its own error, said by itself): then nothing vanished, and
        this rank's failed collective is reported at once, not after the judgement's wait."""
        try:
            values = self.store.multi_get(self.keys)
        except Exception:  # noqa: BLE001 - the store is unreachable too: let the judgement decide
            return False
        return any(value == LEFT.encode() for r, value in enumerate(values) if r != self.rank)


def start_heartbeat(timeout_s: float, newest_checkpoint: Callable[[], str]) -> Heartbeat | None:
    """A :class:`Heartbeat` for this rank when there are several ranks and ``timeout_s`` > 0, else None. Collective:
    every rank of the default group calls it. ``newest_checkpoint()`` is the line's last sentence."""
    if timeout_s <= 0 or not has_process_group() or get_world_size() == 1:
        return None
    return Heartbeat(timeout_s, newest_checkpoint)
