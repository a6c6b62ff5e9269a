"""`sarpctl cluster local` (sarpd/ctl/cluster.py, tools/cluster/local.py): a whole cluster
on loopback as real processes; one JSON line once every replica serves; writes on one
replica are seen by the others of its shard and not by another shard; SIGTERM stops
every process."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from sarpd.client import SyncClient
from sarpd.ctl.cluster import status_lines

if TYPE_CHECKING:
    from tools.cluster.local import LocalCluster

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
        [sys.executable, "-m", "sarpd.ctl.main", "cluster", "local", "--dir", str(tmp_path),
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
    """`sarpctl --cluster URL insert|match` as today's commands, over NATS; `sarpctl
    --cluster URL status` is `cluster status` (the cluster, not a local socket), with
    each shard's blocks and each replica's applied writes; an unreachable cluster is
    one clear error, exit 2."""
    from tools.cluster.local import local_sarp_cluster

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ctl = [sys.executable, "-m", "sarpd.ctl.main"]
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
        check_cluster_status(lc, urls, env, ctl, first=(list(range(48)), 3))
    down = subprocess.run([*ctl, "--cluster", "nats://127.0.0.1:1", "match"], input=tokens,
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert down.returncode == 2 and "cannot use the cluster at nats://127.0.0.1:1" in down.stderr


def test_cluster_status_shows_each_replica_s_progress(tmp_path: Path) -> None:
    from tools.cluster.local import local_sarp_cluster

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ctl = [sys.executable, "-m", "sarpd.ctl.main"]
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
        assert doc["shard_map"] == ["s0"] and shard["last_seq"] == 5 and doc["rule"] == "block0"
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


def run_ctl(ctl: list[str], env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ctl, *args], capture_output=True, text=True, env=env, cwd=REPO,
                          timeout=60)


def check_cluster_status(lc: LocalCluster, urls: str, env: dict[str, str], ctl: list[str],
                         first: tuple[list[int], int]) -> None:
    """Inserts on both shards and a removal on one; then every shard's blocks (summing
    to the blocks present), every replica's applied writes, in `cluster status` and in
    `--cluster status` alike, and in each replica's own `stats` and `status`."""
    blocks = {"s0": 0, "s1": 0}
    writes = {"s0": [0, 0], "s1": [0, 0]}  # inserts, removes applied
    with SyncClient.cluster(urls) as c:
        seqs = {c.shard_for(tokens=first[0]): first}
        seed = 1
        while len(seqs) < 2 or min(blocks.values()) < 4:
            toks = list(range(1000 * seed, 1000 * seed + 16 * (1 + seed % 4)))
            shard = c.shard_for(tokens=toks)
            assert c.insert(tokens=toks, meta=seed)["new_blocks"] == len(toks) // 16
            blocks[shard] += len(toks) // 16
            writes[shard][0] += 1
            seqs.setdefault(shard, (toks, len(toks) // 16))
            seed += 1
        shard0 = c.shard_for(tokens=first[0])
        blocks[shard0] += first[1]
        writes[shard0][0] += 1
        gone, n = seqs["s1"]
        assert c.remove(tokens=gone, start=1)["removed"] == n - 1
        blocks["s1"] -= n - 1
        writes["s1"][1] += 1
    last = {s: sum(w) for s, w in writes.items()}  # one log entry per write
    deadline = time.monotonic() + 20
    while True:  # replicas report every second
        out = run_ctl(ctl, env, "--cluster", urls, "cluster", "status", "--json")
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        if all(sh["size_seq"] == last[sh["shard"]] for sh in doc["shards"]):
            break
        assert time.monotonic() < deadline, doc
        time.sleep(0.2)
    assert {sh["shard"]: sh["blocks"] for sh in doc["shards"]} == blocks
    assert doc["blocks"] == sum(blocks.values())
    for sh in doc["shards"]:
        (rep,) = sh["replicas"]
        assert rep["live"] and rep["blocks"] == sh["blocks"] and sh["size_of"] == "r0"
        inserts, removes = writes[sh["shard"]]
        assert rep["applied"] == {"entries": inserts + removes, "inserts": inserts,
                                  "removes": removes, "clears": 0}
    text = run_ctl(ctl, env, "--cluster", urls, "cluster", "status")
    same = run_ctl(ctl, env, "--cluster", urls, "status")
    assert text.returncode == 0 and same.returncode == 0, same.stderr

    def lines(out: str) -> list[str]:  # the report ages move between two calls
        return [re.sub(r"\d+(\.\d+)? s (ago|old)", "T", line) for line in out.splitlines()]

    assert lines(same.stdout) == lines(text.stdout)
    assert same.stdout.startswith(f"cluster {urls}: shards s0, s1; blocks "
                                  f"{sum(blocks.values())}, segments ")
    assert ".sock" not in same.stdout  # the cluster, not some local socket
    for shard, (inserts, removes) in writes.items():
        assert f"shard {shard}: log 1..{last[shard]}" in same.stdout
        assert f"; blocks {blocks[shard]}, segments " in same.stdout
        assert f"writes applied: {inserts} inserts, {removes} removes, 0 clears" in same.stdout
    for p in lc.procs:  # each replica's own view counts what it applied from the log
        with SyncClient(p.socket) as rc:
            st = rc.stats()
        assert (st["inserts"], st["removes"], st["blocks"]) == (
            *writes[p.shard], blocks[p.shard])
        own = run_ctl(ctl, env, "--socket", str(p.socket), "status")
        assert own.returncode == 0 and f"inserts {writes[p.shard][0]}" in own.stdout


def test_the_status_text_says_what_is_unknown_and_who_is_silent() -> None:
    """An older replica's report (no blocks, no writes), a silent one, a shard no
    replica reported: said as such, never as 0."""
    doc = {"blocks": None, "segments": None, "shards": [
        {"shard": "s0", "first_seq": 1, "last_seq": 9, "leader": "n1", "checkpoint": None,
         "blocks": None, "segments": None, "size_of": None, "size_seq": None,
         "replicas": [{"replica": "r0", "applied_seq": 9, "lag": 0, "report_age_s": 42.0,
                       "live": False, "blocks": None, "segments": None, "applied": None}]},
        {"shard": "s1", "first_seq": 0, "last_seq": 0, "leader": None, "checkpoint": None,
         "blocks": None, "segments": None, "size_of": None, "size_seq": None,
         "replicas": []}]}
    got = status_lines("nats://h:4222", doc)
    assert got[0] == "cluster nats://h:4222: shards s0, s1; blocks -, segments -"
    assert got[1] == "rule: unknown (no shard map in the cluster's bucket)"
    assert got[2].endswith("no checkpoint; blocks unknown (no replica reported them)")
    assert got[3] == "  r0: applied 9, lag 0, report 42.0 s ago (silent: not live)"
    assert got[5] == "  (no replica reported)"
    doc["rule"], doc["splits"], doc["placements"] = "heads", 3, 41
    assert status_lines("nats://h:4222", doc)[1].startswith("rule: heads (shard map version 2")
    assert status_lines("nats://h:4222", doc)[1].endswith(": 3 splits, 41 buckets placed")
    doc["rule"] = "block0"
    assert status_lines("nats://h:4222", doc)[1].startswith("rule: block0 (shard map version 1")
