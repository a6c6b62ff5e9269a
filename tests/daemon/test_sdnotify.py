"""systemd's sd_notify (sarpd.daemon.sdnotify): datagrams to a path or an abstract
socket, a no-op without $NOTIFY_SOCKET, and a real sarpd's READY / STOPPING."""

from __future__ import annotations

import os
import signal
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from sarpd.daemon import sdnotify
from tests.daemon_helpers import Launcher, RawConn


def test_sd_notify_ready_on_an_abstract_socket(sarpd_factory: Launcher) -> None:
    name = f"sarp-test-notify-{os.getpid()}-{threading.get_ident()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(60)
    try:
        proc = sarpd_factory(start=False, env={"NOTIFY_SOCKET": "@" + name})
        proc.start(wait=False)
        seen: list[str] = []
        while not any("READY=1" in m for m in seen):
            seen.append(sock.recv(4096).decode())
        assert any(line.startswith("STATUS=") for m in seen for line in m.split("\n"))
        with RawConn(proc.socket) as conn:  # READY means serving
            assert conn.call("ping")["ok"]
        proc.send_signal(signal.SIGTERM)
        while not any("STOPPING=1" in m for m in seen):
            seen.append(sock.recv(4096).decode())
        assert proc.stop() == 0
    finally:
        sock.close()


def test_sd_notify_on_a_path_and_without_notify_socket() -> None:
    with tempfile.TemporaryDirectory(prefix="sarp-", dir="/tmp") as tmp:
        path = str(Path(tmp) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            assert sdnotify.notify("READY=1", "STATUS=hi", env={"NOTIFY_SOCKET": path})
            assert sock.recv(100) == b"READY=1\nSTATUS=hi"
    assert not sdnotify.notify("READY=1", env={})


def test_sd_notify_ignores_an_address_that_is_neither_a_path_nor_abstract() -> None:
    assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": "relative/notify"})
    assert not sdnotify.notify(env={"NOTIFY_SOCKET": "@x"})  # no fields: nothing sent


def test_sd_notify_to_a_socket_nobody_listens_on_is_not_an_error() -> None:
    with tempfile.TemporaryDirectory(prefix="sarp-", dir="/tmp") as tmp:
        gone = str(Path(tmp) / "gone")
        assert not sdnotify.notify("READY=1", env={"NOTIFY_SOCKET": gone})


def test_status_sends_one_status_field(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryDirectory(prefix="sarp-", dir="/tmp") as tmp:
        path = str(Path(tmp) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            assert sdnotify.status("recovering: 3 of 9")
            assert sock.recv(100) == b"STATUS=recovering: 3 of 9"
