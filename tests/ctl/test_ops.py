"""`sarpctl top` and `sarpctl dump` (sarpd.ctl.ops): rates, the top screen, presence
bits, the dump rendering, and both commands against a real sarpd."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sarpd.ctl.main import main
from sarpd.ctl.ops import presence_bits, rates, render_dump, render_top
from tests.daemon_helpers import Launcher


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


def test_dump_and_top_against_a_real_daemon(sarpd_factory: Launcher) -> None:
    """Both commands through a real sarpd: the dump as text (presence, meta, ids) and
    as JSON, then `top` screens of the daemon's counters."""
    sock = str(sarpd_factory().socket)
    runner = CliRunner()

    def run(*args: str, stdin: str | None = None) -> str:
        res = runner.invoke(main, ["--socket", sock, *args], input=stdin)
        assert res.exit_code == 0, res.output
        return res.output

    short = json.dumps(list(range(1, 1 + 16 * 5)))  # 5 blocks
    long = json.dumps(list(range(5000, 5000 + 16 * 70)))  # 70 blocks: two windows
    run("insert", "--meta", "9", stdin=short)
    run("insert", "--ns", "ops", stdin=long)
    out = run("dump", "--ids", stdin=short)
    assert "ns '': 5 blocks, 5 match" in out
    assert "present 11111." not in out and "present 11111" in out
    assert "meta    9 9 9 9 9" in out and "id[4] " in out
    assert json.loads(run("dump", "--json", stdin=short))["matched_blocks"] == 5
    doc = json.loads(run("dump", "--ns", "ops", "--json", stdin=long))
    assert doc["blocks"] == doc["matched_blocks"] == 70 and len(doc["windows"]) == 2
    out = run("top", "--count", "2", "--interval", "0.2", "--no-clear")
    assert out.startswith(f"sarpd at {sock}  up ") and out.count("sarpd at ") == 2
    assert "req/s" in out and "queue depth 0" in out and "blocks 75 " in out
