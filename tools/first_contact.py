"""`python -m tools.first_contact`: issue 22's targets, measured against a real sarpd.

Each check runs the installed commands (`sarpd`, `sarpctl`, beside this Python) as a
newcomer would and prints what it measured; exit 1 if any target is missed:

    bad-config      a TOML with a wrongly typed value, and one with an unknown table:
                    sarpd exits non-zero within 5 s, its message names the key
    mute-socket     `sarpctl status` against a socket whose server never answers:
                    exits non-zero within 15 s with a timeout error
    missing-parent  `--socket` under a directory that does not exist: exits non-zero,
                    nothing created
    bad-input       bad tokens, meta and JSON on `sarpctl match/insert` and the Python
                    client against a real sarpd: messages name the field and the rule,
                    none contains a numpy dtype or a Python exception name

The fifth target (the README's examples pasted in order on one fresh `make run`) is
`tests/test_readme.py`. The default suite checks the same behaviour without timing
it (tests/test_config.py, tests/daemon/test_cli.py, tests/tools/test_sarpctl.py,
tests/daemon/test_bad_input.py): this script is where the seconds are measured.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
# what a user-facing message must never show: numpy dtypes, Python exception names
LEAKS = re.compile(r"<U\d|\bint64\b|\bfloat64\b|\bobject\b|dtype|[A-Z][a-z]+Error\b"
                   r"|Traceback|invalid literal|msgpack")


@dataclass(frozen=True, slots=True)
class Outcome:
    name: str
    ok: bool
    detail: str


def _run(args: list[str], timeout: float = 60, stdin: str = "",
         cwd: Path | None = None) -> tuple[int, str, float]:
    t0 = time.monotonic()
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - t0


def bad_config(tmp: Path) -> Outcome:
    cases = {"max_connections": '[server]\nmax_connections = "ten"\n',
             "indx": "[indx]\nwindow_cap = 8\n"}
    details, ok = [], True
    for key, text in cases.items():
        conf = tmp / f"{key}.toml"
        conf.write_text(text)
        rc, out, secs = _run([str(BIN / "sarpd"), "--config", str(conf), "--data-dir",
                              str(tmp / "data"), "--socket", str(tmp / "s.sock")])
        hit = rc != 0 and secs <= 5 and key in out and "ready" not in out
        ok &= hit
        details.append(f"{key}: exit {rc} in {secs:.2f} s: {out.strip().splitlines()[-1]!r}")
    return Outcome("bad-config", ok, "; ".join(details))


@contextlib.contextmanager
def mute_server(path: Path) -> Iterator[None]:
    """A Unix socket that accepts connections and never answers."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen()
    try:
        yield
    finally:
        srv.close()


def mute_socket(tmp: Path) -> Outcome:
    path = tmp / "mute.sock"
    with mute_server(path):
        rc, out, secs = _run([str(BIN / "sarpctl"), "--socket", str(path), "status"])
    ok = rc != 0 and secs <= 15 and "answer" in out and str(path) in out
    return Outcome("mute-socket", ok, f"exit {rc} in {secs:.2f} s: {out.strip()!r}")


def missing_parent(tmp: Path) -> Outcome:
    missing = tmp / "nonexistent" / "dir"
    rc, out, secs = _run([str(BIN / "sarpd"), "--data-dir", str(tmp / "data2"),
                          "--socket", str(missing / "s.sock")])
    created = [p.name for p in (tmp / "nonexistent", tmp / "data2") if p.exists()]
    ok = rc != 0 and not created and str(missing) in out
    return Outcome("missing-parent", ok, f"exit {rc} in {secs:.2f} s, created {created}: "
                   f"{out.strip().splitlines()[-1]!r}")


def _client_messages(sock: Path) -> list[str]:
    from sarpd.client import SyncClient
    from sarpd.errors import SarpError

    out = []
    with SyncClient(sock) as c:
        calls: list[Callable[[], object]] = [
            lambda: c.match(tokens=[1, 2, 99999999999999999999999]),
            lambda: c.match(tokens=["a", "b"]),  # type: ignore[list-item]
            lambda: c.insert(tokens=list(range(16)), meta=2**64),
            lambda: c.insert(tokens=list(range(16)), meta=-1)]
        for call in calls:
            try:
                call()
                out.append("(accepted)")
            except SarpError as exc:
                out.append(exc.message)
    return out


def bad_input(tmp: Path) -> Outcome:
    sock = tmp / "sarpd.sock"
    daemon = subprocess.Popen([str(BIN / "sarpd"), "--data-dir", str(tmp / "data3"),
                               "--socket", str(sock), "--sync", "none"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(sock)
        ctl = [str(BIN / "sarpctl"), "--socket", str(sock)]
        messages = [
            _run([*ctl, "match"], stdin="[1, 2, 99999999999999999999999]")[1],
            _run([*ctl, "match"], stdin='["a", "b"]')[1],
            _run([*ctl, "match"], stdin='{"a": 1}')[1],
            _run([*ctl, "insert", "--meta", str(2**64)], stdin="1 2 3")[1],
            _run([*ctl, "insert"], stdin="1 2 x")[1],
            *_client_messages(sock),
        ]
    finally:
        daemon.terminate()
        daemon.wait(30)
    named = [m for m in messages if re.search(r"tokens|meta|FILE|--meta", m)]
    leaks = [m for m in messages if LEAKS.search(m)]
    ok = len(named) == len(messages) and not leaks
    shown = " | ".join(m.strip().splitlines()[-1] for m in messages)
    return Outcome("bad-input", ok, f"{len(named)}/{len(messages)} name the field, "
                   f"{len(leaks)} leak internals: {shown}")


def _wait_ready(sock: Path) -> None:
    from sarpd.client import SyncClient

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception), SyncClient(sock, timeout=2) as c:
            c.ping()
            return
        time.sleep(0.05)
    raise TimeoutError(f"sarpd at {sock} not ready in 60 s")


CHECKS: tuple[Callable[[Path], Outcome], ...] = (bad_config, mute_socket, missing_parent,
                                                 bad_input)


def main() -> int:
    results = []
    for check in CHECKS:
        with tempfile.TemporaryDirectory(prefix="sarp-fc-", dir="/tmp") as tmp:
            results.append(check(Path(tmp)))
    for r in results:
        print(f"{'ok  ' if r.ok else 'MISS'} {r.name:<15} {r.detail}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
