"""`sarpctl cluster local` (tools/ctl_cluster.py, tools/cluster/local.py): a whole cluster
on loopback as real processes; one JSON line once every replica serves; writes on one
replica are seen by the others of its shard and not by another shard; SIGTERM stops
every process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sarpd.client import SyncClient

REPO = Path(__file__).resolve().parents[2]
TOKENS = list(range(64))  # 4 blocks


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_cluster_local_runs_then_stops_everything(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tools.sarpctl", "cluster", "local", "--dir", str(tmp_path),
         "--nats", "3", "--replicas", "2", "--shards", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, proc.stderr.read() if proc.stderr else ""
        doc = json.loads(line)
        assert len(doc["nats"]) == 3 and all(u.startswith("nats://127.0.0.1:") for u in doc["nats"])
        reps = doc["replicas"]
        assert sorted((r["shard"], r["replica"]) for r in reps) == [
            ("s0", "r0"), ("s0", "r1"), ("s1", "r0"), ("s1", "r1")]
        pids = [*doc["nats_pids"], *(r["pid"] for r in reps)]
        assert all(alive(p) for p in pids)
        sock = {(r["shard"], r["replica"]): r["socket"] for r in reps}
        with SyncClient(sock[("s0", "r0")]) as c:
            assert c.insert(tokens=TOKENS, meta=5)["seq"] == 1
        deadline = time.monotonic() + 20
        with SyncClient(sock[("s0", "r1")]) as c:
            while c.match(tokens=TOKENS)["blocks"] != 4:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        with SyncClient(sock[("s1", "r0")]) as c:
            assert c.match(tokens=TOKENS)["blocks"] == 0  # another shard's log
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert not any(alive(p) for p in pids)


def test_sarpctl_cluster_flag_reaches_the_whole_cluster(tmp_path: Path) -> None:
    """`sarpctl --cluster URL insert|match` as today's commands, over NATS; an
    unreachable cluster is one clear error, exit 2."""
    from tools.cluster.local import local_sarp_cluster

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ctl = [sys.executable, "-m", "tools.sarpctl"]
    with local_sarp_cluster(tmp_path / "cl", nats_nodes=1, replicas=1, shards=2) as lc:
        assert lc.nats is not None
        urls = ",".join(lc.nats.urls)
        tokens = json.dumps(list(range(48)))
        ins = subprocess.run([*ctl, "--cluster", urls, "insert", "--meta", "7", "--json"],
                             input=tokens, capture_output=True, text=True, env=env, cwd=REPO)
        assert ins.returncode == 0, ins.stderr
        assert json.loads(ins.stdout)["new_blocks"] == 3
        hit = subprocess.run([*ctl, "--cluster", urls, "match", "--json"], input=tokens,
                             capture_output=True, text=True, env=env, cwd=REPO)
        assert hit.returncode == 0 and json.loads(hit.stdout)["blocks"] == 3, hit.stderr
    down = subprocess.run([*ctl, "--cluster", "nats://127.0.0.1:1", "match"], input=tokens,
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert down.returncode == 2 and "cannot use the cluster at nats://127.0.0.1:1" in down.stderr


def test_cluster_status_shows_each_replica_s_progress(tmp_path: Path) -> None:
    from tools.cluster.local import local_sarp_cluster

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ctl = [sys.executable, "-m", "tools.sarpctl"]
    conf = tmp_path / "ckpt.toml"
    conf.write_text("[cluster]\ncheckpoint_interval_s = 0.3\n")
    with local_sarp_cluster(tmp_path / "cl", nats_nodes=1, replicas=2, shards=1,
                            config=conf) as lc:
        assert lc.nats is not None
        urls = ",".join(lc.nats.urls)
        with SyncClient.cluster(urls) as c:
            for i in range(5):
                c.insert(tokens=list(range(16 * i, 16 * i + 32)), meta=i)
        deadline = time.monotonic() + 20
        while True:
            out = subprocess.run([*ctl, "--cluster", urls, "cluster", "status", "--json"],
                                 capture_output=True, text=True, env=env, cwd=REPO)
            assert out.returncode == 0, out.stderr
            doc = json.loads(out.stdout)
            (shard,) = doc["shards"]
            if ([r["applied_seq"] for r in shard["replicas"]] == [5, 5]
                    and shard["checkpoint"] is not None):
                break
            assert time.monotonic() < deadline, doc
            time.sleep(0.2)
        assert doc["shard_map"] == ["s0"] and shard["last_seq"] == 5
        assert shard["first_seq"] in (1, 6)  # trimmed below the checkpoint at 5, or not yet
        assert [r["replica"] for r in shard["replicas"]] == ["r0", "r1"]
        assert all(r["lag"] == 0 and r["report_age_s"] < 15 for r in shard["replicas"])
        text = subprocess.run([*ctl, "--cluster", urls, "cluster", "status"],
                              capture_output=True, text=True, env=env, cwd=REPO).stdout
        assert shard["checkpoint"]["seq"] == 5 and 0 <= shard["checkpoint"]["age_s"] < 60
        assert "shard s0: log " in text and "r1: applied 5, lag 0" in text
        assert "checkpoint at 5 (" in text
    bare = subprocess.run([*ctl, "cluster", "status"], capture_output=True, text=True,
                          env=env, cwd=REPO)
    assert bare.returncode == 2 and "needs --cluster URL" in bare.stderr
