"""Checkpoint object names (sarpd/cluster/checkpoints.py): they sort by sequence and
belong to one shard; publishing, trimming and a new replica's bootstrap run against a
real cluster in tests/daemon/test_cluster.py."""

from __future__ import annotations

from sarpd.cluster.checkpoints import object_name, seq_of


def test_names_sort_by_sequence_and_name_their_shard() -> None:
    names = [object_name("s1", n) for n in (10, 9, 100, 2**63)]
    assert [seq_of(n, "s1") for n in sorted(names)] == [9, 10, 100, 2**63]
    assert seq_of(object_name("s1", 5), "s10") is None  # another shard's
    assert seq_of(object_name("a.b", 7), "a.b") == 7
    for bad in ("s1.12", "s1.x" + "0" * 19, "s1", ""):
        assert seq_of(bad, "s1") is None
