"""Operations across the daemon, the core and the tools: `dump` of a sequence,
`sarpctl dump` / `sarpctl top` against a real daemon, a soak run, and the documented
sarpd.toml."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from sarpd.client import SyncClient
from sarpd.config import ServerConfig
from tests.daemon_helpers import REPO, Launcher, SarpdProc
from tools.sarpctl import main as sarpctl


def toks(n: int, start: int) -> list[int]:
    return list(range(start, start + n))


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
    assert cfg.cache_bytes == ServerConfig().cache_bytes  # the default, as documented
    keys = {body.split(" = ")[0] for body in lines if " = " in body}
    for cls in (ServerConfig, IndexConfig):
        missing = {f.name for f in dataclasses.fields(cls)} - keys - {"index"}
        assert not missing, f"{cls.__name__} settings not in sarpd.toml: {missing}"
