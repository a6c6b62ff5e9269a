"""docs/BRIDGE.md "Trying it without vLLM", end to end with real processes: sarpd on a
temp socket, the demo publisher (`python -m tools.bench.vllm_publisher`), the bridge
(`sarpctl bridge vllm`), then a query by the block ids the publisher printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sarpd.client import SyncClient
from tests.daemon_helpers import REPO, SarpdProc, free_port

ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def spawn(args: list[str], out: Path, err: Path, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out.open("w"),
                            stderr=err.open("w"), env=ENV, cwd=cwd)  # fmt: skip


def json_lines(path: Path, n: int, proc: subprocess.Popen[bytes],
               timeout: float = 60.0) -> list[dict[str, Any]]:  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if len(lines) >= n:
            return lines
        assert proc.poll() is None, f"publisher exited {proc.returncode}"
        time.sleep(0.1)
    raise TimeoutError(f"{path}: fewer than {n} lines after {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(30)


def match_cli(socket: Path, hashes: list[int]) -> dict[str, Any]:
    """`sarpctl match --hashes` as the walkthrough runs it."""
    ctl = [sys.executable, "-m", "sarpd.ctl.main", "--socket", str(socket), "match"]
    res = subprocess.run([*ctl, "--hashes", json.dumps(hashes), "--json"], capture_output=True,
                         text=True, env=ENV, timeout=60)  # fmt: skip
    assert res.returncode == 0, res.stderr
    out: dict[str, Any] = json.loads(res.stdout)
    return out


def test_walkthrough_publisher_bridge_sarpd(sarpd_proc: SarpdProc, tmp_path: Path) -> None:
    pub_ep, replay_ep = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    pub = spawn(["tools.bench.vllm_publisher", "--endpoint", pub_ep, "--replay-endpoint",
                 replay_ep, "--sequences", "3", "--blocks", "4", "--shared-blocks", "2",
                 "--interval", "0.1"], tmp_path / "pub.out", tmp_path / "pub.err", REPO)
    bridge = spawn(["sarpd.ctl.main", "--socket", str(sarpd_proc.socket), "bridge", "vllm",
                    "--endpoint", pub_ep, "--replay", replay_ep, "--worker", "0", "--state",
                    str(tmp_path / "w0.json"), "--report-interval", "0.5"],
                   tmp_path / "bridge.out", tmp_path / "bridge.err", tmp_path)  # fmt: skip
    try:
        seqs = json_lines(tmp_path / "pub.out", 3, pub)
        assert [s["batch"] for s in seqs] == [0, 1, 2]
        assert [len(s["stored"]) for s in seqs] == [4, 2, 2]  # the shared prefix once
        deadline, got = time.monotonic() + 60, -1
        while time.monotonic() < deadline:
            with SyncClient(sarpd_proc.socket) as c:
                got = sum(c.match(hashes=s["hashes"], ns="")["blocks"] for s in seqs)
            if got == 12:
                break
            time.sleep(0.1)
        assert got == 12, (tmp_path / "bridge.err").read_text()
        with SyncClient(sarpd_proc.socket) as c:
            hit = c.match(hashes=seqs[1]["hashes"], holders=1)
            assert hit["blocks"] == 4 and hit["holders"] == [[0, 4]]  # worker 0, GPU tier
            # sequence 0's prefix and sequence 1's own blocks: only the prefix matches
            assert c.match(hashes=[*seqs[0]["hashes"][:2], seqs[1]["hashes"][3]])["blocks"] == 2
        cli = match_cli(sarpd_proc.socket, seqs[2]["hashes"])
        assert cli["blocks"] == 4, cli
    finally:
        bridge_rc, pub_rc = stop(bridge), stop(pub)
    assert (bridge_rc, pub_rc) == (0, 0), (tmp_path / "bridge.err").read_text()
    assert "WARNING" not in (tmp_path / "bridge.err").read_text()
    assert "serving replays until interrupted" in (tmp_path / "pub.err").read_text()
