"""The id mapping (sarpd.events.mapping): metadata bits and clear masks, the
translator's namespaces (template, LoRA, cache salt, parent, tier, tier instance),
what it skips and why (other groups and tiers, REMOTE locality, partial-block
stores), its ops, and its configuration errors."""

from __future__ import annotations

import pytest

from sarpd.errors import ConfigError
from sarpd.events.mapping import (
    TIER_MASK,
    WORKER_MASK,
    ClearOp,
    InsertOp,
    RemoveOp,
    Translator,
    block_meta,
    cache_salt,
    is_local,
    worker_clear,
)
from sarpd.events.schema import Event, ExtraKey, decode_batch
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import cleared, encode_batch, removed, stored


def _batch(*events: dict[str, object]) -> list[object]:
    return list(decode_batch(encode_batch(list(events))).events)


def test_meta_bits_and_clear_masks() -> None:
    assert block_meta(3, "GPU") == block_meta(3, None) == 3 << 48
    assert block_meta(3, "cpu") == (3 << 48) | (1 << 40)
    assert block_meta(65535, "LocalDisk") == (65535 << 48) | (2 << 40)
    assert block_meta(1, "tape") == (1 << 48) | (255 << 40)
    assert block_meta(3, "CPU_PINNED") == block_meta(3, "CPU")  # SGLang's host tier
    assert not is_local(None, "EXTERNAL") and is_local(None, "DISK") and is_local(None)
    assert is_local("LOCAL", "EXTERNAL") and not is_local("REMOTE", "GPU")
    mask, value = worker_clear(3)
    assert (mask, value) == (WORKER_MASK, 3 << 48)
    assert block_meta(3, "CPU") & mask == value and block_meta(4, "GPU") & mask != value
    mask, value = worker_clear(3, "CPU")
    assert mask == WORKER_MASK | TIER_MASK
    assert block_meta(3, "CPU") & mask == value and block_meta(3, "GPU") & mask != value


def test_translator_namespaces_follow_lora_salt_and_parent() -> None:
    tr = Translator(holders=False, worker=2, ns_template="llama/w{worker}")
    toks = list(range(32))
    first, cont, lora, cpu = (
        tr.event(e)
        for e in _batch(
            stored([1, 2], None, toks, extra_keys=[["t7"], None]),  # salted, block 0
            stored([3], 2, toks[:16]),  # continuation: the parent's namespace
            stored([4], None, toks[:16], lora_name="sql", extra_keys=[["sql"]]),
            stored([5], None, toks[:16], medium="CPU"),
        )
    )
    meta = 2 << 48
    assert first.ops == (InsertOp("llama/w2/salt=t7", (1, 2), None, meta),)
    assert cont.ops == (InsertOp("llama/w2/salt=t7", (3,), 2, meta),)
    assert lora.ops == (InsertOp("llama/w2/lora=sql", (4,), None, meta),)
    assert cpu.kind == "ignored"  # another tier, and no namespace per tier
    # removals go where each block was stored, one remove per namespace
    (rm,) = (tr.event(e) for e in _batch(removed([1, 4, 9])))
    assert rm.kind == "removed"
    assert set(rm.ops) == {
        RemoveOp("llama/w2/salt=t7", (1,)),
        RemoveOp("llama/w2/lora=sql", (4,)),
        RemoveOp("llama/w2", (9,)),
    }
    (cl,) = (tr.event(e) for e in _batch(cleared()))
    assert cl.kind == "cleared"
    assert {op.ns for op in cl.ops if isinstance(op, ClearOp)} == {
        "llama/w2", "llama/w2/salt=t7", "llama/w2/lora=sql"
    }  # fmt: skip
    assert all(isinstance(op, ClearOp) and op.value == meta for op in cl.ops)


def test_translator_after_restart_removes_in_every_known_namespace() -> None:
    tr = Translator(holders=False, worker=0, known=["", "salt=a", "lora=x"])
    assert not tr.trust_map
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert sorted(op.ns for op in rm.ops) == ["", "lora=x", "salt=a"]
    tr.event(_batch(cleared())[0])  # after a clear the map is complete again
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert rm.ops == (RemoveOp("", (7,)),)


def test_translator_filters_groups_and_unknown_events() -> None:
    tr = Translator(holders=False, worker=1, group=0)
    evs = _batch(stored([1], None, [0] * 16, group_idx=1), {"type": "Other", "x": 1})
    assert [(t.kind, t.ops) for t in map(tr.event, evs)] == [("ignored", ()), ("ignored", ())]
    with pytest.raises(ConfigError, match="worker"):
        Translator(holders=False, worker=70000)
    with pytest.raises(ConfigError, match="ns"):
        Translator(holders=False, worker=1, ns_template="m/{rank}")
    tr = Translator(holders=False, worker=1, ns_template="{{x}}/{medium}")
    assert tr.base_ns("CPU") == "{x}/cpu"


def test_translator_tiers_and_unanchored_stores() -> None:
    """Other tiers are indexed only with a namespace per tier; stores without parent
    and tokens (offloading connectors) never: their positions are unknown."""
    shared = Translator(holders=False, worker=1)
    per_tier = Translator(holders=False, worker=1, ns_template="{medium}")
    cpu_store = stored([5], None, [0] * 16, medium="CPU")
    cpu_remove = removed([5], medium="CPU")
    bare = stored([6, 7], None, [], medium="CPU")
    kinds = [shared.event(e).kind for e in _batch(cpu_store, cpu_remove, bare)]
    assert kinds == ["ignored", "ignored", "ignored"]
    st, rm, br = (per_tier.event(e) for e in _batch(cpu_store, cpu_remove, bare))
    assert st.ops == (InsertOp("cpu", (5,), None, (1 << 48) | (1 << 40)),)
    assert rm.ops == (RemoveOp("cpu", (5,)),)
    assert br.kind == "ignored"
    (gpu,) = (per_tier.event(e) for e in _batch(stored([8], None, [0] * 16)))
    assert gpu.ops == (InsertOp("gpu", (8,), None, 1 << 48),)


