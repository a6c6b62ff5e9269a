"""All tunables in one place, with the paper's defaults.

`IndexConfig` shapes the index (it is recorded in the data directory: the block and
segment geometry may not change under existing data). `ServerConfig` shapes the
daemon. Both load from the `[index]` and `[server]` tables of a TOML file. A file that
cannot be read or parsed, an unknown setting and a value out of range raise
`ConfigError` (an operator's error, never a wire error) naming the setting and its
limit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from sarpd.errors import ConfigError

SyncPolicy = Literal["always", "none"]
# cluster mode: the shortest `trim_grace_s` (replicas report progress every second)
MIN_TRIM_GRACE_S = 2.0
LogFormat = Literal["text", "json"]


@dataclass(frozen=True, slots=True)
class IndexConfig:
    block_tokens: int = 16  # tokens per block
    segment_blocks: int = 64  # blocks per segment (segments start at multiples of it)
    routing_points: int = 4  # evenly spaced routing points per segment (0, 16, 32, 48)
    refine_threshold: int = 32  # posting list longer than this -> add a midpoint point
    refine_min_gap: int = 4  # refinement stops at points this many blocks apart
    prune_max_pred: int = 3  # drop a point whose predecessor has <= this many candidates
    window_cap: int = 4  # candidate segments read per 64-block window in the first round
    # exact matching (bound-and-verify): after the first round, read further rounds of
    # the unread candidates whose fingerprint bound exceeds the best verified run, so a
    # match reuses exactly what an exact index would. Off: one round of `window_cap`
    # candidates (the paper's capped matching: it may fall short where more than
    # window_cap candidates tie on their fingerprints).
    exact_match: bool = True
    # one locator record per block (block id -> window head, position) on the backend:
    # what `remove` by bare ids and `insert` with a `parent` (serving-engine events)
    # need. Off: inserts write one record per segment instead of one per block, and
    # those two forms answer bad_request. Recorded in the data directory.
    block_locators: bool = True
    # quotas: an insert into a namespace that already holds this many blocks is refused
    # (`quota_exceeded`); 0 = none. `namespace_quotas` overrides it per namespace.
    namespace_quota_blocks: int = 0
    namespace_quotas: dict[str, int] = field(default_factory=dict)
    # holders (protocol 2): an insert that would give a block more holders than this
    # answers `too_large` (nothing of it is applied)
    max_holders: int = 1024
    delta_max_entries: int = 8192  # directory delta merged into the base past this
    snapshot_interval_s: float = 60.0  # periodic snapshot (0 = only on demand/shutdown)
    max_sequence_tokens: int = 1_048_576

    def __post_init__(self) -> None:
        if self.segment_blocks % self.routing_points:
            raise ConfigError(
                f"segment_blocks ({self.segment_blocks}) must be a multiple of "
                f"routing_points ({self.routing_points})"
            )
        if not 1 <= self.segment_blocks <= 64:
            raise ConfigError(f"segment_blocks {self.segment_blocks} not in 1..64")
        if self.block_tokens < 1:
            raise ConfigError(f"block_tokens {self.block_tokens} must be >= 1")
        if self.window_cap < 1:
            raise ConfigError(f"window_cap {self.window_cap} must be >= 1")
        if not 1 <= self.max_holders <= 1 << 20:
            raise ConfigError(f"max_holders {self.max_holders} not in 1..{1 << 20}")
        quotas = {"namespace_quota_blocks": self.namespace_quota_blocks,
                  **{f"namespace_quotas[{k!r}]": v for k, v in self.namespace_quotas.items()}}
        for name, v in quotas.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{name}: {v!r} is not a block count >= 0")

    def quota(self, ns: str) -> int:
        """The most blocks namespace `ns` may hold (0: no quota)."""
        return self.namespace_quotas.get(ns, self.namespace_quota_blocks)

    @property
    def point_spacing(self) -> int:
        return self.segment_blocks // self.routing_points


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Replica mode (issue 15; the `[cluster]` table, or --cluster/--shard/--replica-id):
    this sarpd is replica `replica_id` of shard `shard`, and its writes go through
    the shard's JetStream stream on the NATS cluster at `urls`. Off without `urls`."""

    urls: tuple[str, ...] = ()
    shard: str = ""
    replica_id: str = ""
    stream_replicas: int = 3  # the stream's copies (JetStream: 1..5; 3 on a 3-node cluster)
    write_timeout_s: float = 30.0  # a forwarded write's wait for its own application
    publish_retry_s: float = 15.0  # resending a write to the log (no quorum: then unavailable)
    catch_up_timeout_s: float = 3600.0  # how long a start may replay before it serves
    checkpoint_interval_s: float = 600.0  # publish a checkpoint this often (0: never)
    checkpoint_keep: int = 2  # checkpoints kept per shard (the log is trimmed below them)
    # a replica silent this long no longer holds the log's trim back (it will need a
    # checkpoint when it returns: `rebootstrap`)
    trim_grace_s: float = 300.0
    rebootstrap: bool = True  # log trimmed past this replica: restart from a checkpoint

    def __post_init__(self) -> None:
        if not self.urls:
            return
        if not self.shard or not self.replica_id:
            raise ConfigError("cluster: urls given without shard and replica_id (a replica "
                              "needs all three: --cluster URL --shard S --replica-id R)")
        if not 1 <= self.stream_replicas <= 5:
            raise ConfigError(f"cluster: stream_replicas {self.stream_replicas} is outside "
                              "1..5 (JetStream's limit)")
        if not 0 < self.publish_retry_s < 300:
            raise ConfigError(f"cluster: publish_retry_s {self.publish_retry_s} must be in "
                              "(0, 300): below the log's duplicate window")
        if not self.trim_grace_s >= MIN_TRIM_GRACE_S:
            raise ConfigError(f"cluster: trim_grace_s {self.trim_grace_s} must be >= "
                              f"{MIN_TRIM_GRACE_S} (replicas report their progress every "
                              "second; a live one must never look silent)")
        for name in ("write_timeout_s", "catch_up_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"cluster: {name} {getattr(self, name)} must be > 0")
        if self.checkpoint_interval_s < 0 or self.checkpoint_keep < 1:
            raise ConfigError(f"cluster: checkpoint_interval_s {self.checkpoint_interval_s} "
                              f"must be >= 0 and checkpoint_keep {self.checkpoint_keep} >= 1")

    @property
    def enabled(self) -> bool:
        return bool(self.urls)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    socket: Path = Path("/run/sarpd/sarpd.sock")
    data_dir: Path = Path("/var/lib/sarpd")
    backend: str = "rocksdb"
    sync: SyncPolicy = "always"
    socket_mode: int = 0o660
    socket_group: str | None = None
    batch_window_ms: float = 0.5  # gather requests this long before running a batch
    batch_max: int = 256  # ... or until this many are queued
    max_frame_size: int = 64 * 1024 * 1024
    max_connections: int = 1024
    max_inflight_per_conn: int = 1024
    max_queue: int = 65_536  # requests queued for the batcher (all connections); past it: busy
    max_queue_bytes: int = 256 * 1024 * 1024  # ... and their decoded arrays; past it: busy
    max_buffered_bytes: int = 1024 * 1024 * 1024  # unfinished messages, all connections
    max_write_buffer: int = 64 * 1024 * 1024  # unsent response bytes per connection; past it: close
    allow_uids: tuple[int, ...] = ()  # peer uids (SO_PEERCRED) allowed; with allow_gids,
    allow_gids: tuple[int, ...] = ()  # ... empty both = anyone who can open the socket
    bind_namespaces: bool = False  # a peer uses only namespaces "uid:<its uid>[/...]"
    admin_uids: tuple[int, ...] = (0,)  # exempt from bind_namespaces; only they snapshot/check
    metrics_port: int = 0  # Prometheus /metrics on metrics_host:port (0 = off)
    metrics_host: str = "127.0.0.1"
    log_format: LogFormat = "text"
    # the backend engine's whole memory budget (rocksdb: block cache + memtables + index
    # and filter partitions, backends/rocksdb.py; wiredtiger: its cache, >= 32 MiB)
    cache_bytes: int = 128 * 1024 * 1024
    log_level: str = "INFO"
    index: IndexConfig = field(default_factory=IndexConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


def _coerce(cls: type[Any], table: dict[str, Any], where: str) -> dict[str, Any]:
    names = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key not in names:
            raise ConfigError(f"{where}: unknown setting {key!r} (known: {sorted(names)})")
        out[key] = value
    return out


def load_config(path: Path | None, cluster: dict[str, Any] | None = None,
                **overrides: Any) -> ServerConfig:
    """Read a TOML file (`[server]`, `[index]` and `[cluster]` tables), then apply
    overrides (command-line flags; None means "not given"; `cluster`: the cluster
    flags' settings)."""
    server: dict[str, Any] = {}
    index: dict[str, Any] = {}
    clustered: dict[str, Any] = {}
    if path is not None:
        import tomllib  # only a config file needs it (a cold start without one does not)

        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config {path}: {exc}") from exc
        server = _coerce(ServerConfig, dict(doc.get("server", {})), f"{path} [server]")
        index = _coerce(IndexConfig, dict(doc.get("index", {})), f"{path} [index]")
        clustered = _coerce(ClusterConfig, dict(doc.get("cluster", {})), f"{path} [cluster]")
        if isinstance(clustered.get("urls"), list | str):
            urls = clustered["urls"]
            clustered["urls"] = tuple([urls] if isinstance(urls, str) else urls)
        for k in ("socket", "data_dir"):
            if k in server:
                server[k] = Path(server[k])
        if isinstance(server.get("socket_mode"), str):
            server["socket_mode"] = int(server["socket_mode"], 8)
        for k in ("allow_uids", "allow_gids", "admin_uids"):
            if isinstance(server.get(k), list):
                server[k] = tuple(server[k])
    for key, value in overrides.items():
        if value is not None:
            server[key] = value
    for key, value in (cluster or {}).items():
        if value is not None:
            clustered[key] = value
    server.pop("index", None)
    server.pop("cluster", None)
    try:
        return ServerConfig(index=IndexConfig(**index), cluster=ClusterConfig(**clustered),
                            **server)
    except TypeError as exc:
        raise ConfigError(f"config: {exc}") from exc
