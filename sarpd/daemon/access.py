"""Who may talk to sarpd, and which namespaces they may touch. Sans-I/O: the server
reads the peer's credentials (SO_PEERCRED) and asks this module; nothing here
touches a socket.

Three layers, all configured in `[server]` (see systemd/sarpd.toml):

1. The socket's mode and group (`socket_mode`, `socket_group`): the kernel's check.
2. `allow_uids` / `allow_gids`: when either is non-empty, a peer is admitted only if
   its uid is in `allow_uids`, or its primary gid (SO_PEERCRED) or one of its
   supplementary groups (SO_PEERGROUPS, Linux 4.13+) is in `allow_gids`. Others get
   one `forbidden` error (id 0) and are closed.
3. `bind_namespaces`: a peer whose uid is not in `admin_uids` may use only the
   namespaces of its own uid, ``uid:<uid>`` and ``uid:<uid>/<anything>``, in every
   op that names a namespace (match, insert, remove, clear, dump); `snapshot` and
   `check` are admin-only. Anything else is answered `forbidden` and changes nothing.
"""

from __future__ import annotations

import errno
import socket
import struct
from dataclasses import dataclass

from sarpd.config import ServerConfig
from sarpd.errors import Forbidden
from sarpd.model import Check, Clear, Dump, Insert, Match, Remove, Request, Snapshot

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux; not in Python 3.11's socket
_GID = struct.Struct("I")


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups, when asked for

    def __str__(self) -> str:
        return f"pid {self.pid} uid {self.uid} gid {self.gid}"


def peer_cred(sock: socket.socket | None, *, groups: bool = False) -> PeerCred | None:
    """The peer of a connected Unix socket (None when the platform cannot tell);
    with `groups`, also its supplementary groups."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if sock is None or opt is None:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, opt, _UCRED.size)
    except OSError:
        return None
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCred(pid, uid, gid, peer_groups(sock) if groups else ())


def peer_groups(sock: socket.socket) -> tuple[int, ...]:
    """Supplementary groups of the peer (SO_PEERGROUPS); () when unsupported."""
    for n in (256, 65536):  # NGROUPS_MAX is 65536: retry once when 256 is too few
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, n * _GID.size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                continue
            return ()
        return tuple(g for (g,) in _GID.iter_unpack(raw))
    return ()


def own_namespace(uid: int) -> str:
    return f"uid:{uid}"


@dataclass(frozen=True, slots=True)
class Policy:
    allow_uids: frozenset[int]
    allow_gids: frozenset[int]
    bind_namespaces: bool
    admin_uids: frozenset[int]

    @classmethod
    def from_config(cls, cfg: ServerConfig) -> Policy:
        return cls(
            frozenset(cfg.allow_uids),
            frozenset(cfg.allow_gids),
            cfg.bind_namespaces,
            frozenset(cfg.admin_uids),
        )

    @property
    def checks_requests(self) -> bool:
        return self.bind_namespaces

    @property
    def needs_groups(self) -> bool:
        return bool(self.allow_gids)

    def admit(self, cred: PeerCred | None) -> Forbidden | None:
        """None if the peer may connect, else the error to answer before closing."""
        if not self.allow_uids and not self.allow_gids:
            return None
        if cred is None:
            return Forbidden("peer: credentials unavailable (SO_PEERCRED) and an allowlist is set")
        if cred.uid in self.allow_uids or cred.gid in self.allow_gids:
            return None
        if not self.allow_gids.isdisjoint(cred.groups):
            return None
        return Forbidden(
            f"peer: uid {cred.uid} / gid {cred.gid} / groups {list(cred.groups)} not in allow_uids "
            f"{sorted(self.allow_uids)} or allow_gids {sorted(self.allow_gids)}"
        )

    def authorize(self, cred: PeerCred | None, req: Request) -> Forbidden | None:
        """None if `cred` may run `req`, else the error to answer instead."""
        if not self.bind_namespaces:
            return None
        uid = None if cred is None else cred.uid
        if uid is not None and uid in self.admin_uids:
            return None
        ns = namespace_of(req)
        if ns is None:
            if _admin_only(req):
                return Forbidden(
                    f"op: {type(req).__name__.lower()} is admin-only under bind_namespaces "
                    f"(uid {uid} not in admin_uids {sorted(self.admin_uids)})"
                )
            return None
        if uid is not None:
            own = own_namespace(uid)
            if ns == own or ns.startswith(own + "/"):
                return None
        return Forbidden(
            f"ns: {ns!r} is not a namespace of uid {uid} (bind_namespaces: "
            f"{own_namespace(uid) if uid is not None else 'uid:?'} or .../*)"
        )


def namespace_of(req: Request) -> str | None:
    """The namespace a request touches (None: it names none)."""
    if isinstance(req, Match | Insert | Dump):
        return req.seq.ns
    if isinstance(req, Remove):
        return req.seq.ns if req.seq is not None else req.ns
    if isinstance(req, Clear):
        return req.ns
    return None


def _admin_only(req: Request) -> bool:
    return isinstance(req, Snapshot | Check)
