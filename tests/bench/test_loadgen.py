"""The daemon over its socket against sarp in-process (tools.bench.loadgen), on a
tiny trace."""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import msgpack
from click.testing import CliRunner

from tools.bench.loadgen import (
    _LANE_SHIFT,
    cpu_seconds,
    daemon_tps,
    inprocess_tps,
    lane_frames,
    lanes_of,
    main,
)
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


def test_lanes_deal_whole_sessions_and_frames_chain_by_id(tmp_path: Path) -> None:
    turns = list(get_workload(f"trace:{tiny_trace(tmp_path / 't.jsonl')}").turns())
    lanes = lanes_of(turns, clients=1, depth=3)
    assert len(lanes) == 3
    assert sorted(len(t) for lane in lanes for t in lane) == [3, 3, 3, 3]  # 4 sessions
    assert {t.session for t in lanes[0][0]} == {lanes[0][0][0].session}
    frames = lane_frames(2, lanes[2])
    msgs = [msgpack.unpackb(f) for f in frames]
    assert [m["op"] for m in msgs] == ["match", "insert"] * 3
    # an answer's id names its lane and the position of the lane's next frame
    assert [m["id"] for m in msgs] == [(2 << _LANE_SHIFT) | k for k in range(1, 7)]
    assert msgs[1]["hashes"] == [int(x) for x in lanes[2][0][0].sequence]


def test_cpu_seconds_counts_the_process_and_one_thread() -> None:
    pid = os.getpid()
    total0, main0 = cpu_seconds(pid), cpu_seconds(pid, threading.get_native_id())
    t0 = time.process_time()
    while time.process_time() - t0 < 0.1:  # burn 100 ms of CPU in this thread
        pass
    total1, main1 = cpu_seconds(pid), cpu_seconds(pid, threading.get_native_id())
    assert total1 - total0 >= 0.05 and main1 - main0 >= 0.05
    assert total1 >= main1


def test_daemon_replays_every_turn(tmp_path: Path) -> None:
    turns = list(get_workload(f"trace:{tiny_trace(tmp_path / 't.jsonl')}").turns())
    rate = daemon_tps(turns, tmp_path / "d", clients=2, depth=2, window_ms=0.5, batch_max=16)
    assert rate.tps > 0  # _drive asserts every request was answered ok, once
    # clock ticks: a tiny run may show 0; the kernel scales a process's and a thread's
    # tick counts apart (cputime_adjust), so they may disagree by a tick of the run
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK") / len(turns)
    assert rate.cpu_us >= rate.loop_cpu_us - tick_us - 1e-6 and rate.loop_cpu_us >= 0
    assert not (tmp_path / "d").exists()  # its data directory is removed


def test_inprocess_replays_every_turn(tmp_path: Path) -> None:
    turns = list(get_workload(f"trace:{tiny_trace(tmp_path / 't.jsonl')}").turns())
    rate = inprocess_tps(turns, tmp_path / "i", batch=4)
    assert rate.tps > 0 and rate.cpu_us > 0
    assert not (tmp_path / "i").exists()


def test_cli_prints_both_throughputs(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "t.jsonl")
    res = CliRunner().invoke(main, ["-w", f"trace:{trace}", "--clients", "1", "--depth", "2"])
    assert res.exit_code == 0, res.output
    assert re.search(r"t\.jsonl: 12 turns; in-process [\d,]+ turns/s \(batches of 16; "
                     r"[\d,]+ us CPU per turn\)", res.output)
    assert re.search(r"daemon \(1 clients x 2 in flight\), window 0.5 ms, batch max 256: "
                     r"[\d,]+ turns/s = \d+ % of in-process", res.output)


def test_cli_json_has_both_rates(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path / "t.jsonl")
    res = CliRunner().invoke(main, ["-w", f"trace:{trace}", "--clients", "1", "--depth", "2",
                                    "--runs", "2", "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    assert doc["turns"] == 12 and doc["runs"] == 2
    assert doc["inprocess_tps"] == max(doc["inprocess_runs_tps"]) > 0
    assert doc["daemon_tps"] == max(doc["daemon_runs_tps"]) > 0
    assert doc["ratio"] == doc["daemon_tps"] / doc["inprocess_tps"]
