"""Starting a real sarpd for a benchmark (tools.bench.spawn): ready on a fresh
socket, stopped cleanly with its temp directory removed; a daemon that cannot start
is a `DaemonStartError` carrying its log."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from sarpd.client import SyncClient
from tools.bench.spawn import (
    PACKAGES,
    REPO,
    DaemonStartError,
    compile_bytecode,
    start_daemon,
    stop_daemon,
)


def test_start_answers_then_stop_cleans_up(tmp_path: Path) -> None:
    proc, sock = start_daemon(tmp_path / "data", backend="memory")
    try:
        assert sock.name == "sarpd.sock" and sock.parent.name.startswith("sarp-bench-")
        with SyncClient(sock) as c:
            assert c.hello()["backend"] == "memory"
            assert c.insert(hashes=[1, 2, 3], meta=7)["new_blocks"] == 3
            assert c.match(hashes=[1, 2, 3])["meta"] == [7, 7, 7]
    finally:
        stop_daemon(proc, sock)
    assert proc.returncode == 0  # SIGTERM: a clean stop
    assert not sock.parent.exists()


def test_a_daemon_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    with pytest.raises(DaemonStartError, match=r"(?s)sarpd exited with \d+: .*nope"):
        start_daemon(tmp_path / "data", backend="nope", timeout_s=30)


def test_compile_bytecode_leaves_every_project_module_compiled() -> None:
    """Timed spawns start from bytecode, as a pip-installed sarpd does."""
    compile_bytecode()
    for pkg in PACKAGES:
        sources = list((REPO / pkg).rglob("*.py"))
        assert sources
        missing = [s for s in sources
                   if not Path(importlib.util.cache_from_source(str(s))).exists()]
        assert missing == []
