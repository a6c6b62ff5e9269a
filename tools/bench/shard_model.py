"""The shard rule's alternatives over a workload (issue 27): requests per shard and
blocks written, each variant run over real indexes in one process.

    python -m tools.bench.shard_model codeact,agent --scale 16 --shards 2,4,8
    python -m tools.bench.shard_model codeact --variants heads,heads-hash,block0

Each variant is `tools.bench.shard_sim.SimCluster` (the cluster's parts in one
process: the rule, the learner, the splits) with one thing changed; the figures are
those of `tools.bench.cluster --skew` (each request counted on the shard it is sent
to; the shards' summed `new_blocks` over a single index's). The variants are the
alternatives of docs/DECISIONS.md "Shards that spread shared heads (issue 27)":
- `block0`: version 1, block 0 decides;
- `heads`: the rule as built (a bucket placed on the least-loaded shard, a split's
  kept branches counted as its owner's load; a head split at 4 branches carrying 1/4
  of an even share of its shard's inserts, at least 32);
- `heads-hash`: branches hashed over the shards (every bucket placed in advance);
- `heads-nocredit`: least-loaded placement that does not count kept branches;
- `heads-t2`, `heads-t3`: a head split at 2 or 3 branches;
- `heads-cold`: a head split at 4 branches whatever its traffic.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

import click

from sarpd.cluster.shardmap import ShardMap
from tools.bench.shard_sim import SimCluster, replay, single_index
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


def variant(name: str, shards: int) -> SimCluster:
    """A cluster of `shards` shards running variant `name`."""
    if name not in VARIANTS:
        raise ValueError(f"variant {name!r} is not one of {', '.join(VARIANTS)}")
    names = tuple(f"s{i}" for i in range(shards))
    smap = {"block0": ShardMap(names), "heads-nocredit": _NoCredit(names, 2)}.get(
        name, ShardMap(names, 2))
    if name == "heads-hash":
        smap = replace(smap, placements={b: b % shards for b in range(smap.buckets)})
    learner: dict[str, Any] = {"children": {"heads-t2": 2, "heads-t3": 3}.get(name, 4)}
    if name == "heads-cold":
        learner.update(hot_share=0.0, min_inserts=0)
    return SimCluster(shards, learner=learner, smap=smap)


def model(workload: str, scale: int, shards: int, name: str,
          single_new: int | None = None) -> dict[str, Any]:
    sim = variant(name, shards)
    requests, _ = replay(sim, None, get_workload(workload, scale))
    if single_new is None:
        _, single_new = replay(None, single_index(), get_workload(workload, scale))
    return {"workload": workload, "scale": scale, "shards": shards, "variant": name,
            "requests": requests, "shares": [c / requests for c in sim.requests],
            "max_share": max(sim.requests) / requests, "splits": len(sim.smap.splits),
            "write_amplification": sum(sim.new_blocks) / max(1, single_new)}


@click.command()
@click.argument("workloads")
@click.option("--scale", default=16, show_default=True)
@click.option("--shards", default="2,4,8", show_default=True)
@click.option("--variants", default="block0,heads", show_default=True,
              help=f"Comma-separated, of: {', '.join(VARIANTS)}.")
@click.option("--json", "json_out", is_flag=True, help="One JSON line per run.")
def main(workloads: str, scale: int, shards: str, variants: str, json_out: bool) -> None:
    """Requests per shard and blocks written under the shard rule's alternatives, over
    real indexes in one process. See the module docstring."""
    names = [v for v in variants.split(",") if v]
    for v in names:
        if v not in VARIANTS:
            raise click.BadParameter(f"variant {v!r} is not one of {', '.join(VARIANTS)}")
    for w in (x for x in workloads.split(",") if x):
        _, single_new = replay(None, single_index(), get_workload(w, scale))
        for v in names:
            for n in (int(x) for x in shards.split(",") if x):
                t0 = time.perf_counter()
                r = model(w, scale, n, v, single_new)
                r["seconds"] = round(time.perf_counter() - t0, 1)
                click.echo(json.dumps(r) if json_out else (
                    f"{w} {v} {n} shards: max share {r['max_share']:.3f} (target "
                    f"{1.5 / n:.3f}), written {r['write_amplification']:.3f}x, "
                    f"splits {r['splits']}"))


if __name__ == "__main__":
    main()
