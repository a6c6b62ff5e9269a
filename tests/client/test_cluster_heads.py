"""`ClusterClient` under the heads rule (issue 27) against a real cluster on loopback
(tools.cluster.local, rule heads: 1 NATS node, 2 shards of 2 sarpd replicas): every
answer equals a single index's on workloads with hot shared prompts, sessions growing
and branching from inside, many writers of one block and removals; the shards split the
hot heads themselves (their learners, split entries in their logs) and both take
traffic; a client whose map predates a split is answered `moved` and re-reads the map;
a write sent twice with one write id is applied once per shard."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from sarpd.client import SyncClient
from sarpd.client.fields import tokens_bin
from sarpd.cluster.route import seq_ids
from sarpd.cluster.shardmap import ShardMap, keys_of
from sarpd.errors import SarpError
from sarpd.model import InsertResult, MatchResult, RemoveResult
from tools.bench.shard_sim import apply, single_index
from tools.cluster.local import LocalCluster, local_sarp_cluster

BT = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_sarp_cluster(tmp_path_factory.mktemp("heads"), nats_nodes=1, replicas=2,
                            shards=2, rule="heads") as c:
        yield c


def urls(c: LocalCluster) -> str:
    assert c.nats is not None
    return ",".join(c.nats.urls)


def toks(rng: random.Random, blocks: int) -> list[int]:
    return [rng.randrange(2**32) for _ in range(blocks * BT)]


def workload(seed: int, steps: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """Requests (op, wire fields): sessions on a few hot prompts (one namespace each),
    growing turn by turn, regenerated from inside, removed from a block or of one
    writer; each insert followed by a match of it and of a random prefix."""
    rng = random.Random(seed)
    prompts = [(f"ns{p}", toks(rng, rng.randint(2, 7))) for p in range(3)]
    sessions: list[tuple[str, list[int], int]] = []
    for _ in range(steps):
        roll = rng.random()
        if not sessions or roll < 0.35:
            ns, head = rng.choice(prompts)
            sessions.append((ns, head + toks(rng, rng.randint(1, 3)), len(sessions) + 1))
            ns, seq, meta = sessions[-1]
        elif roll < 0.6:  # the next turn of a session
            i = rng.randrange(len(sessions))
            ns, seq, meta = sessions[i]
            seq = seq + toks(rng, rng.randint(1, 2))
            sessions[i] = (ns, seq, meta)
        elif roll < 0.8:  # regenerated from inside: a branch of a session
            ns, seq, _ = rng.choice(sessions)
            cut = rng.randint(1, len(seq) // BT)
            seq, meta = seq[: cut * BT] + toks(rng, rng.randint(1, 2)), len(sessions) + 1
            sessions.append((ns, seq, meta))
        elif roll < 0.9:  # removed from a block on
            ns, seq, _ = rng.choice(sessions)
            yield "remove", {"ns": ns, "tokens": tokens_bin(seq),
                             "from": rng.randrange(len(seq) // BT)}
            continue
        else:  # one writer taken off
            ns, seq, meta = rng.choice(sessions)
            yield "remove", {"ns": ns, "tokens": tokens_bin(seq), "meta": meta}
            continue
        yield "insert", {"ns": ns, "tokens": tokens_bin(seq), "meta": meta}
        yield "match", {"ns": ns, "tokens": tokens_bin(seq)}
        yield "match", {"ns": ns, "tokens": tokens_bin(seq[: rng.randint(1, len(seq) // BT) * BT])}


def expected(got: Any) -> dict[str, Any]:
    """A single index's answer as the cluster's compares with it."""
    if isinstance(got, MatchResult):
        return {"blocks": got.blocks, "meta": [int(m) for m in got.meta]}
    if isinstance(got, InsertResult):
        return {"blocks": got.blocks, "matched_blocks": got.matched_blocks}
    if isinstance(got, RemoveResult):
        return {"removed": got.removed}
    assert isinstance(got, SarpError)
    return {"error": got.code}


def answer(c: SyncClient, op: str, fields: dict[str, Any]) -> dict[str, Any]:
    try:
        got = c.request(op, **fields)
    except SarpError as exc:
        return {"error": exc.code}
    out = {k: got[k] for k in ("blocks", "meta", "matched_blocks", "removed") if k in got}
    if isinstance(out.get("meta"), bytes):  # the wire's form: uint64 LE
        out["meta"] = [int(m) for m in np.frombuffer(out["meta"], dtype="<u8")]
    return out


def smap(c: SyncClient) -> ShardMap:
    inner = c._client  # the ClusterClient under the SyncClient
    assert isinstance(inner.smap, ShardMap)  # type: ignore[attr-defined]
    return inner.smap  # type: ignore[attr-defined,no-any-return]


def test_every_answer_equals_one_index_and_both_shards_take_traffic(
        cluster: LocalCluster) -> None:
    one = single_index(BT)
    with SyncClient.cluster(urls(cluster)) as stale, SyncClient.cluster(urls(cluster)) as c:
        assert smap(c).rule == "heads" and not smap(stale).splits  # opened before any
        for n, (op, fields) in enumerate(workload(7, 260)):
            want = expected(apply(one, op, fields, one_limits(), 1))
            assert answer(c, op, fields) == want, (n, op)
        status = c.cluster_status()
        assert status["rule"] == "heads" and status["splits"] >= 1
        heads = smap(c)
        assert heads.splits and all(s.seeds for s in heads.splits.values())
        per_shard = [sh["last_seq"] for sh in status["shards"]]
        assert min(per_shard) > 0.2 * sum(per_shard), per_shard  # both shards write
        # a client whose map predates the splits: its requests through a split head are
        # answered `moved` by the old region's shard; it re-reads the map, and answers
        # stay exact
        for op, fields in workload(7, 60):  # the same hot prompts again
            want = expected(apply(one, op, fields, one_limits(), 1))
            assert answer(stale, op, fields) == want, op
        assert smap(stale).splits and stale._client.moved > 0  # type: ignore[attr-defined]


def one_limits() -> Any:
    from sarpd.protocol.requests import Limits

    return Limits(block_tokens=BT)


def test_a_resend_is_applied_once_per_shard(cluster: LocalCluster,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(3)
    prompt = toks(rng, 4)
    with SyncClient.cluster(urls(cluster)) as c:
        for i in range(80):  # a hot prompt: its shard splits it
            c.insert(tokens=prompt + toks(rng, 2), meta=i + 1, ns="resend")
        head = seq_ids({"ns": "resend", "tokens": tokens_bin(prompt)}, BT, 4)
        assert head is not None
        c._runner.run(c._client.reload_map())  # type: ignore[attr-defined]
        assert keys_of(head)[-1] in smap(c).splits  # split at the prompt's end
        seq = prompt + toks(rng, 2)  # through the split head: a part for every shard
        fixed = uuid.UUID(int=rng.getrandbits(128))
        monkeypatch.setattr("sarpd.client.cluster.uuid.uuid4", lambda: fixed)
        before = [sh["last_seq"] for sh in c.cluster_status()["shards"]]
        first = c.insert(tokens=seq, meta=99, ns="resend")
        mid = [sh["last_seq"] for sh in c.cluster_status()["shards"]]
        again = c.insert(tokens=seq, meta=99, ns="resend")  # one write id: a resend
        after = [sh["last_seq"] for sh in c.cluster_status()["shards"]]
        assert [m - b for m, b in zip(mid, before, strict=True)] == [1, 1]  # a part each
        assert after == mid and again["seq"] == first["seq"]  # applied once per shard
        assert first["new_blocks"] == 2
        assert c.match(tokens=seq, ns="resend")["meta"][-2:] == [99, 99]
