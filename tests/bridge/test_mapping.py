"""The id mapping (sarpd.bridge.mapping): metadata bits and clear masks, the
translator's namespaces (template, LoRA, cache salt, parent, tier), its ops, and its
configuration errors."""

from __future__ import annotations

import pytest

from sarpd.bridge.events import decode_batch
from sarpd.bridge.mapping import (
    TIER_MASK,
    WORKER_MASK,
    ClearOp,
    InsertOp,
    RemoveOp,
    Translator,
    block_meta,
    worker_clear,
)
from sarpd.errors import ConfigError
from tools.bench.vllm_publisher import cleared, encode_batch, removed, stored


def _batch(*events: dict[str, object]) -> list[object]:
    return list(decode_batch(encode_batch(list(events))).events)


def test_meta_bits_and_clear_masks() -> None:
    assert block_meta(3, "GPU") == block_meta(3, None) == 3 << 48
    assert block_meta(3, "cpu") == (3 << 48) | (1 << 40)
    assert block_meta(65535, "LocalDisk") == (65535 << 48) | (2 << 40)
    assert block_meta(1, "tape") == (1 << 48) | (255 << 40)
    mask, value = worker_clear(3)
    assert (mask, value) == (WORKER_MASK, 3 << 48)
    assert block_meta(3, "CPU") & mask == value and block_meta(4, "GPU") & mask != value
    mask, value = worker_clear(3, "CPU")
    assert mask == WORKER_MASK | TIER_MASK
    assert block_meta(3, "CPU") & mask == value and block_meta(3, "GPU") & mask != value


def test_translator_namespaces_follow_lora_salt_and_parent() -> None:
    tr = Translator(worker=2, ns_template="llama/w{worker}")
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
    tr = Translator(worker=0, known=["", "salt=a", "lora=x"])
    assert not tr.trust_map
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert sorted(op.ns for op in rm.ops) == ["", "lora=x", "salt=a"]
    tr.event(_batch(cleared())[0])  # after a clear the map is complete again
    (rm,) = (tr.event(e) for e in _batch(removed([7])))
    assert rm.ops == (RemoveOp("", (7,)),)


def test_translator_filters_groups_and_unknown_events() -> None:
    tr = Translator(worker=1, group=0)
    evs = _batch(stored([1], None, [0] * 16, group_idx=1), {"type": "Other", "x": 1})
    assert [(t.kind, t.ops) for t in map(tr.event, evs)] == [("ignored", ()), ("ignored", ())]
    with pytest.raises(ConfigError, match="worker"):
        Translator(worker=70000)
    with pytest.raises(ConfigError, match="ns"):
        Translator(worker=1, ns_template="m/{rank}")
    assert Translator(worker=1, ns_template="{{x}}/{medium}").base_ns("CPU") == "{x}/cpu"


def test_translator_tiers_and_unanchored_stores() -> None:
    """Other tiers are indexed only with a namespace per tier; stores without parent
    and tokens (offloading connectors) never: their positions are unknown."""
    shared, per_tier = Translator(worker=1), Translator(worker=1, ns_template="{medium}")
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
