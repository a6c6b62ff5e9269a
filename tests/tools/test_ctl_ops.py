"""`sarpctl top` and `sarpctl dump` (tools.ctl_ops): rates, the top screen, presence
bits, the dump rendering, and both commands against a real sarpd."""

from __future__ import annotations

import json

from click.testing import CliRunner

from tests.daemon_helpers import SarpdProc
from tools.ctl_ops import presence_bits, rates, render_dump, render_top
from tools.sarpctl import main


def test_rates_over_an_interval() -> None:
    prev = {"requests": 10, "matches": 4, "errors": "x"}
    cur = {"requests": 30, "matches": 4, "inserts": 5, "errors": 2}
    assert rates(prev, cur, 2.0) == {"requests": 10.0, "matches": 0.0}
    assert rates(prev, cur, 0.0) == {}


def test_top_screen() -> None:
    cur = {"uptime_s": 12.5, "backend": "rocksdb", "sync": "none", "connections": 2,
           "directory_bytes": 2048, "hit_ratio": 0.5, "errors_busy": 3, "errors_internal": 0}
    lines = render_top(cur, {"requests": 12.0}, "/run/s.sock")
    assert lines[0] == "sarpd at /run/s.sock  up 12.5 s  backend rocksdb  sync none"
    assert lines[1].startswith("req/s      12.0  match/s       0.0")
    assert "connections 2  queue depth -" in lines[2]
    assert "hit ratio 0.5" in lines[3] and "directory 2.0 KiB" in lines[4]
    assert lines[5] == "errors busy 3"
    assert render_top({}, {}, "s")[5] == "errors none"


def test_presence_bits_block_0_first() -> None:
    assert presence_bits(0b1011, 6) == "11.1.."
    assert presence_bits(0, 3) == "..."


def test_render_dump() -> None:
    seg = {"id": 4, "window": 0, "nblocks": 2, "run": 2, "ns_tag": 0xAB, "presence": 0b11,
           "meta": (7).to_bytes(8, "little") + (9).to_bytes(8, "little"),
           "ids": bytes(range(32))}
    result = {"ns": "a", "blocks": 2, "matched_blocks": 2, "truncated": True, "windows": [
        {"window": 0, "blocks": 2, "run": 2, "candidates": [4],
         "probes": [{"offset": 1, "key": 0xFF, "postings": 1, "entries": [(4, 0x10)]},
                    {"offset": 2, "key": 0xEE, "postings": 0, "entries": []}],
         "segments": [seg, {"id": 5, "error": "corrupt"}]}]}
    lines = render_dump(result, show_ids=True)
    assert lines[0] == "ns 'a': 2 blocks, 2 match (more windows not shown)"
    assert lines[1] == "window 0 (2 blocks, run 2):"
    assert lines[2] == ("  offset  1 key 00000000000000ff: 1 entries: "
                        "seg 4 filter 0000000000000010")
    assert lines[3] == "  candidates: 4"
    assert lines[4].startswith("  segment 4: window 0, 2 blocks, run 2, ns tag 00000000000000ab")
    assert lines[5:7] == ["    present 11", "    meta    7 9"]
    assert lines[7] == f"    id[0] {bytes(range(16)).hex()}"
    assert lines[-1] == "  segment 5: corrupt"
    assert len(render_dump(result, show_ids=False)) == len(lines) - 2


def test_dump_and_top_against_a_real_daemon(shared_sarpd: SarpdProc) -> None:
    sock = str(shared_sarpd.socket)
    tokens = json.dumps(list(range(5000, 5000 + 16 * 70)))
    runner = CliRunner()
    assert runner.invoke(main, ["--socket", sock, "insert", "--ns", "ops"],
                         input=tokens).exit_code == 0
    res = runner.invoke(main, ["--socket", sock, "dump", "--ns", "ops", "--json"], input=tokens)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["blocks"] == doc["matched_blocks"] == 70 and len(doc["windows"]) == 2
    res = runner.invoke(main, ["--socket", sock, "top", "--count", "1", "--interval", "0.1",
                               "--no-clear"])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"sarpd at {sock}  up ")
