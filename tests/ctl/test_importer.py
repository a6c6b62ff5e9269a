"""sarpd/ctl/importer.py: `sarpctl import` builds a data directory that a real sarpd
serves exactly as the same inserts would have; bad input and used directories are
refused with the line or the directory named, leaving nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from sarpd.client import SyncClient
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.store import open_backend
from sarpd.ctl.main import main
from sarpd.model import Insert, MatchResult
from tests.core.test_bulk import branchy, queries
from tests.daemon_helpers import Launcher


def json_line(op: Insert) -> str:
    s = op.seq
    doc: dict[str, object] = {"ns": s.ns}
    if s.tokens is not None:
        doc["tokens"] = s.tokens.tolist()
    else:
        assert s.hashes is not None
        doc["hashes"] = s.hashes[:, 0].tolist()  # 64-bit engine hashes, as uints
    doc["meta"] = op.meta if isinstance(op.meta, int) else op.meta.tolist()
    return json.dumps(doc)


def reference(tmp: Path, ops: list[Insert]) -> SarpIndex:
    ix = SarpIndex(open_backend("rocksdb", tmp / "rocksdb", cache_bytes=8 << 20),
                   IndexConfig(), tmp / "snapshots")
    ix.recover()
    for i in range(0, len(ops), 256):
        ix.write_many(ops[i:i + 256])
    return ix


def test_import_then_sarpd_serves_the_same(tmp_path: Path, sarpd_factory: Launcher) -> None:
    ops = branchy(11, 120)
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json_line(op) for op in ops[:50]) + "\n\n"  # blank lines are fine
                   + "\n".join(json_line(op) for op in ops[50:]) + "\n")
    proc = sarpd_factory(start=False)
    res = CliRunner().invoke(main, ["import", str(src), "--data-dir", str(proc.data_dir),
                                    "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["inserts"] == len(ops) and out["blocks"] > 0 and out["blocks_per_s"] > 0
    ref = reference(tmp_path / "ref", ops)
    proc.start()
    client = SyncClient(str(proc.socket))
    try:
        assert client.stats()["blocks"] == ref.counters.blocks == out["blocks"]
        qs = queries(ops, 2)
        want = ref.match_many(qs)
        for q, w in zip(qs, want, strict=True):
            assert isinstance(w, MatchResult)
            s = q.seq
            got = client.match(tokens=s.tokens, hashes=s.hashes, ns=s.ns)
            assert got["blocks"] == w.blocks
            assert list(got["meta"]) == w.meta.tolist()
        assert client.check()["problems"] == []
    finally:
        client.close()
        ref.close()


def test_import_refuses_a_used_directory(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text('{"hashes": [1, 2, 3], "meta": 1}\n')
    d = tmp_path / "d"
    d.mkdir()
    (d / "something").write_text("x")
    res = CliRunner().invoke(main, ["import", str(src), "--data-dir", str(d)])
    assert res.exit_code == 2
    assert f"data dir {d}: not empty (something...)" in res.output
    assert sorted(p.name for p in d.iterdir()) == ["something"]


def test_a_bad_line_stops_the_import_and_leaves_nothing(tmp_path: Path) -> None:
    d = tmp_path / "d"
    good = json.dumps({"ns": "a", "tokens": list(range(64)), "meta": 3})
    cases = {
        "not JSON": "{nope",
        "unknown field(s) parent": '{"hashes": [5], "meta": 1, "parent": 4}',
        "meta: 2 values for 3 blocks": '{"hashes": [1, 2, 3], "meta": [1, 2]}',
        "hashes": '{"hashes": [18446744073709551616], "meta": 1}',  # 2**64
        "expected a JSON object": "[1, 2]",
    }
    for message, bad in cases.items():
        src = tmp_path / "in.jsonl"
        src.write_text(f"{good}\n{good}\n{bad}\n{good}\n")
        res = CliRunner().invoke(main, ["import", str(src), "--data-dir", str(d)])
        assert res.exit_code == 2, (message, res.output)
        assert "line 3: " in res.output and message in res.output, res.output
        assert not d.exists() or not any(d.iterdir())
