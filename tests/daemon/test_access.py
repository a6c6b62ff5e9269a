"""Socket permissions, the SO_PEERCRED allowlist and namespace binding (sarpd.daemon.access):
the policy alone, then against real daemons. The binding is tested with a client
process running under another uid (nobody) when the tests run as root; otherwise
that test is skipped and the allowlist tests still exclude the current uid.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import socket
import stat

import msgpack
import pytest

from sarpd.config import ServerConfig
from sarpd.daemon.access import PeerCred, Policy
from sarpd.model import Check, Clear, Dump, Match, Remove, SeqSpec, Snapshot
from tests.daemon_helpers import Launcher, RawConn

NOBODY = 65534


def policy(**kw: object) -> Policy:
    return Policy.from_config(ServerConfig(**kw))  # type: ignore[arg-type]


def test_policy_admit() -> None:
    me = PeerCred(1, 1000, 100)
    assert policy().admit(me) is None  # no allowlist: anyone the socket mode lets in
    assert policy(allow_uids=(1000,)).admit(me) is None
    assert policy(allow_gids=(100,)).admit(me) is None
    refused = policy(allow_uids=(5,), allow_gids=(6,)).admit(me)
    assert refused is not None and refused.code == "forbidden"
    assert "uid 1000" in refused.message and "allow_uids [5]" in refused.message
    assert policy(allow_uids=(5,)).admit(None) is not None  # unknown peer: refused


def test_policy_namespace_binding() -> None:
    p = policy(bind_namespaces=True, admin_uids=(0,))
    user, root = PeerCred(1, 1000, 1000), PeerCred(1, 0, 0)
    seq = lambda ns: SeqSpec(ns=ns, tokens=None)  # noqa: E731
    for ok_ns in ("uid:1000", "uid:1000/chat"):
        assert p.authorize(user, Match(1, seq=seq(ok_ns))) is None
    for bad_ns in ("", "uid:10000", "uid:100", "other", "uid:1000x"):
        err = p.authorize(user, Match(1, seq=seq(bad_ns)))
        assert err is not None and err.code == "forbidden" and repr(bad_ns) in err.message
    assert p.authorize(user, Clear(1, ns="uid:1001")) is not None
    assert p.authorize(user, Remove(1, ns="x")) is not None
    assert p.authorize(user, Dump(1, seq=seq("x"))) is not None
    assert p.authorize(user, Snapshot(1)) is not None
    assert p.authorize(user, Check(1)) is not None
    assert p.authorize(root, Clear(1, ns="anything")) is None
    assert p.authorize(root, Check(1)) is None
    assert policy().authorize(user, Clear(1, ns="x")) is None  # binding off


def test_allowlist_refuses_a_peer_not_in_it(sarpd_factory: Launcher) -> None:
    other = os.getuid() + 4242
    proc = sarpd_factory(config={"server": {"allow_uids": other}}, start=False)
    # allow_uids is a list in TOML; write it by hand (toml_value has no lists)
    assert proc.config_path is not None
    proc.config_path.write_text(
        f"[server]\nallow_uids = [{other}]\nallow_gids = [{os.getgid() + 4242}]\n"
    )
    proc.start(wait=False)
    _wait_socket(proc)
    with RawConn(proc.socket, timeout=10) as conn:
        got = conn.recv()
        assert got["id"] == 0 and got["error"]["code"] == "forbidden", got
        assert f"uid {os.getuid()}" in got["error"]["message"]
        assert conn.closed_by_server()
    assert "refused: peer: uid" in proc.log()


def test_allowlist_admits_by_gid(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory(config={"server": {"max_queue": 100}}, start=False)
    assert proc.config_path is not None
    proc.config_path.write_text(
        f"[server]\nallow_uids = [{os.getuid() + 4242}]\nallow_gids = [{os.getgid()}]\n"
    )
    proc.start()
    with RawConn(proc.socket) as conn:
        assert conn.call("ping")["ok"]


def _wait_socket(proc: object) -> None:
    import time

    deadline = time.monotonic() + 60
    while not proc.socket.exists() and time.monotonic() < deadline:  # type: ignore[attr-defined]
        time.sleep(0.05)
    time.sleep(0.3)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown the socket to a group")
def test_socket_mode_and_group_as_configured(sarpd_factory: Launcher) -> None:
    group = grp.getgrgid(1).gr_name  # "daemon" on Debian: not root's group
    proc = sarpd_factory(config={"server": {"socket_mode": "0640", "socket_group": group}})
    st = os.stat(proc.socket)
    assert stat.S_IMODE(st.st_mode) == 0o640 and st.st_gid == 1


def client_as(
    uid: int, path: str, reqs: list[dict[str, object]], groups: tuple[int, ...] = ()
) -> list[str]:
    """Send `reqs` from a forked child running as `uid` (primary gid `uid`,
    supplementary `groups`; no exec: the interpreter may be unreadable to it); the
    error code of each answer ('ok' for a success), then the code of an id-0 error
    ('none' if there was none). Answers missing when the server closed: 'closed'."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: drop to uid, talk, report, exit without running pytest code
        code = 1
        try:
            os.close(rfd)
            os.setgroups(list(groups))
            os.setgid(uid)
            os.setuid(uid)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(30)
            sock.connect(path)
            unp, out = msgpack.Unpacker(raw=False), {}
            with contextlib.suppress(ConnectionError):  # a refused peer is closed
                sock.sendall(
                    b"".join(msgpack.packb({"id": i, **r}) for i, r in enumerate(reqs, 1))
                )
            with contextlib.suppress(ConnectionError):  # ... after its one error
                while len([k for k in out if k]) < len(reqs):
                    data = sock.recv(65536)
                    if not data:
                        break
                    unp.feed(data)
                    for m in unp:
                        out[m["id"]] = m.get("error", {}).get("code", "ok")
            codes = [out.get(i, "closed") for i in range(1, len(reqs) + 1)]
            os.write(wfd, json.dumps([*codes, out.get(0, "none")]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and data, "the client as another uid failed"
    result: list[str] = json.loads(data)
    return result


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
def test_bound_namespaces_keep_another_uid_out(sarpd_factory: Launcher) -> None:
    server = {"bind_namespaces": True, "socket_mode": "0666"}
    proc = sarpd_factory(config={"server": server})
    os.chmod(proc.socket.parent, 0o755)  # let nobody reach the socket
    toks = list(range(1, 33))
    with RawConn(proc.socket) as conn:  # root is an admin: any namespace
        assert conn.call("insert", 1, ns="victim", tokens=toks, meta=5)["ok"]
    t = list(range(1, 33))
    codes = client_as(NOBODY, str(proc.socket), [
        {"op": "insert", "ns": "uid:65534", "tokens": t, "meta": 1},
        {"op": "match", "ns": "uid:65534/sub", "tokens": t},
        {"op": "match", "ns": "victim", "tokens": t},
        {"op": "insert", "ns": "victim", "tokens": t, "meta": 9},
        {"op": "remove", "ns": "victim", "tokens": t},
        {"op": "clear", "ns": "victim"},
        {"op": "dump", "ns": "victim", "tokens": t},
        {"op": "snapshot"},
        {"op": "check"},
        {"op": "ping"},
    ])
    assert codes[:2] == ["ok", "ok"]  # its own namespace and a sub-namespace
    assert codes[2:9] == ["forbidden"] * 7, codes
    assert codes[9:] == ["ok", "none"]  # ops without a namespace stay open
    with RawConn(proc.socket) as conn:  # the victim's blocks and meta are untouched
        got = conn.call("match", 2, ns="victim", tokens=toks)
        assert got["ok"] and got["blocks"] == 2
        assert got["meta"] == (5).to_bytes(8, "little") * 2
        stats = conn.call("stats", 3)
        assert stats["errors_forbidden"] == 7


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another uid")
@pytest.mark.parametrize("allowed_gid", [1, 2])
def test_allowlist_admits_by_supplementary_group(sarpd_factory: Launcher, allowed_gid: int) -> None:
    proc = sarpd_factory(start=False)
    assert proc.config_path is None
    proc.config_path = proc.data_dir.parent / "allow.toml"
    proc.config_path.write_text(
        f'[server]\nsocket_mode = "0666"\nallow_uids = [0]\nallow_gids = [{allowed_gid}]\n'
    )
    proc.start()
    os.chmod(proc.socket.parent, 0o755)
    # nobody, primary gid nobody, supplementary group 1: admitted only via group 1
    codes = client_as(NOBODY, str(proc.socket), [{"op": "ping"}], groups=(1,))
    if allowed_gid == 1:
        assert codes == ["ok", "none"]
    else:
        assert codes == ["closed", "forbidden"]
        assert "groups [1] not in allow_uids [0] or allow_gids [2]" in proc.log()
