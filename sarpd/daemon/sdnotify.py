"""systemd's sd_notify protocol, without libsystemd: one datagram to $NOTIFY_SOCKET.

A path starting with '@' is in the abstract namespace (the '@' becomes a NUL byte).
Without NOTIFY_SOCKET (not run by systemd with Type=notify) every call is a no-op.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("sarpd.daemon.sdnotify")


def notify(*fields: str, env: dict[str, str] | None = None) -> bool:
    """Send e.g. notify("READY=1", "STATUS=serving"). True if a datagram was sent."""
    addr = (os.environ if env is None else env).get("NOTIFY_SOCKET", "")
    if not addr or not fields:
        return False
    if addr[0] not in ("/", "@"):
        log.warning("NOTIFY_SOCKET=%r: neither a path nor an abstract name; ignored", addr)
        return False
    target = "\0" + addr[1:] if addr[0] == "@" else addr
    payload = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(target)
            sock.sendall(payload)
    except OSError as exc:
        log.warning("sd_notify to %s failed: %s", addr, exc)
        return False
    return True


def status(text: str) -> bool:
    return notify(f"STATUS={text}")
