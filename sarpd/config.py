"""All tunables in one place, with the paper's defaults.

`IndexConfig` shapes the index (it is recorded in the data directory: the block and
segment geometry may not change under existing data). `ServerConfig` shapes the
daemon, `ClusterConfig` its replica mode. They load from the `[server]`, `[index]` and
`[cluster]` tables of a TOML file, then command-line flags override them.

Every setting is checked when it is read, before anything starts: its type (msgspec
converts each value to the field's annotated type: no string for an integer, no
boolean for a count, no float for an integer) and its range (`__post_init__`, so a
config built in code is checked the same way). An unreadable file, an unknown table
or setting, a value of the wrong type or out of range raise `ConfigError` (an
operator's error, never a wire error) naming where it came from, the setting, the
value (cut short) and what is expected, e.g.
``sarpd.toml [server] max_connections: "ten" is not an integer``.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import msgspec

from sarpd.errors import ConfigError

__all__ = ["CLUSTER_RULES", "INDEX_RULES", "MAX_ID", "MIN_TRIM_GRACE_S", "NESTED",
           "SERVER_RULES", "SHOWN_CHARS", "TABLES", "ClusterConfig", "IndexConfig",
           "LogFormat", "LogLevel", "Rule", "ServerConfig", "SettingError",
           "SyncPolicy", "boolean", "check", "choices", "describe", "file_mode",
           "flag_name", "id_list", "integer", "load_config", "nonempty", "number",
           "one_of", "optional", "pathname", "read_file", "show", "typed", "typed_item"]

SyncPolicy = Literal["always", "none"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
# cluster mode: the shortest `trim_grace_s` (replicas report progress every second)
MIN_TRIM_GRACE_S = 2.0
SHOWN_CHARS = 40  # a value in a message is cut to this many characters
MAX_ID = 2**32 - 1  # uids and gids


class SettingError(ConfigError):
    """One setting breaks its rule: ``[table] key: value rule``. `at_file` / `at_flag`
    say where the value came from: ``sarpd.toml [server] batch_max: 0 must be >= 1``,
    ``--batch-max: 0 must be >= 1`` (`flag` is then that flag)."""

    def __init__(self, table: str, key: str, value: object, rule: str, *,
                 file: Path | None = None, flag: str | None = None) -> None:
        self.table, self.key, self.value, self.rule, self.flag = table, key, value, rule, flag
        where = flag or f"{f'{file} ' if file else ''}[{table}] {key}"
        super().__init__(f"{where}: {show(value)} {rule}")

    def at_file(self, path: Path) -> SettingError:
        return SettingError(self.table, self.key, self.value, self.rule, file=path)

    def at_flag(self, flag: str) -> SettingError:
        return SettingError(self.table, self.key, self.value, self.rule, flag=flag)


def show(value: object) -> str:
    """A value as the operator wrote it (TOML-like: strings quoted), cut short."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except ValueError:  # a circular container
        text = "..."
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


# --- range rules: each returns what the value breaks, or None ---------------------------

Rule = Callable[[Any], str | None]


def integer(low: int, high: int | None = None) -> Rule:
    def rule(v: Any) -> str | None:
        if not isinstance(v, int) or isinstance(v, bool):
            return "is not an integer"
        if high is not None and not low <= v <= high:
            return f"is not in {low}..{high}"
        return f"must be >= {low}" if v < low else None
    return rule


def file_mode(v: Any) -> str | None:
    if integer(0, 0o777)(v) is None:
        return None
    return "is not a file mode in 0..0o777 (an octal string such as \"0660\", or a number)"


def number(low: float = 0.0, *, above: bool = False, below: float | None = None) -> Rule:
    """A finite number >= low (> low with `above`; < below)."""
    def rule(v: Any) -> str | None:
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            return "is not a finite number"
        if (v <= low) if above else (v < low):
            return f"must be {'>' if above else '>='} {low:g}"
        if below is not None and v >= below:
            return f"must be below {below:g}"
        return None
    return rule


def choices(options: typing.Iterable[object]) -> str:
    """`"always", "none"`: every option, never cut short."""
    return ", ".join(json.dumps(o) for o in options)


def one_of(hint: Any) -> Rule:
    options = typing.get_args(hint)
    return lambda v: None if v in options else f"is not one of {choices(options)}"


def boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "is not true or false"


