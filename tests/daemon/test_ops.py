"""Operations: Prometheus metrics scraped from a real daemon, JSON logs, recovery
progress with an ETA, `dump`, and `sarpctl top` / `sarpctl dump`."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from sarpd.client import SyncClient
from sarpd.config import ServerConfig
from sarpd.daemon.cli import Daemon
from sarpd.daemon.metrics import Metrics
from sarpd.errors import SarpError
from sarpd.model import Match, MatchResult, Ping, SeqSpec
from tests.daemon_helpers import REPO, Launcher, RawConn, SarpdProc
from tools.sarpctl import main as sarpctl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> dict[str, float]:
    """Every sample as 'name{label="v",...}' -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def toks(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


@pytest.fixture(scope="module")
def ops_daemon(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.daemon_helpers import launcher

    port = free_port()
    with launcher(tmp_path_factory.mktemp("ops")) as lau:
        proc = lau(extra_args=("--metrics-port", str(port), "--log-format", "json"))
        yield proc, port


def test_metrics_count_requests_errors_and_matches(ops_daemon: tuple[SarpdProc, int]) -> None:
    proc, port = ops_daemon
    with SyncClient(proc.socket) as c:
        c.insert(tokens=toks(160, 1), meta=4, ns="m")  # 10 blocks
        assert c.match(tokens=toks(320, 1), ns="m")["blocks"] == 10  # 10 of 20
        assert c.match(tokens=toks(160, 9999), ns="m")["blocks"] == 0  # 0 of 10
        with pytest.raises(SarpError):
            c.match(tokens=toks(16, 1), ns="m" * 2000)  # ns too long
        c.stats()  # refreshes nothing by itself; index gauges refresh per second
    with RawConn(proc.socket) as conn:
        conn.send({"id": 5, "op": "nope"})
        assert conn.recv()["error"]["code"] == "unknown_op"
    m = scrape(port)
    assert m['sarpd_requests_total{op="insert"}'] >= 1
    assert m['sarpd_requests_total{op="match"}'] >= 2
    assert m["sarpd_match_queried_blocks_total"] >= 30
    assert m["sarpd_match_hit_blocks_total"] >= 10
    assert 0 < m["sarpd_match_hit_ratio"] < 1
    assert m["sarpd_match_depth_blocks_count"] >= 2
    assert m['sarpd_match_depth_blocks_bucket{le="0"}'] >= 1  # the miss
    assert m["sarpd_batch_size_count"] >= 4
    assert m["sarpd_backend_reads_per_match_count"] >= 1
    assert m["sarpd_ready"] == 1 and m["sarpd_recovery_seconds"] > 0
    assert m["sarpd_index_blocks"] >= 0 and m["sarpd_directory_bytes"] >= 0
    assert m["sarpd_connections"] >= 0 and m["sarpd_queue_depth"] == 0


def test_metrics_errors_by_op_and_code() -> None:
    """Wire-level errors (answered before a batch) are not in record_batch; an error
    returned by the index is, by op and code."""
    metrics = Metrics()
    match = Match(1, seq=SeqSpec(ns="", tokens=np.arange(64, dtype=np.uint32)))
    metrics.record_batch(
        [match, match, Ping(2)],
        [MatchResult(3, np.zeros(3, np.uint64)), SarpError("boom"), None],
        block_tokens=16,
    )
    metrics.record_rejected("insert", "busy")
    assert metrics.requests == {"match": 2, "ping": 1, "insert": 1}
    assert metrics.errors == {("match", "internal"): 1, ("insert", "busy"): 1}
    assert metrics.queried_blocks == 4 and metrics.hit_blocks == 3
    assert metrics.snapshot() == {"errors_internal": 1, "errors_busy": 1, "hit_ratio": 0.75}


def test_json_logs(ops_daemon: tuple[SarpdProc, int]) -> None:
    proc, _ = ops_daemon
    lines = [json.loads(line) for line in proc.log().splitlines() if line.startswith("{")]
    assert lines, proc.log()
    assert {"time", "level", "logger", "message"} <= set(lines[0])
    assert any(line["message"].startswith("ready: serving on") for line in lines)


def test_recovery_progress_has_an_eta_in_status_and_metrics() -> None:
    daemon = Daemon(ServerConfig())
    daemon._recovery_started -= 2.0  # 2 s in, a quarter done: ~6 s left
    daemon._progress(1000, 4000)
    status = daemon.server.status
    assert status.startswith("recovering: 1000 of 4000 segments (25%, ETA ")
    eta = float(status.split("ETA ")[1].split(" s")[0])
    assert 5.5 < eta < 7.5
    r = daemon.server.metrics.recovery
    assert (r.done, r.total, r.ready) == (1000, 4000, False) and r.eta_s == pytest.approx(eta, 0.1)
    daemon.server.executor.shutdown()


def test_dump_shows_routing_and_segments(shared_sarpd: SarpdProc) -> None:
    base = toks(64 * 16, 1)  # one full window
    branch = base[: 40 * 16] + toks(40 * 16, 500_000)  # shares 40 blocks, then differs
    with SyncClient(shared_sarpd.socket) as c:
        c.insert(tokens=base, meta=1, ns="dump")
        c.insert(tokens=branch, meta=2, ns="dump")
        d = c.dump(tokens=branch, ns="dump")
        hit = c.match(tokens=branch, ns="dump", with_ids=True)
        miss = c.dump(tokens=toks(64, 7_000_000), ns="dump")
    assert d["blocks"] == 80 and d["matched_blocks"] == hit["blocks"] == 80
    w0, w1 = d["windows"][0], d["windows"][1]
    assert w0["probes"][0]["offset"] == 0 and w0["probes"][0]["postings"] >= 2  # both heads
    assert len(w0["candidates"]) >= 2 and w0["run"] == 64
    runs = {s["id"]: s["run"] for s in w0["segments"]}
    assert sorted(runs.values())[-2:] == [40, 64]  # the base segment stops at the branch
    best = max(w0["segments"], key=lambda s: s["run"])
    metas = np.frombuffer(best["meta"], "<u8")
    assert metas[:40].tolist() == [1] * 40 and metas[40:64].tolist() == [2] * 24
    assert best["ids"][: 16 * 64] == b"".join(hit["ids"][:64])  # external ids, as match
    assert w1["run"] == 16 and w1["window"] == 1
    assert miss["matched_blocks"] == 0 and miss["windows"][0]["candidates"] == []


def test_sarpctl_dump_and_top(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory()
    sock = str(proc.socket)
    runner = CliRunner()
    tokens = json.dumps(toks(80, 1))
    res = runner.invoke(sarpctl, ["--socket", sock, "insert", "--meta", "9"], input=tokens)
    assert res.exit_code == 0, res.output
    res = runner.invoke(sarpctl, ["--socket", sock, "dump", "--ids"], input=tokens)
    assert res.exit_code == 0, res.output
    assert "ns '': 5 blocks, 5 match" in res.output
    assert "present 11111." not in res.output and "present 11111" in res.output
    assert "meta    9 9 9 9 9" in res.output and "id[4] " in res.output
    res = runner.invoke(sarpctl, ["--socket", sock, "dump", "--json"], input=tokens)
    assert json.loads(res.output)["matched_blocks"] == 5
    res = runner.invoke(
        sarpctl, ["--socket", sock, "top", "--count", "2", "--interval", "0.2", "--no-clear"]
    )
    assert res.exit_code == 0, res.output
    screens = res.output.count("sarpd at ")
    assert screens == 2 and "req/s" in res.output and "queue depth 0" in res.output
    assert "blocks 5" in res.output


def test_soak_reports_throughput_latency_and_rss(tmp_path: Path) -> None:
    """A 5-second soak through the real CLI: the report has every interval, requests
    and no errors, and the daemon's RSS; the plateau rule itself is checked apart."""
    from tools.bench import soak

    out = tmp_path / "soak.json"
    res = CliRunner().invoke(
        soak.main, ["--duration", "5", "--clients", "3", "--interval", "1", "--json", str(out)]
    )
    assert res.exit_code in (0, 1), res.output  # 1: RSS still growing (5 s is warm-up)
    report = json.loads(out.read_text())
    assert len(report["intervals"]) >= 4 and report["requests"] > 0 and report["errors"] == 0
    assert report["rss_peak_mb"] > 10 and report["p99_ms"] > 0
    assert ("plateaued" in res.output) == report["plateaued"]
    assert soak.plateaued([50, 80, 90, 91, 92, 92], 0.05)
    assert not soak.plateaued([50, 60, 70, 80, 90, 100], 0.05)
    assert not soak.plateaued([50, 60], 0.05)  # too short to tell


def test_sarpd_toml_documents_every_setting_and_loads(tmp_path: Path) -> None:
    """Uncommenting every `# key = value` line of systemd/sarpd.toml gives a config
    that loads, and every ServerConfig / IndexConfig field is documented there."""
    import dataclasses

    from sarpd.config import IndexConfig, load_config

    text = (REPO / "systemd" / "sarpd.toml").read_text()
    lines = []
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") else line
        if body.startswith("[") or (" = " in body and body.split(" = ")[0].isidentifier()):
            lines.append(body)
    path = tmp_path / "all.toml"
    path.write_text("\n".join(lines) + "\n")
    cfg = load_config(path)
    assert cfg.max_queue == 65536 and cfg.allow_uids == () and cfg.log_format == "text"
    keys = {body.split(" = ")[0] for body in lines if " = " in body}
    for cls in (ServerConfig, IndexConfig):
        missing = {f.name for f in dataclasses.fields(cls)} - keys - {"index"}
        assert not missing, f"{cls.__name__} settings not in sarpd.toml: {missing}"


def test_metrics_port_in_use_is_a_clear_startup_error(sarpd_factory: Launcher) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = sarpd_factory(extra_args=("--metrics-port", str(port)), start=False)
        proc.start(wait=False)
        assert proc.proc is not None and proc.proc.wait(60) == 1
    assert f"metrics: cannot listen on 127.0.0.1:{port}" in proc.log()
    assert not proc.socket.exists()  # nothing left behind
