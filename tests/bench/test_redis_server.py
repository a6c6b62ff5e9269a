"""A real redis-server under the harness (tools.bench.redis_server): restart, kill,
durability, and no orphan when the harness dies (skipped without the binary)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HAVE_REDIS = shutil.which("redis-server") is not None


@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server is not installed")
def test_redis_server_restart_and_kill(tmp_path: Path) -> None:
    from tools.bench.redis_server import RedisServer

    with RedisServer(tmp_path / "r", sync=True) as server:
        assert server.start() > 0
        c = server.client()
        c.set(b"k", b"v")
        server.kill()  # SIGKILL: appendfsync always kept the acknowledged write
        server.start()
        assert server.client().get(b"k") == b"v"
        server.client().set(b"k2", b"v2")
        res = server.restart(lambda c: c.mget([b"k", b"k2"]))
        assert res.result == [b"v", b"v2"]
        assert 0 < res.ready_s <= res.first_s
        assert server.disk_bytes() > 0
        assert (tmp_path / "r" / "dump.rdb").exists()  # SHUTDOWN saved the RDB too


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status  # a zombie has exited


@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server is not installed")
def test_redis_server_dies_with_the_harness(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    code = ("import os, sys\nfrom pathlib import Path\n"
            "from tools.bench.redis_server import RedisServer\n"
            f"s = RedisServer(Path({str(tmp_path)!r}))\ns.start()\n"
            "print(s.proc.pid, flush=True)\nos._exit(0)\n")  # no close, no finalizers
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)


@pytest.mark.skipif(not HAVE_REDIS, reason="redis-server is not installed")
def test_rewrite_aof_waits_for_a_rewrite_already_running(tmp_path: Path) -> None:
    """Redis refuses BGREWRITEAOF while a rewrite runs (its automatic one, here one
    made slow with rdb-key-save-delay); rewrite_aof waits for it, then rewrites."""
    from redis.exceptions import ResponseError

    from tools.bench.redis_server import IN_PROGRESS, RedisServer

    with RedisServer(tmp_path / "r", sync=False) as server:
        server.start()
        c = server.client()
        c.mset({b"k%d" % i: b"v" for i in range(200)})
        c.config_set("rdb-key-save-delay", 2000)  # 2 ms per key: a ~0.4 s rewrite
        c.bgrewriteaof()
        with pytest.raises(ResponseError, match=IN_PROGRESS):
            c.bgrewriteaof()  # what crashed the redis baseline's flush
        c.set(b"late", b"1")  # after the running rewrite started
        server.rewrite_aof()
        info = c.info("persistence")
        assert not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]
        assert info["aof_last_bgrewrite_status"] == "ok"
        c.config_set("rdb-key-save-delay", 0)
        res = server.restart(lambda c: c.mget([b"k0", b"late"]))
        assert res.result == [b"v", b"1"]
