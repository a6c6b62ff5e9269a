"""sarpd/indexer/workers.py: the registry's rules (Dynamo's statuses and words), slots
for life, dynamic ranks, and its JSON round trip."""

from __future__ import annotations

import pytest

from sarpd.errors import ConfigError, Conflict, NotFound
from sarpd.indexer import workers
from sarpd.indexer.workers import Registry, namespace


def reg() -> Registry:
    r = Registry(16)
    r.register("m", "default", 1, 0, 16, "tcp://h:1", None)
    return r


def test_register_rules_and_dynamo_s_words() -> None:
    r = reg()
    with pytest.raises(Conflict, match=r"^instance 1 dp_rank 0 already registered$"):
        r.register("m", "default", 1, 0, 16, "tcp://h:2", None)
    with pytest.raises(Conflict, match="instance 1 is already registered for model=m "
                                       "routing_group=default"):
        r.register("m", "g2", 1, 1, 16, "tcp://h:2", None)
    with pytest.raises(Conflict, match="block_size: 32 is not this index's block size"):
        r.register("m2", "default", 2, 0, 32, "tcp://h:2", None)  # a new pair
    with pytest.raises(Conflict, match="block_size mismatch for model=m routing_group="
                                       "default: existing=16, requested=32"):
        r.register("m", "default", 2, 0, 32, "tcp://h:2", None)  # the pair's size first
    r2 = Registry(16)
    r2.pairs[("m", "default")] = 8  # a pair of another size (not reachable by register)
    with pytest.raises(Conflict, match="block_size mismatch for model=m routing_group=default: "
                                       "existing=8, requested=16"):
        r2.register("m", "default", 2, 0, 16, "tcp://h:2", None)
    w = r.register("m", "default", 1, 1, 16, "tcp://h:1", "tcp://h:9")  # another rank: fine
    assert (w.slot, w.replay_endpoint) == (1, "tcp://h:9")
    assert r.require("m", "default") == 16
    with pytest.raises(NotFound, match=r"^no indexer for model=x routing_group=default$"):
        r.require("x", "default")


def test_unregister_takes_every_rank_and_the_pair_with_its_last_worker() -> None:
    r = reg()
    r.register("m", "default", 1, 1, 16, "tcp://h:2", None)
    r.register("m", "default", 2, 0, 16, "tcp://h:3", None)
    dyn = r.dynamic("m", "default", 1, 7)  # a rank a batch named
    assert dyn.endpoint is None and [w.instance_id for w in r.listed(None, None)] == [1, 1, 2]
    with pytest.raises(NotFound, match=r"^instance 1 is registered for model=m "
                                       r"routing_group=default$"):
        r.unregister("m", "other", 1)  # Dynamo's words when it is registered elsewhere
    with pytest.raises(NotFound, match=r"^instance 99 not found$"):
        r.unregister("m", "default", 99)
    gone = r.unregister("m", "default", 1)
    assert sorted(w.dp_rank for w in gone) == [0, 1, 7]
    assert r.releasing == {w.slot for w in gone}
    new = r.register("m", "default", 3, 0, 16, "tcp://h:4", None)
    assert new.slot not in r.releasing  # no slot is reused before its blocks are cleared
    r.release({w.slot for w in gone})
    r.unregister("m", "default", 2)
    r.unregister("m", "default", 3)
    assert r.block_size("m", "default") is None  # the indexer went with its last worker
    with pytest.raises(NotFound):
        r.unregister("m", "default", 3)


def test_slots_are_bounded_and_freed_slots_are_taken_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "MAX_SLOTS", 8)
    r = Registry(16)
    for i in range(8):
        r.register("m", "g", i, 0, 16, "tcp://h:1", None)
    with pytest.raises(Conflict, match="8 registered workers reach the limit"):
        r.dynamic("m", "g", 0, 1)
    gone = r.unregister("m", "g", 5)
    with pytest.raises(Conflict):  # releasing: not free until its blocks are cleared
        r.register("m", "g", 9, 0, 16, "tcp://h:1", None)
    r.release(w.slot for w in gone)
    assert r.register("m", "g", 9, 0, 16, "tcp://h:1", None).slot == 5


def test_json_round_trip_and_a_bad_file() -> None:
    r = reg()
    r.dynamic("m", "default", 1, 3)
    r.releasing.add(9)
    back = Registry.from_json(r.to_json(), 16, "f")
    assert (back.pairs, back.workers, back.releasing) == (r.pairs, r.workers, r.releasing)
    with pytest.raises(ConfigError, match="f: registered with block_tokens 16, the index has 8"):
        Registry.from_json(r.to_json(), 8, "f")
    with pytest.raises(ConfigError, match="f: not an indexer registry"):
        Registry.from_json(b"{}", 16, "f")


def test_namespaces_keep_pairs_apart() -> None:
    assert len({namespace("a", "b"), namespace("a:b", ""), namespace("a", "b:")}) == 3
