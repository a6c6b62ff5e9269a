"""The bridge benchmark (tools.bench.bridge): the generated event batches, and a
short run through the real bridge into a real sarpd."""

from __future__ import annotations

import json
import re

import msgpack
from click.testing import CliRunner
from msgspec.structs import replace

from sarpd.events.schema import BlockRemoved, BlockStored, decode_batch
from tools.bench.bridge import main, make_batches
from tools.bench.null_sarpd import answer


def test_batches_store_chains_and_remove_old_blocks() -> None:
    payloads, count = make_batches(20, 5, 3, remove_every=4, seed=1, encoding="array")
    assert len(payloads) == 20 and count == 100
    events = [e for p in payloads for e in decode_batch(p).events]
    stores = [e for e in events if isinstance(e, BlockStored)]
    removes = [e for e in events if isinstance(e, BlockRemoved)]
    assert len(stores) + len(removes) == 100 and len(removes) == 25
    assert all(len(e.block_hashes) == 3 for e in stores)
    removed_ids = {h for e in removes for h in e.block_hashes}
    stored_ids = [h for e in stores for h in e.block_hashes]
    assert len(stored_ids) == len(set(stored_ids)) and removed_ids <= set(stored_ids)
    parents = [e.parent for e in stores if e.parent is not None]
    assert parents and set(parents) <= set(stored_ids)
    again, _ = make_batches(20, 5, 3, remove_every=4, seed=1, encoding="array")
    assert [decode_batch(p).events for p in again] == [decode_batch(p).events for p in payloads]
    for encoding in ("map", "current"):  # the same events (current: of group 0)
        other, _ = make_batches(20, 5, 3, remove_every=4, seed=1, encoding=encoding)
        assert [e if isinstance(e, BlockRemoved) else replace(e, group_idx=None)
                for p in other for e in decode_batch(p).events] == events  # fmt: skip
    raw = msgpack.unpackb(other[0])  # current: the batch an array, its events maps
    assert isinstance(raw, list) and raw[1][0]["type"] == "BlockStored"


def test_a_short_run_through_a_real_sarpd() -> None:
    res = CliRunner().invoke(main, ["--batches", "30", "--events", "4", "--sync", "none",
                                    "--encoding", "current"])
    assert res.exit_code == 0, res.output
    m = re.search(r"120 events \((\d+) stored, (\d+) removed\) in 30 batches, 4 blocks per "
                  r"store, sync none: .* events/s, .* blocks/s; unknown_parent (\d+)", res.output)
    assert m is not None, res.output
    assert int(m[1]) + int(m[2]) == 120 and int(m[3]) == 0


def test_json_figures_on_stdout() -> None:
    res = CliRunner().invoke(main, ["--batches", "10", "--events", "5", "--sync", "none",
                                    "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["events"] == 50 and doc["unknown_parent"] == 0
    assert doc["blocks_new"] == 4 * 40  # 40 stores of 4 new blocks, 10 removals
    for key in ("events_per_s", "blocks_per_s", "bare_blocks_per_s", "bridge_alone_events_per_s"):
        assert doc[key] > 0
    # CPU in clock ticks (10 ms): a run this small may take less than one of sarpd's
    assert doc["bridge_cpu_us_per_event"] > 0 and doc["sarpd_cpu_us_per_event"] >= 0
    assert doc["bare_write_batches"] == 10  # one per EventBatch


def test_the_null_sarpd_answers_every_request() -> None:
    assert answer({"id": 3, "op": "hello", "protocol": 2}) == {
        "id": 3, "ok": True, "protocol": 2, "max_protocol": 2, "holders": True}
    assert answer({"id": 4, "op": "insert", "hashes": [1, 2], "parent": 9})["new_blocks"] == 2
    assert answer({"id": 5, "op": "insert", "tokens": [0] * 40})["blocks"] == 2
    assert answer({"id": 6, "op": "remove", "ids": [1, 2, 3]})["removed"] == 3
    assert answer({"id": 7, "op": "match", "tokens": []})["blocks"] == 0
    assert answer({"id": 8, "op": "ping"}) == {"id": 8, "ok": True}