def _current(*events: vs.KVCacheEvent) -> list[Event]:
    return list(decode_batch(vs.encode_events(list(events))).events)


def test_storage_tier_locality_and_ownership() -> None:
    """STORAGE is the storage tier (2), not 'other'; REMOTE (or any locality but LOCAL)
    is never this worker's block; a tier instance (`ownership`) gets its own namespace."""
    assert block_meta(3, "STORAGE") == block_meta(3, "fs") == (3 << 48) | (2 << 40)
    assert block_meta(3, "OBJ") == (3 << 48) | (2 << 40)
    tr = Translator(holders=False, worker=3, ns_template="w{worker}/{medium}")
    toks = [0] * 16
    local, remote, odd, plain, rm_local, rm_remote = (tr.event(e) for e in _current(
        vs.block_stored([1], None, toks, medium="STORAGE", locality="LOCAL", ownership="fs0"),
        vs.block_stored([2], None, toks, medium="STORAGE", locality="REMOTE", ownership="obj"),
        vs.block_stored([3], None, toks, locality="DC-EAST"),  # unknown: not local either
        vs.block_stored([4], None, toks, medium="STORAGE"),  # no locality, no ownership
        vs.block_removed([1], medium="STORAGE", locality="LOCAL", ownership="fs0"),
        vs.block_removed([2], medium="STORAGE", locality="REMOTE", ownership="obj"),
    ))  # fmt: skip
    assert local.ops == (InsertOp("w3/disk:fs0", (1,), None, (3 << 48) | (2 << 40)),)
    assert (remote.kind, remote.reason, odd.reason) == ("ignored", "remote", "remote")
    assert plain.ops == (InsertOp("w3/disk", (4,), None, (3 << 48) | (2 << 40)),)
    assert rm_local.ops == (RemoveOp("w3/disk:fs0", (1,)),)
    assert (rm_remote.ops, rm_remote.reason) == ((), "remote")
    shared = Translator(holders=False, worker=3)  # no {medium}: only the GPU tier, ownership unused
    st, gpu = (shared.event(e) for e in _current(
        vs.block_stored([1], None, toks, medium="STORAGE", locality="LOCAL"),
        vs.block_stored([5], None, toks, locality="LOCAL", ownership="x")))  # fmt: skip
    assert st.reason == "tier" and gpu.ops == (InsertOp("", (5,), None, 3 << 48),)


def test_partial_block_stores_are_skipped() -> None:
    """A GPU store of fewer tokens per hash than the engine's block size is a partial
    entry (a boundary inside a block): skipped, with the block size configured or
    learned (the largest seen), and only in the GPU tier."""
    full = vs.block_stored([1, 2], None, [0] * 128, 64)
    partial = vs.block_stored([9], 2, [0] * 16, 16)  # after block 2, 16 tokens
    cpu = vs.block_stored([7], None, [0] * 16, 16, medium="CPU")
    learned = Translator(holders=False, worker=1, ns_template="{medium}")
    kinds = [(t.kind, t.reason) for t in map(learned.event, _current(full, partial, cpu))]
    assert kinds == [("stored", ""), ("ignored", "partial"), ("stored", "")]
    # learned: a partial store before any full one passes for a full one
    assert Translator(holders=False, worker=1).event(_current(partial)[0]).kind == "stored"
    configured = Translator(holders=False, worker=1, block_size=64)
    assert configured.event(_current(partial)[0]).reason == "partial"
    assert configured.event(_current(full)[0]).kind == "stored"
    bigger = vs.block_stored([3], None, [0] * 128, 128)
    assert configured.event(_current(bigger)[0]).reason == "block_size"
    with pytest.raises(ConfigError, match="block_size"):
        Translator(holders=False, worker=1, block_size=-1)


def test_lookahead_session_and_typed_salt() -> None:
    """Stores with lookahead tokens are indexed (flagged); the session id changes
    nothing; a typed cache_salt key names the salt, a typed LoRA key does not."""
    tr = Translator(holders=False, worker=2)
    salted, session, ahead = (tr.event(e) for e in _current(
        vs.block_stored([1], None, [0] * 16, lora_name="sql",
                        extra_keys=[(vs.LoRAKey("sql"), vs.CacheSaltKey("t7"))]),
        vs.block_stored([2], None, [0] * 16, session_id="s1"),
        vs.block_stored([3], 2, [0] * 16, session_id="s2", lookahead_token_ids=[42]),
    ))  # fmt: skip
    assert salted.ops == (InsertOp("lora=sql/salt=t7", (1,), None, 2 << 48),)
    assert session.ops == (InsertOp("", (2,), None, 2 << 48),) and not session.lookahead
    assert ahead.ops == (InsertOp("", (3,), 2, 2 << 48),) and ahead.lookahead
    assert cache_salt((ExtraKey("lora", "sql"), ExtraKey("mm", "h")), "sql") == ""
    assert cache_salt(("sql", "t7", ("img", 0)), "sql") == "t7"  # raw keys, as before


def test_ignored_reasons() -> None:
    tr = Translator(holders=False, worker=1, group=0)
    evs = _batch(stored([1], None, [0] * 16, group_idx=1), {"type": "Other", "x": 1},
                 stored([], None, [0] * 16), stored([6], None, []),
                 removed([1], medium="CPU"))  # fmt: skip
    assert [tr.event(e).reason for e in evs] == [
        "group", "unknown_event", "empty", "unanchored", "tier"]
