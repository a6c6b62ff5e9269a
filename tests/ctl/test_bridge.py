"""`sarpctl bridge vllm` (sarpd.ctl.bridge): options from a TOML file, a real run
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
from sarpd.ctl.main import main
from tests.daemon_helpers import REPO, Launcher, SarpdProc, free_port, scrape
from tools.bench.vllm_publisher import Publisher, encode_batch, stored


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
    cmd = [sys.executable, "-m", "sarpd.ctl.main", "--socket", str(sarpd_proc.socket)]
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


@pytest.mark.parametrize(
    ("args", "option", "value"),
    [
        (["--endpoint", "foo"], "--endpoint", "foo"),
        (["--endpoint", "tcp://nohost:x"], "--endpoint", "tcp://nohost:x"),
        (["--endpoint", "tcp://*:5557"], "--endpoint", "tcp://*:5557"),
        (["--endpoint", "tcp://127.0.0.1:1", "--replay", "5558"], "--replay", "5558"),
        (["--endpoint", "tcp://127.0.0.1:1", "--replay", "tcp://h:70000"], "--replay",
         "tcp://h:70000"),
    ],
)  # fmt: skip
def test_bad_endpoints_are_usage_errors(tmp_path: Path, args: list[str], option: str,
                                        value: str) -> None:  # fmt: skip
    """A bad endpoint is refused before anything starts: exit 2, the option and the
    value named, no traceback (it was a raw ZMQError)."""
    code, out = run_bridge(tmp_path, *args)
    assert code == 2 and f"Invalid value for '{option}': {value!r}: " in out, out
    assert "Traceback" not in out and "ZMQ" not in out


def test_state_directory_must_exist(tmp_path: Path) -> None:
    state = tmp_path / "nodir" / "w0.json"
    code, out = run_bridge(tmp_path, "--endpoint", "tcp://127.0.0.1:1", "--state", str(state))
    assert code == 2 and f"directory {state.parent} does not exist" in out
    assert not state.parent.exists()


def start_bridge_proc(socket: Path, tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str],
                                                                         Path]:  # fmt: skip
    """`sarpctl bridge vllm` as a process at the default log level; its stderr file."""
    err = tmp_path / "bridge.err"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sarpd.ctl.main", "--socket", str(socket), "bridge", "vllm",
         "--state", str(tmp_path / "w0.json"), "--report-interval", "0.5", *args],
        stdout=subprocess.DEVNULL, stderr=err.open("w"), env=env, cwd=tmp_path, text=True,
    )  # fmt: skip
    return proc, err


def wait_for_text(path: Path, text: str, proc: subprocess.Popen[str],
                  timeout: float = 20.0) -> str:  # fmt: skip
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = path.read_text()
        if text in got:
            return got
        assert proc.poll() is None, f"bridge exited {proc.returncode}: {got}"
        time.sleep(0.1)
    pytest.fail(f"{text!r} not in the bridge's stderr after {timeout} s:\n{path.read_text()}")


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


def test_missing_sarpd_is_warned_then_connected_when_it_starts(
    publisher: Publisher, sarpd_factory: Launcher, tmp_path: Path
) -> None:
    """Against a socket nobody serves: a WARNING at the default log level within a few
    seconds; sarpd started later: the bridge connects, applies what was published
    meanwhile, says so, and its counters (sarpd's stats, its own metrics) show the
    outage."""
    port, sarpd_port = free_port(), free_port()
    sarpd = sarpd_factory(start=False, extra_args=("--metrics-port", str(sarpd_port)))
    proc, err = start_bridge_proc(sarpd.socket, tmp_path, "--endpoint", publisher.endpoint,
                                  "--replay", publisher.replay_endpoint,
                                  "--metrics-port", str(port))  # fmt: skip
    try:
        t0 = time.monotonic()
        text = wait_for_text(err, "WARNING sarpd unreachable: ", proc, timeout=15)
        assert time.monotonic() - t0 < 15 and f"sarpd socket {sarpd.socket} does not exist" in text
        assert publisher.subscribed.wait(30)
        publisher.publish(encode_batch([stored([7, 8, 9], None, list(range(48)))]))
        publisher.flush()
        gauges = scrape(port)
        assert gauges['sarp_bridge_sarpd_unreachable_total{worker="0"}'] == 1
        assert gauges['sarp_bridge_sarpd_connect_failures_total{worker="0"}'] >= 1
        sarpd.start()
        wait_for_text(err, f"WARNING sarpd at {sarpd.socket} connected, after ", proc)
        deadline, rep = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            with SyncClient(sarpd.socket) as c:
                rep = c.stats().get("reports", {}).get("bridge-vllm-w0", {})
                if c.match(hashes=[7, 8, 9])["blocks"] == 3 and rep.get("events_stored") == 1:
                    break
            time.sleep(0.1)
        assert rep.get("events_stored") == 1, rep
        assert rep["sarpd_unreachable"] == 1 and rep["sarpd_connect_failures"] >= 1
        assert rep["sarpd_down_s"] == 0
        exported = scrape(sarpd_port)  # sarpd's own /metrics, from the bridge's report
        assert exported['sarpd_reported{name="sarpd_unreachable",source="bridge-vllm-w0"}'] == 1
        assert scrape(port)['sarp_bridge_sarpd_down_s{worker="0"}'] == 0
        sarpd.kill()  # gone while the bridge idles: its next report finds out, loud
        deadline = time.monotonic() + 20
        while err.read_text().count("WARNING sarpd unreachable: ") < 2:
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        assert scrape(port)['sarp_bridge_sarpd_unreachable_total{worker="0"}'] == 2
    finally:
        stop(proc)
    assert "Traceback" not in err.read_text()


def test_unreachable_publisher_is_warned(sarpd_proc: SarpdProc, tmp_path: Path) -> None:
    """A SUB connect never fails: nothing listening at --endpoint is a WARNING
    within a few seconds (the SUB socket's monitor), so is an unanswered replay."""
    dead, dead_replay = free_port(), free_port()
    proc, err = start_bridge_proc(sarpd_proc.socket, tmp_path, "--endpoint",
                                  f"tcp://127.0.0.1:{dead}", "--replay",
                                  f"tcp://127.0.0.1:{dead_replay}")  # fmt: skip
    try:
        text = wait_for_text(err, f"WARNING publisher at tcp://127.0.0.1:{dead} unreachable", proc)
        assert f"replay endpoint tcp://127.0.0.1:{dead_replay}: no answer in 5.0 s" in text
        deadline, rep = time.monotonic() + 20, dict[str, float]()
        while time.monotonic() < deadline and not rep.get("publisher_unreachable"):
            with SyncClient(sarpd_proc.socket) as c:
                rep = c.stats().get("reports", {}).get("bridge-vllm-w0", {})
            time.sleep(0.2)
        assert rep["publisher_unreachable"] == 1 and rep["replay_failures"] == 1
        assert rep["publisher_down_s"] > 0
    finally:
        stop(proc)
