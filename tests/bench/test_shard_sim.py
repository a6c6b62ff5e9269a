"""The heads rule over real indexes (tools/bench/shard_sim.py) answers exactly what one
index answers: randomised workloads with the hard cases (one hot shared prompt, many
sessions and branches inside them, many holders of one block, removals by sequence),
protocols 1 and 2, every match compared (blocks, metas, holders, spans)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.memory import MemoryBackend
from sarpd.client.fields import tokens_bin
from sarpd.config import IndexConfig
from sarpd.core import SarpIndex
from sarpd.model import InsertResult
from sarpd.protocol.requests import Limits
from tools.bench.shard_sim import SimCluster, apply, distinct_blocks, replay, single_index
from tools.bench.workloads import get_workload

BT = 16


def _tokens(blocks: list[int]) -> bytes:
    return tokens_bin(np.repeat(np.array(blocks, dtype=np.uint32), BT))


@st.composite
def workloads(draw: st.DrawFn) -> list[tuple[str, list[int], int, int]]:
    """(op, blocks, meta, from): sessions on one of two prompts (a long hot one, a
    short one) that grow turn by turn, branch, and get removed from a point."""
    prompts = [list(range(100, 100 + draw(st.integers(1, 9)))), [7, 8]]
    sessions: list[list[int]] = []
    out: list[tuple[str, list[int], int, int]] = []
    for _ in range(draw(st.integers(5, 60))):
        kind = draw(st.sampled_from(["new", "new", "turn", "turn", "branch", "remove",
                                     "holder"]))
        meta = draw(st.integers(1, 6))
        if kind == "new" or not sessions:
            body = draw(st.lists(st.integers(0, 40), min_size=1, max_size=4))
            sessions.append(prompts[draw(st.integers(0, 1))] + body)
            seq = sessions[-1]
        else:
            i = draw(st.integers(0, len(sessions) - 1))
            if kind == "turn":
                sessions[i] = sessions[i] + draw(st.lists(st.integers(0, 40), min_size=1,
                                                          max_size=3))
            elif kind == "branch":
                cut = draw(st.integers(1, len(sessions[i])))
                sessions.append([*sessions[i][:cut], draw(st.integers(41, 60))])
                i = len(sessions) - 1
            seq = sessions[i]
            if kind == "remove":
                out.append(("remove", seq, meta, draw(st.integers(0, len(seq) - 1))))
                continue
        out.append(("match", seq, 0, 0))
        out.append(("insert", seq, meta, 0))
    out += [("match", s, 0, 0) for s in sessions]
    return out


@settings(max_examples=100, deadline=None)
@given(workloads(), st.sampled_from([2, 4]), st.sampled_from([1, 2]))
def test_the_cluster_answers_what_one_index_answers(
        ops: list[tuple[str, list[int], int, int]], shards: int, protocol: int) -> None:
    sim = SimCluster(shards, learner={"children": 2, "hot_share": 0.0, "min_inserts": 1})
    one = SarpIndex(MemoryBackend(), IndexConfig())
    one.recover()
    limits = Limits()
    for op, seq, meta, start in ops:
        fields: dict[str, object] = {"ns": "w", "tokens": _tokens(seq)}
        if op == "insert":
            fields["meta"] = meta
        elif op == "remove":
            fields.update({"from": start, "meta": meta} if protocol == 2 else {"from": start})
        else:
            fields.update({"holders": 8, "spans": True})
        want = apply(one, op, fields, limits, protocol)
        got = sim.request(op, fields, protocol)
        assert repr(got) == repr(want), (op, seq, sim.smap.splits.keys())
    assert sum(sim.requests) == len(ops)


def test_a_hot_prompt_is_split_and_spread() -> None:
    sim = SimCluster(4, learner={"min_inserts": 4})
    for s in range(64):
        seq = [*range(1000, 1010), s, s + 1]
        got = sim.request("insert", {"ns": "w", "tokens": _tokens(seq), "meta": s})
        assert isinstance(got, InsertResult) and got.blocks == 12
    assert len(sim.smap.splits) == 1 and sim.declined == 0
    assert max(sim.requests) < 0.5 * sum(sim.requests)
    assert all(n >= 10 for n in sim.new_blocks)  # the head, and branches, everywhere


def test_a_fan_out_above_a_region_is_not_its_shards_to_split() -> None:
    """Found by the property above: a head removed (holes in it on every shard), then
    a sequence past the head's split lands on a branch's shard, where block 0 is the
    only head block present: that shard must not split there (the branches of block 0
    live on block 0's shard), or `[100, 41]` is sent where it is not."""
    sim = SimCluster(2, learner={"children": 2, "hot_share": 0.0, "min_inserts": 1})
    head = list(range(100, 109))
    for seq in ([*head, 0], [*head, 1, 0]):
        sim.request("insert", {"ns": "w", "tokens": _tokens(seq), "meta": 1})
    assert len(sim.smap.splits) == 1
    sim.request("remove", {"ns": "w", "tokens": _tokens([*head, 0]), "from": 0})
    sim.request("insert", {"ns": "w", "tokens": _tokens([100, 41]), "meta": 1})
    for branch in range(34, 40):  # until one lands on the other shard
        sim.request("insert", {"ns": "w", "tokens": _tokens([*head, branch]), "meta": 1})
    assert sim.requests[1] > 0  # a branch is on the other shard
    assert [s.depth for s in sim.smap.splits.values()] == [9]  # nothing split above
    got = sim.request("match", {"ns": "w", "tokens": _tokens([100, 41])})
    assert getattr(got, "blocks", None) == 2


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


@pytest.mark.parametrize("workload", [
    "codeact", "branchy", f"trace:{SHARED}/mooncake_fast25_conversation_trace.jsonl@512"])
def test_distinct_blocks_is_what_one_index_adds(workload: str) -> None:
    """`distinct_blocks` (the skew's single figure without an index) equals a single
    index's summed new_blocks over the same insert-only replay."""
    if workload.startswith("trace:") and not Path(workload[6:].split("@")[0]).exists():
        pytest.skip(f"shared trace {workload} is absent (the shared folder sits beside "
                    "the clone)")
    got = distinct_blocks(get_workload(workload, 1))
    assert got == replay(None, single_index(), get_workload(workload, 1))
    assert got[1] > 0
