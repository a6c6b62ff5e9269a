"""`sarpctl bridge vllm` (tools.ctl_bridge): options from a TOML file, a real run
against a real ZMQ publisher and a real sarpd, and configuration errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sarpd.client import SyncClient
from tests.daemon_helpers import REPO, SarpdProc, free_port
from tools.bench.vllm_publisher import Publisher, encode_batch, stored
from tools.sarpctl import main


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher()
    yield pub
    pub.close()


def test_cli_with_config_file(publisher: Publisher, sarpd_proc: SarpdProc, tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    conf = tmp_path / "w5.toml"
    conf.write_text(
        f'endpoint = "{publisher.endpoint}"\nreplay = "{publisher.replay_endpoint}"\n'
        f'worker = 5\nstate = "{state}"\nns = "cli"\nreport-interval = 0.1\nblock-size = 16\n'
        f"metrics-port = {free_port()}\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "tools.sarpctl", "--socket", str(sarpd_proc.socket)]
    proc = subprocess.Popen(
        [*cmd, "bridge", "vllm", "--config", str(conf), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=tmp_path,
        text=True,
    )
    try:
        assert publisher.subscribed.wait(30), "sarpctl bridge never subscribed"
        publisher.publish(encode_batch([stored([6], None, list(range(8)), 8),  # partial
                                        stored([7, 8, 9], None, list(range(48)))]))
        publisher.flush()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with SyncClient(sarpd_proc.socket) as c:
                if c.match(hashes=[7, 8, 9], ns="cli")["blocks"] == 3:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("blocks never indexed through sarpctl bridge")
        port = tomllib.loads(conf.read_text())["metrics-port"]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert b'sarp_bridge_events_total{type="stored",worker="5"} 1.0' in metrics
        assert b'sarp_bridge_blocks_new_total{worker="5"} 3.0' in metrics
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    last = json.loads(out.strip().splitlines()[-1])
    assert last["events"]["stored"] == 1 and last["blocks_new"] == 3 and last["last_seq"] == 0
    assert last["ignored_by"] == {"partial": 1}  # block-size = 16 from the config file
    assert json.loads(state.read_text())["worker"] == 5
    with SyncClient(sarpd_proc.socket) as c:
        assert c.match(hashes=[7, 8, 9], ns="cli")["meta"] == [5 << 48] * 3


def run_bridge(tmp_path: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(
        main, ["--socket", str(tmp_path / "none.sock"), "bridge", "vllm", *args])
    return res.exit_code, res.output


def test_unreadable_config_file_is_a_usage_error(tmp_path: Path) -> None:
    conf = tmp_path / "bad.toml"
    conf.write_text("endpoint = \n")
    code, out = run_bridge(tmp_path, "--config", str(conf))
    assert code == 2 and "bad.toml" in out and "--config" in out


def test_bad_namespace_template_and_state_file_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "w0.json"
    code, out = run_bridge(tmp_path, "--endpoint", "tcp://127.0.0.1:1", "--ns", "m/{rank}",
                           "--state", str(state))
    assert code == 2 and "is not a valid template" in out
    state.write_text(json.dumps({"format": 9}))
    code, out = run_bridge(tmp_path, "--endpoint", "tcp://127.0.0.1:1", "--state", str(state))
    assert code == 2 and f"state file {state}: format 9, expected 1" in out
