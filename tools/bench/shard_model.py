"""A model of the shard rules over a workload (issue 27): requests per shard and the
blocks written, with no sarpd and no NATS.

    python -m tools.bench.shard_model codeact,agent --scale 16 --shards 2,4,8
    python -m tools.bench.shard_model codeact --variants heads,heads-hash,block0

It runs the rule the cluster client runs (`sarpd.cluster.shardmap.ShardMap.plan`) and
the owner's learner (`sarpd.cluster.learner.SplitLearner`) over a workload's turns
(match the prompt, insert the sequence: two requests). What a shard's index would
answer as `matched` is read from one set of the stored blocks (what two sequences
share is on the shard of either: the property tests/cluster/test_shardmap.py checks);
a split keeps, on its owner, the branches stored before it. Writes are counted as
the blocks they add: every head block once on every shard, every other block once.
No removals (the workloads have none).

Variants (the alternatives of docs/DECISIONS.md "Shards that spread shared heads"):
- `block0`: version 1, block 0 decides;
- `heads`: the rule as built (a bucket placed on the least-loaded shard, a split's
  kept branches counted as its owner's load; split at 4 branches and 1/4 of an even
  share of the owner's inserts, at least 32);
- `heads-hash`: branches hashed over the shards (every bucket placed in advance);
- `heads-nocredit`: least-loaded placement that does not count kept branches;
- `heads-t2`, `heads-t3`: split at 2 or 3 branches;
- `heads-cold`: split at 4 branches whatever the head's traffic.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, cast

import click

from sarpd.cluster.learner import SplitLearner
from sarpd.cluster.shardmap import ShardMap, Split, keys_of
from tools.bench.workloads import get_workload

VARIANTS = ("block0", "heads", "heads-hash", "heads-nocredit", "heads-t2", "heads-t3",
            "heads-cold")


@dataclass(frozen=True, slots=True)
class _NoCredit(ShardMap):
    def load(self) -> list[int]:
        out = [0] * len(self.names)
        for shard in self.placements.values():
            out[shard] += 1
        return out


def _map(variant: str, shards: int) -> ShardMap:
    names = tuple(f"s{i}" for i in range(shards))
    if variant == "block0":
        return ShardMap(names)
    smap = (_NoCredit if variant == "heads-nocredit" else ShardMap)(names, 2)
    if variant == "heads-hash":
        smap = replace(smap, placements={b: b % shards for b in range(smap.buckets)})
    return smap


def _learner(variant: str, shards: int) -> SplitLearner:
    children = {"heads-t2": 2, "heads-t3": 3}.get(variant, 4)
    if variant == "heads-cold":
        return SplitLearner(shards, children=children, hot_share=0.0, min_inserts=0)
    return SplitLearner(shards, children=children)


def model(workload: str, scale: int, shards: int, variant: str) -> dict[str, Any]:
    smap, learner = _map(variant, shards), _learner(variant, shards)
    learners = [learner] + [_learner(variant, shards) for _ in range(shards - 1)]
    stored: dict[int, int] = {}  # block -> when it was first stored (insert count)
    per, inserts, head_blocks = [0] * shards, 0, 0
    for turn in get_workload(workload, scale).turns():
        for kind, raw in (("match", turn.prompt), ("insert", turn.sequence)):
            if not len(raw):
                continue
            ids = _ids(raw)
            plan = smap.plan(ids)
            if plan.unplaced is not None:
                smap = smap.with_placement(plan.unplaced, smap.least_loaded())
                plan = smap.plan(ids)
            shard = smap.read_shard(ids, plan)
            per[shard] += 1
            if kind == "match":
                continue
            inserts += 1
            keys = keys_of(ids)
            matched = 0
            while matched < len(keys) and keys[matched] in stored:
                matched += 1
            for k in keys[matched:]:
                stored[k] = inserts
            if plan.target is None or smap.version == 1:
                continue
            split_keys = frozenset(smap.splits)
            got = learners[plan.target].observe(turn.ns, ids, matched, split_keys)
            if got is not None:
                kept = cast(frozenset[int], _StoredBefore(stored, inserts, got.branches))
                smap = smap.with_split(Split(tuple(keys_of(got.head)), plan.target, kept))
                head_blocks = len(smap.head_blocks)
    total = sum(per)
    unique = len(stored)
    return {"workload": workload, "scale": scale, "shards": shards, "variant": variant,
            "requests": total, "shares": [c / total for c in per],
            "max_share": max(per) / total, "splits": len(smap.splits),
            "head_blocks": head_blocks,
            "write_amplification": (unique + (shards - 1) * head_blocks) / unique}


class _StoredBefore:
    """A split's kept branches in the model: a branch (a child of the head: the rule
    asks only about those) is kept when it was stored before the split; the real
    owner reads them from its index."""

    def __init__(self, stored: dict[int, int], before: int, count: int) -> None:
        self.stored, self.before, self.count = stored, before, count

    def __contains__(self, key: object) -> bool:
        return bool(self.stored.get(key, self.before) < self.before)  # type: ignore[call-overload]

    def __len__(self) -> int:
        return self.count


def _ids(raw: Any) -> Any:
    import numpy as np

    out = np.zeros((len(raw), 2), dtype=np.uint64)
    out[:, 0] = raw
    return out


@click.command()
@click.argument("workloads")
@click.option("--scale", default=16, show_default=True)
@click.option("--shards", default="2,4,8", show_default=True)
@click.option("--variants", default="block0,heads", show_default=True,
              help=f"Comma-separated, of: {', '.join(VARIANTS)}.")
@click.option("--json", "json_out", is_flag=True, help="One JSON line per run.")
def main(workloads: str, scale: int, shards: str, variants: str, json_out: bool) -> None:
    """Requests per shard and blocks written under the shard rules (a model: no
    sarpd, no NATS). See the module docstring."""
    for w in (x for x in workloads.split(",") if x):
        for v in (x for x in variants.split(",") if x):
            if v not in VARIANTS:
                raise click.BadParameter(f"variant {v!r} is not one of {', '.join(VARIANTS)}")
            for n in (int(x) for x in shards.split(",") if x):
                t0 = time.perf_counter()
                r = model(w, scale, n, v)
                r["seconds"] = round(time.perf_counter() - t0, 1)
                if json_out:
                    click.echo(json.dumps(r))
                else:
                    click.echo(f"{w} {v} {n} shards: max share {r['max_share']:.3f} "
                               f"(target {1.5 / n:.3f}), write amplification "
                               f"{r['write_amplification']:.3f}, splits {r['splits']}")
                sys.stdout.flush()


if __name__ == "__main__":
    main()
