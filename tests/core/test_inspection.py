"""`dump` (sarpd/core/inspection.py): per window, the routing probes, the candidates a
match reads and their decoded contents with the verified run; it stops after the
first window without a candidate, and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from backends.base import WriteBatch
from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core.ids import salt_ids, token_ids
from sarpd.core.index import SarpIndex
from sarpd.core.inspection import dump_or_error, dump_sequence
from sarpd.core.segment import seg_key
from sarpd.errors import SarpError, TooLarge
from sarpd.model import Insert, Match, SeqSpec, ids_to_bytes


def toks(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 30, 16 * n + 5).astype(np.uint32)


def index(cfg: IndexConfig | None = None) -> SarpIndex:
    ix = SarpIndex(MemoryBackend(), cfg or IndexConfig())
    ix.recover()
    return ix


def test_dump_of_an_indexed_sequence() -> None:
    ix = index()
    t = toks(100, 1)
    ix.write_many([Insert(0, SeqSpec("t", tokens=t[: 16 * 90]), meta=7)])
    stats = ix.stats()
    out = dump_sequence(ix, SeqSpec("t", tokens=t))
    assert (out["ns"], out["blocks"], out["matched_blocks"], out["truncated"]) == ("t", 100, 90,
                                                                                 False)
    w0, w1 = out["windows"]
    assert (w0["window"], w0["blocks"], w0["candidates"], w0["run"]) == (0, 64, [1], 64)
    assert (w1["window"], w1["blocks"], w1["candidates"], w1["run"]) == (1, 36, [2], 26)
    head = w0["probes"][0]
    assert head["offset"] == 0 and head["postings"] == 1 and head["entries"][0][0] == 1
    assert [p["offset"] for p in w0["probes"]] == list(range(0, 64, 4))
    [seg] = w1["segments"]
    assert (seg["id"], seg["window"], seg["nblocks"], seg["run"]) == (2, 1, 26, 26)
    assert seg["presence"] == (1 << 26) - 1
    internal = token_ids("t", t, 16)[64:90]
    assert seg["ids"] == ids_to_bytes(salt_ids("t", internal))  # the external form
    assert seg["meta"] == np.full(26, 7, "<u8").tobytes()
    # nothing changed: no match counted, no directory entry added
    after = ix.stats()
    assert after["index_matches"] == stats["index_matches"] == 0
    assert after["routing_points"] == stats["routing_points"]


def test_dump_stops_after_the_first_window_without_candidates() -> None:
    ix = index()
    out = dump_sequence(ix, SeqSpec("", tokens=toks(200, 2)))
    assert out["matched_blocks"] == 0 and len(out["windows"]) == 1
    assert out["windows"][0]["candidates"] == [] and out["truncated"] is True
    assert all(p["postings"] == 0 for p in out["windows"][0]["probes"])


def test_a_bad_candidate_is_shown_as_an_error() -> None:
    ix = index()
    t = toks(10, 3)
    ix.write_many([Insert(0, SeqSpec("", tokens=t), meta=1)])
    wb = WriteBatch()
    wb.put(seg_key(1), b"garbage")
    ix.backend.write(wb, True)
    ix.store.forget_segments()
    [seg] = dump_sequence(ix, SeqSpec("", tokens=t))["windows"][0]["segments"]
    assert seg == {"id": 1, "error": "missing or failed its checks (see sarpctl check)"}
    [r] = ix.match_many([Match(0, SeqSpec("", tokens=t))])
    assert r.blocks == 0  # type: ignore[union-attr]


def test_dump_uses_the_index_rules_and_refuses_other_indexes() -> None:
    ix = index(IndexConfig(max_sequence_tokens=64))
    with pytest.raises(TooLarge, match=r"65 tokens exceeds max_sequence_tokens \(64\)"):
        dump_sequence(ix, SeqSpec("", tokens=np.zeros(65, np.uint32)))
    hashes = np.array([[5, 6]], np.uint64)
    assert dump_or_error(ix, SeqSpec("", hashes=hashes))["blocks"] == 1  # type: ignore[index]
    refused = dump_or_error(object(), SeqSpec("", hashes=hashes))
    assert isinstance(refused, SarpError) and "cannot be inspected" in refused.message
