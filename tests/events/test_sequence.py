"""sarpd/events/sequence.py: the one sequencing rule of the bridge and the daemon's
listeners: the next batch, a gap, a replay's late live copies, an engine's restart."""

from __future__ import annotations

from sarpd.events.sequence import Stream


def test_first_next_gap_and_lost() -> None:
    s = Stream()
    assert (s.expected, s.verdict(0), s.verdict(3)) == (0, "take", "gap")  # late: from 0
    assert s.taken(0) == 0 and s.verdict(1) == "take" and s.verdict(2) == "gap"
    assert s.taken(4) == 3 and (s.last, s.expected) == (4, 5)  # 1..3 neither sent nor replayed


def test_a_replay_s_live_copies_are_duplicates_and_going_back_is_a_restart() -> None:
    s = Stream(4)
    for seq in (5, 6, 7):  # a replay from 5 took 5..7
        assert not s.seen(seq)
        s.taken(seq)
    s.replay_done(5)
    assert s.replayed == (5, 7) and s.seen(6)
    assert [s.verdict(q) for q in (5, 7, 8, 9, 4, 0)] == \
        ["duplicate", "duplicate", "take", "gap", "restart", "restart"]
    s.taken(8)
    assert s.replayed is None and s.verdict(6) == "restart"  # past the window: no copies
    s.restarted()
    assert (s.last, s.replayed, s.verdict(0), s.verdict(2)) == (None, None, "take", "gap")


def test_a_replay_that_took_nothing_leaves_no_window() -> None:
    s = Stream(3)
    s.replay_done(None)
    assert s.replayed is None and s.verdict(3) == "restart"