def nonempty(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "is not a non-empty string"


def optional(rule: Rule) -> Rule:
    return lambda v: None if v is None else rule(v)


def pathname(v: Any) -> str | None:
    return None if isinstance(v, Path) and str(v) else "is not a path"


def id_list(v: Any) -> str | None:
    if not isinstance(v, tuple):
        return "is not a list of ids"
    bad = [i for i in v if integer(0, MAX_ID)(i) is not None]
    return f"holds {show(bad[0])}, not an id in 0..{MAX_ID}" if bad else None


def check(table: str, obj: object, rules: Mapping[str, Rule]) -> None:
    """Raise `SettingError` for the first field of `obj` that breaks its rule."""
    for key, rule in rules.items():
        value = getattr(obj, key)
        broken = rule(value)
        if broken is not None:
            raise SettingError(table, key, value, broken)


# --- the settings -------------------------------------------------------------------------


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
    # a record per window-start block naming the block before it (b"P" keys: one per
    # segment_blocks new blocks at most): what a cluster's region owner reads a shared
    # head's branches from when it splits the head (issue 27; a replica turns it on)
    branch_links: bool = False
    # the block map's memory (bytes): where recently stored blocks live, by id, for
    # `parent` and bare-id `remove` (issue 24); blocks it cannot hold are written as
    # locator records in bulk, when it lets them go (docs/DECISIONS.md "Block map")
    block_map_bytes: int = 64 << 20
    # memory of the segments that have delta records (merged, read from memory): past
    # it the oldest are folded (written whole again) (docs/DECISIONS.md, issue 24). An
    # open merges every record again: ~25 ms a MiB (4 MiB: ~0.1 s of a restart; 16 MiB
    # cost ~0.4 s after the fleet's churn, issue 26)
    delta_bytes: int = 4 << 20
    # quotas: an insert into a namespace that already holds this many blocks is refused
    # (`quota_exceeded`); 0 = none. `namespace_quotas` overrides it per namespace.
    namespace_quota_blocks: int = 0
    namespace_quotas: dict[str, int] = field(default_factory=dict)
    # holders (protocol 2): an insert that would give a block more holders than this
    # answers `too_large` (nothing of it is applied)
    max_holders: int = 1024
    delta_max_entries: int = 8192  # directory delta merged into the base past this
    snapshot_interval_s: float = 60.0  # periodic snapshot (0 = only on demand/shutdown)
    # ... and one as soon as this many segments changed since the last (0 = by time
    # only): a restart re-routes what changed after the snapshot (issue 24)
    snapshot_changed_segments: int = 1024
    max_sequence_tokens: int = 1_048_576

    def __post_init__(self) -> None:
        check("index", self, INDEX_RULES)
        if self.segment_blocks % self.routing_points:
            raise SettingError("index", "segment_blocks", self.segment_blocks,
                               f"must be a multiple of routing_points ({self.routing_points})")
        if not isinstance(self.namespace_quotas, dict):
            raise SettingError("index", "namespace_quotas", self.namespace_quotas,
                               "is not a table of block counts")
        for ns, quota in self.namespace_quotas.items():
            if integer(0)(quota) is not None:
                raise SettingError("index", f"namespace_quotas[{ns!r}]", quota,
                                   "is not a block count >= 0")

    def quota(self, ns: str) -> int:
        """The most blocks namespace `ns` may hold (0: no quota)."""
        return self.namespace_quotas.get(ns, self.namespace_quota_blocks)

    @property
    def point_spacing(self) -> int:
        return self.segment_blocks // self.routing_points


INDEX_RULES: dict[str, Rule] = {
    "block_tokens": integer(1), "segment_blocks": integer(1, 64), "routing_points": integer(1, 64),
    "refine_threshold": integer(0), "refine_min_gap": integer(1), "prune_max_pred": integer(0),
    "window_cap": integer(1), "exact_match": boolean, "block_locators": boolean,
    "branch_links": boolean,
    "block_map_bytes": integer(0), "delta_bytes": integer(0),
    "namespace_quota_blocks": integer(0), "max_holders": integer(1, 1 << 20),
    "delta_max_entries": integer(0), "snapshot_interval_s": number(0.0),
    "snapshot_changed_segments": integer(0),
    "max_sequence_tokens": integer(1),
}


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
        check("cluster", self, CLUSTER_RULES)
        if self.urls and (not self.shard or not self.replica_id):
            raise SettingError("cluster", "urls", list(self.urls), "given without shard and "
                               "replica_id (a replica needs all three: --cluster URL "
                               "--shard S --replica-id R)")

    @property
    def enabled(self) -> bool:
        return bool(self.urls)


CLUSTER_RULES: dict[str, Rule] = {
    "urls": lambda v: None if isinstance(v, tuple) and all(nonempty(u) is None for u in v)
    else "is not a list of NATS URLs",
    "shard": lambda v: None if isinstance(v, str) else "is not a string",
    "replica_id": lambda v: None if isinstance(v, str) else "is not a string",
    "stream_replicas": integer(1, 5),  # JetStream's limit
    "write_timeout_s": number(above=True),
    "publish_retry_s": number(above=True, below=300.0),  # the log's duplicate window
    "catch_up_timeout_s": number(above=True),
    "checkpoint_interval_s": number(0.0),
    "checkpoint_keep": integer(1),
    # replicas report their progress every second: a live one must never look silent
    "trim_grace_s": number(MIN_TRIM_GRACE_S),
    "rebootstrap": boolean,
}


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
    # blocks of writes a batch takes at most (one larger write goes alone): a query
    # waits behind one batch of writes at most (sarpd.daemon.batching)
    batch_max_blocks: int = 4096
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
    # the indexer API (docs/HTTP.md) and /metrics on http_host:http_port (0 = off)
    http_port: int = 0
    http_host: str = "127.0.0.1"
    log_format: LogFormat = "text"
    # the backend engine's whole memory budget (rocksdb: block cache + memtables + index
    # and filter partitions, backends/rocksdb.py; wiredtiger: its cache, >= 32 MiB)
    cache_bytes: int = 128 * 1024 * 1024
    log_level: LogLevel = "INFO"
    # threads that answer a batch's matches at once (writes keep one ordered thread);
    # 0: one per core of the machine (os.cpu_count())
    worker_threads: int = 0
    index: IndexConfig = field(default_factory=IndexConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        check("server", self, SERVER_RULES)

    @property
    def match_threads(self) -> int:
        """`worker_threads`, with 0 resolved to the machine's cores."""
        return self.worker_threads or os.cpu_count() or 1


SERVER_RULES: dict[str, Rule] = {
    "socket": pathname, "data_dir": pathname, "backend": nonempty, "sync": one_of(SyncPolicy),
    "socket_mode": file_mode, "socket_group": optional(nonempty), "batch_window_ms": number(0.0),
    **{key: integer(1) for key in ("batch_max", "batch_max_blocks", "max_frame_size",
                                 "max_connections", "max_inflight_per_conn", "max_queue",
                                 "max_queue_bytes", "max_buffered_bytes", "max_write_buffer")},
    "allow_uids": id_list, "allow_gids": id_list, "admin_uids": id_list, "bind_namespaces": boolean,
    "metrics_port": integer(0, 65535), "metrics_host": nonempty,
    "http_port": integer(0, 65535), "http_host": nonempty,
    "log_format": one_of(LogFormat), "cache_bytes": integer(0), "log_level": one_of(LogLevel),
    "worker_threads": integer(0, 1024),
}


# --- loading -----------------------------------------------------------------------------

TABLES: dict[str, type[Any]] = {"server": ServerConfig, "index": IndexConfig,
                                "cluster": ClusterConfig}
NESTED = ("index", "cluster")  # ServerConfig's fields that are tables of their own


@cache
def _hints(table: str) -> dict[str, Any]:
    """`table`'s settings and their types."""
    cls = TABLES[table]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name not in NESTED}


def describe(hint: Any) -> str:
    """What a value of type `hint` is, in an operator's words."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return f"one of {choices(args)}"
    if origin is tuple:
        return f"a list of {_bare(describe(args[0]))}s"
    if origin is dict:
        return f"a table of {_bare(describe(args[1]))}s"
    if type(None) in args:  # X | None
        return describe(next(a for a in args if a is not type(None)))
    return {int: "an integer", float: "a number", bool: "true or false",
            str: "a string", Path: "a path"}.get(hint, "a valid value")


def _bare(what: str) -> str:
    return what.split(" ", 1)[1] if what.startswith(("a ", "an ")) else what


def _to_path(kind: type, obj: Any) -> Any:
    if kind is Path and isinstance(obj, str | os.PathLike) and str(obj):
        return Path(obj)
    raise TypeError("not a path")


def typed(table: str, key: str, value: Any) -> Any:
    """`value` converted to the type of `table`'s setting `key` (msgspec: exact types,
    no coercion of strings or booleans), or `SettingError` naming the wrong item."""
    hint = _hints(table)[key]
    if key == "socket_mode" and isinstance(value, str):
        try:
            return int(value, 8)
        except ValueError:
            raise SettingError(table, key, value, file_mode(value) or "") from None
    if key == "log_level" and isinstance(value, str):
        value = value.upper()
    if key == "urls" and isinstance(value, str):
        value = [value]  # one URL
    if typing.get_origin(hint) is dict and isinstance(value, dict):
        return {k: typed_item(table, f"{key}[{k!r}]", v, typing.get_args(hint)[1])
                for k, v in value.items()}
    if typing.get_origin(hint) is tuple and isinstance(value, list | tuple):
        return tuple(typed_item(table, f"{key}[{i}]", v, typing.get_args(hint)[0])
                     for i, v in enumerate(value))
    return typed_item(table, key, value, hint)


def typed_item(table: str, key: str, value: Any, hint: Any) -> Any:
    try:
        return msgspec.convert(value, hint, dec_hook=_to_path)
    except msgspec.ValidationError as exc:
        raise SettingError(table, key, value, f"is not {describe(hint)}") from exc


def _table(table: str, values: object, where: str) -> dict[str, Any]:
    """A TOML table's settings, each checked by name and converted to its type."""
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: [{table}] must be a table, not {show(values)}")
    known = _hints(table)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where} [{table}]: unknown setting {key!r}"
                              f"{_close(key, known)} (known: {sorted(known)})")
        out[key] = typed(table, key, value)
    return out


