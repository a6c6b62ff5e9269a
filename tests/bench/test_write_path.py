"""The write-path benchmark (tools.bench.write_path): the generated events and a short
replay, its bare batches holding the same records."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sarpd.model import Insert, Remove
from tools.bench.write_path import Workload, main, make_ops


def test_stores_chain_after_parents_and_removals_take_old_blocks_by_holder() -> None:
    wl = Workload(20, 10, 4, remove_every=5, workers=3, parent_share=0.7, seed=1)
    work = list(make_ops(wl))
    ops = [o for batch, _, _ in work for o in batch]
    inserts = [o for o in ops if isinstance(o, Insert)]
    removes = [o for o in ops if isinstance(o, Remove)]
    assert len(inserts) == 160 and len(removes) == 40
    assert sum(b for _, b, _ in work) == 4 * len(inserts)
    stored = [int(h) for o in inserts if o.seq.hashes is not None for h in o.seq.hashes[:, 0]]
    assert len(stored) == len(set(stored)) and all(o.add_holder for o in inserts)
    parents = [int(o.parent[0, 0]) for o in inserts if o.parent is not None]
    assert len(parents) == sum(p for _, _, p in work) and 0 < len(parents) < len(inserts)
    assert set(parents) <= set(stored)
    removed = [int(h) for o in removes if o.ids is not None for h in o.ids[:, 0]]
    assert removed == stored[: len(removed)]  # the oldest stores first, each by its holder
    assert {o.meta for o in removes} <= {o.meta for o in inserts}
    again = [o for batch, _, _ in make_ops(wl) for o in batch]  # the seed decides
    assert [type(o) for o in again] == [type(o) for o in ops]
    assert [None if o.parent is None else int(o.parent[0, 0])
            for o in again if isinstance(o, Insert)] == [
        None if o.parent is None else int(o.parent[0, 0]) for o in inserts]


def test_a_short_replay_reports_both_sides() -> None:
    res = CliRunner().invoke(main, ["--batches", "8", "--events", "8", "--runs", "1",
                                    "--sync", "none", "--json", "-"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["write_batches"] == 8 and out["blocks"] > 0
    # issue 24: what the index wrote per stored block, its final fold included
    assert 0 < out["engine_keys_per_block"] < 1.0 and 0 < out["engine_bytes_per_block"] < 158
    assert out["engine_deletes_per_block"] >= 0
    assert out["blocks_per_s"] > 0 and out["bare_blocks_per_s"] > 0
    assert abs(out["cost_ratio"] - out["bare_blocks_per_s"] / out["blocks_per_s"]) < 1e-6
    assert set(out["native"]) >= {"write", "verify"}
