"""The daemon over its socket against sarp in-process (tools.bench.loadgen), on a
tiny trace."""

from __future__ import annotations

import json
import re
from pathlib import Path

from click.testing import CliRunner

from tools.bench.loadgen import daemon_rps, main
from tools.bench.workloads import get_workload


def tiny_trace(path: Path, sessions: int = 4, turns: int = 3) -> Path:
    rows = []
    for s in range(sessions):
        ids = [1, 2, 100 + s]
        for t in range(turns):
            ids = [*ids, 1000 * (s + 1) + t]
            rows.append({"timestamp": len(rows), "input_length": 16 * len(ids),
                         "output_length": 1, "hash_ids": ids, "session_id": s})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_daemon_rps_replays_every_turn(tmp_path: Path) -> None:
    turns = list(get_workload(f"trace:{tiny_trace(tmp_path / 't.jsonl')}").turns())
    rps = daemon_rps(turns, tmp_path / "d", clients=2, depth=2, window_ms=0.5, batch_max=16)
    assert rps > 0  # _drive asserts every turn was matched and inserted
    assert not (tmp_path / "d").exists()  # its data directory is removed


def test_cli_prints_both_throughputs(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "t.jsonl")
    res = CliRunner().invoke(main, ["-w", f"trace:{trace}", "--clients", "1", "--depth", "2"])
    assert res.exit_code == 0, res.output
    assert re.search(r"t\.jsonl: 12 turns; in-process [\d,]+ turns/s", res.output)
    assert re.search(r"daemon \(1 clients x 2 in flight\), window 0.5 ms, batch max 256: "
                     r"[\d,]+ turns/s = \d+ % of in-process", res.output)