def _close(name: str, known: Mapping[str, object]) -> str:
    near = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def read_file(path: Path) -> dict[str, dict[str, Any]]:
    """A TOML file's tables, checked: no unknown table, settings known and typed."""
    import tomllib  # only a config file needs it (a cold start without one does not)

    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"config {path}: {exc}") from exc
    known = ", ".join(f"[{t}]" for t in TABLES)
    for name, value in doc.items():
        if name in TABLES:
            continue
        if isinstance(value, dict):
            raise ConfigError(f"{path}: unknown table [{name}]{_close(name, TABLES)} "
                              f"(known: {known})")
        raise ConfigError(f"{path}: setting {name!r} is outside any table (settings go "
                          f"in {known})")
    try:
        return {name: _table(name, doc.get(name, {}), str(path)) for name in TABLES}
    except SettingError as exc:
        raise exc.at_file(path) from exc


def flag_name(table: str, key: str) -> str:
    """The command-line flag that sets `table`'s `key` (sarpd's and sarpctl's)."""
    return "--cluster" if (table, key) == ("cluster", "urls") else "--" + key.replace("_", "-")


def load_config(path: Path | None, cluster: dict[str, Any] | None = None,
                **overrides: Any) -> ServerConfig:
    """Read a TOML file (`[server]`, `[index]` and `[cluster]` tables), then apply
    overrides (command-line flags; None means "not given"; `cluster`: the cluster
    flags' settings). Every value is checked; `ConfigError` names the first bad one
    and where it came from (the file, or the flag)."""
    tables = read_file(path) if path is not None else {name: {} for name in TABLES}
    flags: dict[tuple[str, str], str] = {}
    given = [("server", k, v) for k, v in overrides.items() if k not in NESTED]
    given += [("cluster", k, v) for k, v in (cluster or {}).items()]
    for table, key, value in given:
        if value is None:
            continue
        if key not in _hints(table):
            raise ConfigError(f"{flag_name(table, key)}: no such setting in [{table}]")
        flags[table, key] = flag_name(table, key)
        try:
            tables[table][key] = typed(table, key, value)
        except SettingError as exc:
            raise exc.at_flag(flags[table, key]) from exc
    try:
        return ServerConfig(index=IndexConfig(**tables["index"]),
                            cluster=ClusterConfig(**tables["cluster"]), **tables["server"])
    except SettingError as exc:
        if (exc.table, exc.key) in flags:
            raise exc.at_flag(flags[exc.table, exc.key]) from exc
        if path is None:
            raise
        raise exc.at_file(path) from exc
