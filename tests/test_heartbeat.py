"""The heartbeat's verdict (hypersolid_scale/distributed/heartbeat.py): a lost peer, a lost store, and a node cut
off from the store, which must blame the store, not its peers (tests/test_nodes.py cuts a real link)."""

from __future__ import annotations

from hypersolid_scale.distributed.heartbeat import verdict

TIMEOUT = 3.0


def test_a_rank_whose_counter_stops_is_lost_while_the_store_answers() -> None:
    # Ranks 0-3, the store answering every 0.6 s; ranks 2 and 3 (one node) last moved 3.4 and 2.1 s ago.
    now = 100.0
    changed = [now - 0.3, now - 0.5, now - 3.4, now - 2.1]
    silence, lost = verdict(now, now - 0.2, changed, [False] * 4, TIMEOUT) or (0.0, [])
    assert lost == [2, 3] and abs(silence - 3.2) < 1e-9  # silent as of the store's last answer
    assert verdict(now, now - 0.2, [now - 0.3, now - 0.5, now - 2.9, now - 2.1], [False] * 4, TIMEOUT) is None
    # A rank that left on purpose is never lost.
    assert verdict(now, now - 0.2, changed, [False, False, True, True], TIMEOUT) is None


def test_a_node_cut_off_from_the_store_blames_the_store_not_its_peers() -> None:
    # The store's last answer at t=10: this rank's counter moved then, its peer's last moved 1.4 s before.
    answered, changed = 10.0, [8.6, 10.0]
    # 3.1 s after the peer's last move, 1.7 s after the store's last answer: the peer is not known to be silent
    # for longer than the store (measured to now, it would be "lost node 0 and node 1": itself included).
    assert verdict(11.7, answered, changed, [False, False], TIMEOUT) is None
    assert verdict(12.9, answered, changed, [False, False], TIMEOUT) is None
    silence, lost = verdict(13.1, answered, changed, [False, False], TIMEOUT) or (0.0, [0])
    assert lost == [] and abs(silence - 3.1) < 1e-9
