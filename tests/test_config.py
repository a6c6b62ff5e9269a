"""sarpd/config.py: TOML loading ([server], [index] and [cluster] tables, then
command-line overrides; the documented systemd/sarpd.toml, every setting uncommented)
and the checks of every setting, by type (msgspec) and by range (`__post_init__`):
each raises ConfigError (an operator's error, not the wire's BadRequest) naming where
the value came from, the setting, the value (cut short) and what is expected, and
never a Python type or exception name."""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import typing
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sarpd.config import TABLES, ClusterConfig, IndexConfig, ServerConfig, load_config
from sarpd.errors import BadRequest, ConfigError
from tests.daemon_helpers import REPO

# what no operator's message may contain: Python's or msgspec's words
INTERNALS = ("Error", "<class", "msgspec", "Expected", "`$", "Traceback", "builtins")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sarpd.toml"
    path.write_text(text)
    return path


# --- loading ----------------------------------------------------------------------------


def test_defaults_without_a_file() -> None:
    cfg = load_config(None)
    assert cfg == ServerConfig() and cfg.index == IndexConfig()
    assert cfg.backend == "rocksdb" and cfg.index.point_spacing == 16


def test_tables_are_read_and_coerced(tmp_path: Path) -> None:
    path = write(tmp_path, """
[server]
socket = "/tmp/s.sock"
data_dir = "/tmp/data"
backend = "memory"
socket_mode = "0640"
allow_uids = [1000, 1001]
admin_uids = [0]
batch_max = 32
batch_window_ms = 2
log_level = "debug"

[index]
segment_blocks = 32
routing_points = 2
namespace_quotas = { big = 12 }
""")
    cfg = load_config(path)
    assert cfg.socket == Path("/tmp/s.sock") and cfg.data_dir == Path("/tmp/data")
    assert cfg.backend == "memory" and cfg.batch_max == 32
    assert cfg.socket_mode == 0o640  # an octal string
    assert cfg.allow_uids == (1000, 1001) and cfg.admin_uids == (0,)  # lists -> tuples
    assert cfg.batch_window_ms == 2.0 and isinstance(cfg.batch_window_ms, float)
    assert cfg.log_level == "DEBUG"  # any case, as the flag takes it
    assert (cfg.index.segment_blocks, cfg.index.routing_points) == (32, 2)
    assert cfg.index.point_spacing == 16 and cfg.index.quota("big") == 12


def test_overrides_win_and_none_means_not_given(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nbackend = "memory"\nbatch_max = 32\n')
    cfg = load_config(path, backend="bloomstore", batch_max=None, sync="none")
    assert (cfg.backend, cfg.batch_max, cfg.sync) == ("bloomstore", 32, "none")
    # the index comes from the file's [index] table only, never from an override
    assert load_config(None, index=IndexConfig(block_tokens=2)).index == IndexConfig()


def test_sarpd_toml_documents_every_setting_and_loads(tmp_path: Path) -> None:
    """Uncommenting every `# key = value` line of systemd/sarpd.toml gives a config
    that loads, and every ServerConfig / IndexConfig field is documented there."""
    text = (REPO / "systemd" / "sarpd.toml").read_text()
    lines = []
    for line in text.splitlines():
        body = line[2:] if line.startswith("# ") else line
        if body.startswith("[") or (" = " in body and body.split(" = ")[0].isidentifier()):
            lines.append(body)
    cfg = load_config(write(tmp_path, "\n".join(lines) + "\n"))
    assert cfg.max_queue == 65536 and cfg.allow_uids == () and cfg.log_format == "text"
    assert cfg.cache_bytes == ServerConfig().cache_bytes  # the default, as documented
    keys = {body.split(" = ")[0] for body in lines if " = " in body}
    assert cfg.cluster.enabled and cfg.cluster.urls == ("nats://127.0.0.1:4222",)
    for cls in (ServerConfig, IndexConfig, ClusterConfig):
        missing = {f.name for f in dataclasses.fields(cls)} - keys - {"index", "cluster"}
        assert not missing, f"{cls.__name__} settings not in sarpd.toml: {missing}"


# --- errors -----------------------------------------------------------------------------


def test_a_missing_or_broken_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.toml") as missing:
        load_config(tmp_path / "nope.toml")
    assert isinstance(missing.value.__cause__, FileNotFoundError)
    with pytest.raises(ConfigError, match=r"sarpd\.toml") as broken:
        load_config(write(tmp_path, "[server\nbackend = 1\n"))
    assert broken.value.__cause__ is not None


@pytest.mark.parametrize("table", ["server", "index", "cluster"])
def test_an_unknown_setting_is_named_with_the_known_ones(tmp_path: Path, table: str) -> None:
    path = write(tmp_path, f"[{table}]\nbatch_size = 3\n")
    with pytest.raises(ConfigError, match=rf"\[{table}\]: unknown setting 'batch_size'") as err:
        load_config(path)
    assert "known: [" in err.value.message
    with pytest.raises(ConfigError, match=r"unknown setting 'max_conections' \(did you mean "
                       r"'max_connections'\?\)"):
        load_config(write(tmp_path, "[server]\nmax_conections = 3\n"))


@pytest.mark.parametrize(("text", "named"), [
    ("[indx]\nwindow_cap = 2\n", r"sarpd\.toml: unknown table \[indx\] \(did you mean 'index'\?\)"),
    ("[metrics]\nport = 1\n", r"unknown table \[metrics\] \(known: \[server\], \[index\]"),
    ("max_connections = 5\n", r"setting 'max_connections' is outside any table"),
    ("server = 5\n", r"\[server\] must be a table, not 5"),
])
def test_an_unknown_table_is_refused(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        load_config(write(tmp_path, text))


# (table, TOML line, the setting as named, what is said of it): every kind of setting
WRONG_TYPES = [
    ("server", 'max_connections = "ten"', "max_connections", '"ten" is not an integer'),
    ("server", "batch_max = true", "batch_max", "true is not an integer"),  # bool for int
    ("server", "max_queue = 2.0", "max_queue", "2.0 is not an integer"),
    ("server", 'batch_window_ms = "fast"', "batch_window_ms", '"fast" is not a number'),
    ("server", "batch_window_ms = false", "batch_window_ms", "false is not a number"),
    ("server", "socket = 5", "socket", "5 is not a path"),
    ("server", 'data_dir = ""', "data_dir", '"" is not a path'),
    ("server", "socket_group = 5", "socket_group", "5 is not a string"),
    ("server", 'socket_mode = "rw"', "socket_mode",
     '"rw" is not a file mode in 0..0o777 (an octal string such as "0660", or a number)'),
    ("server", 'sync = "sometimes"', "sync", '"sometimes" is not one of "always", "none"'),
    ("server", "log_format = 1", "log_format", '1 is not one of "text", "json"'),
    ("server", 'allow_uids = "1000"', "allow_uids", '"1000" is not a list of integers'),
    ("server", 'admin_uids = [0, "root"]', "admin_uids[1]", '"root" is not an integer'),
    ("server", "bind_namespaces = 1", "bind_namespaces", "1 is not true or false"),
    ("server", "metrics_host = []", "metrics_host", "[] is not a string"),
    ("index", 'exact_match = "yes"', "exact_match", '"yes" is not true or false'),
    ("index", 'snapshot_interval_s = "1m"', "snapshot_interval_s", '"1m" is not a number'),
    ("index", "namespace_quotas = 3", "namespace_quotas", "3 is not a table of integers"),
    ("index", 'namespace_quotas = { t = "many" }', "namespace_quotas['t']",
     '"many" is not an integer'),
    ("cluster", "urls = 5", "urls", "5 is not a list of strings"),
    ("cluster", "urls = [1]", "urls[0]", "1 is not a string"),
    ("cluster", "stream_replicas = 3.5", "stream_replicas", "3.5 is not an integer"),
    ("cluster", 'rebootstrap = "no"', "rebootstrap", '"no" is not true or false'),
]


@pytest.mark.parametrize(("table", "line", "key", "said"), WRONG_TYPES)
def test_a_value_of_the_wrong_type_is_named_with_what_is_expected(
        tmp_path: Path, table: str, line: str, key: str, said: str) -> None:
    path = write(tmp_path, f"[{table}]\n{line}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.message == f"{path} [{table}] {key}: {said}"
    assert not any(word in err.value.message for word in INTERNALS), err.value.message


def test_a_long_value_is_cut_short(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f'[server]\nmax_connections = "{"x" * 5000}"\n'))
    assert err.value.message.endswith('max_connections: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx... '
                                      "is not an integer")
    assert len(err.value.message) < len(str(tmp_path)) + 120


# (table, settings, the setting as named and what is said of it)
OUT_OF_RANGE: list[tuple[str, dict[str, Any], str]] = [
    ("server", {"max_connections": 0}, "max_connections: 0 must be >= 1"),
    ("server", {"batch_max": -5}, "batch_max: -5 must be >= 1"),
    ("server", {"max_frame_size": 0}, "max_frame_size: 0 must be >= 1"),
    ("server", {"metrics_port": 70000}, "metrics_port: 70000 is not in 0..65535"),
    ("server", {"socket_mode": 0o1000}, "socket_mode: 512 is not a file mode in 0..0o777"),
    ("server", {"batch_window_ms": -1.0}, "batch_window_ms: -1.0 must be >= 0"),
    ("server", {"batch_window_ms": math.inf}, "batch_window_ms: Infinity is not a finite number"),
    ("server", {"cache_bytes": -1}, "cache_bytes: -1 must be >= 0"),
    ("server", {"allow_gids": [5, -1]}, "allow_gids: [5, -1] holds -1, not an id in 0..4294967295"),
    ("server", {"metrics_host": " "}, 'metrics_host: " " is not a non-empty string'),
    ("server", {"backend": ""}, 'backend: "" is not a non-empty string'),
    ("server", {"log_level": "LOUD"},
     'log_level: "LOUD" is not one of "DEBUG", "INFO", "WARNING", "ERROR"'),
    ("index", {"segment_blocks": 64, "routing_points": 3},
     "segment_blocks: 64 must be a multiple of routing_points (3)"),
    ("index", {"segment_blocks": 128, "routing_points": 4}, "segment_blocks: 128 is not in 1..64"),
    ("index", {"routing_points": 0}, "routing_points: 0 is not in 1..64"),
    ("index", {"block_tokens": 0}, "block_tokens: 0 must be >= 1"),
    ("index", {"window_cap": 0}, "window_cap: 0 must be >= 1"),
    ("index", {"max_holders": 0}, "max_holders: 0 is not in 1..1048576"),
    ("index", {"snapshot_interval_s": -1.0}, "snapshot_interval_s: -1.0 must be >= 0"),
    ("index", {"namespace_quota_blocks": -1}, "namespace_quota_blocks: -1 must be >= 0"),
    ("index", {"namespace_quotas": {"t": -2}},
     "namespace_quotas['t']: -2 is not a block count >= 0"),
    ("cluster", {"urls": ["nats://x"], "shard": "s"}, 'urls: ["nats://x"] given without shard'),
    ("cluster", {"stream_replicas": 6}, "stream_replicas: 6 is not in 1..5"),
    ("cluster", {"write_timeout_s": 0.0}, "write_timeout_s: 0.0 must be > 0"),
    ("cluster", {"publish_retry_s": 300.0}, "publish_retry_s: 300.0 must be below 300"),
    ("cluster", {"trim_grace_s": 1.5}, "trim_grace_s: 1.5 must be >= 2"),
    ("cluster", {"checkpoint_keep": 0}, "checkpoint_keep: 0 must be >= 1"),
]


@pytest.mark.parametrize(("table", "settings", "said"), OUT_OF_RANGE)
def test_each_range_check_names_the_setting_and_the_limit(
        table: str, settings: dict[str, Any], said: str, tmp_path: Path) -> None:
    """The same rule, and the same words, for a config built in code and one read from
    a file (which is named)."""
    direct = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    with pytest.raises(ConfigError) as err:
        TABLES[table](**direct)
    assert err.value.message.startswith(f"[{table}] {said}")
    assert not isinstance(err.value, BadRequest)
    lines = "".join(f"{k} = {_toml(v)}\n" for k, v in settings.items())
    with pytest.raises(ConfigError) as from_file:
        load_config(write(tmp_path, f"[{table}]\n{lines}"))
    message = from_file.value.message
    assert message.startswith(f"{tmp_path / 'sarpd.toml'} [{table}] {said}"), message
    assert not any(word in message for word in INTERNALS), message


def test_flags_are_checked_and_named_as_flags(tmp_path: Path) -> None:
    """Overrides (sarpd's flags and SARPD_* variables, sarpctl import's flags) go
    through the same conversion and rules; the error names the flag, not the file."""
    path = write(tmp_path, "[server]\nbatch_max = 8\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, batch_max=0)
    assert err.value.message == "--batch-max: 0 must be >= 1"
    with pytest.raises(ConfigError, match=r'^--max-connections: "ten" is not an integer$'):
        load_config(path, max_connections="ten")
    with pytest.raises(ConfigError, match=r"^--metrics-host: 5 is not a string$"):
        load_config(None, metrics_host=5)
    with pytest.raises(ConfigError, match=r'^--cluster: \["nats://x:4222"\] given without'):
        load_config(None, cluster={"urls": ("nats://x:4222",), "shard": "s0"})
    with pytest.raises(ConfigError, match=r"^--batch-size: no such setting in \[server\]$"):
        load_config(None, batch_size=3)
    # a bad value in the file is named in the file, even with flags given
    with pytest.raises(ConfigError, match=r"sarpd\.toml \[server\] batch_max: 0 must be"):
        load_config(write(tmp_path, "[server]\nbatch_max = 0\n"), max_queue=5)
    assert load_config(None, metrics_host="::1", socket=Path("s.sock")).metrics_host == "::1"


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def test_cluster_settings_and_flags(tmp_path: Path) -> None:
    assert not ClusterConfig().enabled  # a single node by default
    cfg = load_config(write(tmp_path, '[cluster]\nurls = "nats://a:4222"\nshard = "s1"\n'
                                      'replica_id = "r2"\n'),
                      cluster={"replica_id": "r3", "shard": None})  # flags override
    assert (cfg.cluster.urls, cfg.cluster.shard, cfg.cluster.replica_id) == (
        ("nats://a:4222",), "s1", "r3")
    with pytest.raises(ConfigError, match=r"\[cluster\]: unknown setting 'url'"):
        load_config(write(tmp_path, '[cluster]\nurl = "nats://a"\n'))


# --- property: a wrongly typed value for any setting -------------------------------------

SCALARS: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "bool": st.booleans(),
    "str": st.text(st.characters(codec="utf-8"), max_size=60),
    "ints": st.lists(st.integers(0, 9), min_size=1, max_size=3),
    "strs": st.lists(st.text("abc", max_size=3), min_size=1, max_size=3),
    "table": st.dictionaries(st.from_regex(r"[a-z]{1,4}", fullmatch=True),
                             st.integers(0, 9), min_size=1, max_size=2),
}


def accepted(key: str, hint: Any) -> set[str]:
    """The kinds of TOML value a setting of type `hint` takes."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if key == "socket_mode":
        return {"int", "str"}  # an octal string is a mode too (wrong ones: WRONG_TYPES)
    if key == "urls":
        return {"str", "strs"}  # one URL, or a list
    if origin is Literal:
        return set()  # any string that is not an option is wrong too (see `wrong`)
    if origin is tuple:
        return {"ints"} if args[0] is int else {"strs"}
    if origin is dict:
        return {"table"}
    kinds = {int: {"int"}, float: {"int", "float"}, bool: {"bool"}, str: {"str"}, Path: {"str"}}
    return kinds[next(a for a in (*args, hint) if a is not type(None))]


def wrong(table: str, key: str, hint: Any) -> st.SearchStrategy[tuple[str, str, Any]]:
    kinds = [k for k in SCALARS if k not in accepted(key, hint)]
    values = st.one_of([SCALARS[k] for k in kinds])
    if typing.get_origin(hint) is Literal:
        options = {o.upper() if key == "log_level" else o for o in typing.get_args(hint)}
        values = values.filter(lambda v: not isinstance(v, str) or
                               (v.upper() if key == "log_level" else v) not in options)
    return values.map(lambda v: (table, key, v))


SETTINGS = [(table, f.name, typing.get_type_hints(cls)[f.name])
            for table, cls in TABLES.items() for f in dataclasses.fields(cls)
            if f.name not in ("index", "cluster")]


def toml(value: object) -> str:
    if isinstance(value, str):
        # JSON's escapes are TOML's; TOML wants DEL escaped too, and no surrogate pairs
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml(v)}" for k, v in value.items()) + " }"
    return _toml(value)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SETTINGS).flatmap(lambda s: wrong(*s)))
def test_any_wrongly_typed_value_is_refused_by_name(case: tuple[str, str, Any]) -> None:
    table, key, value = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sarpd.toml"
        path.write_text(f"[{table}]\n{key} = {toml(value)}\n")
        with pytest.raises(ConfigError) as err:
            load_config(path)
    message = err.value.message
    assert message.startswith(f"{path} [{table}] {key}"), message
    assert " is not " in message and len(message) < len(str(path)) + 200, message
    assert not any(word in message for word in INTERNALS), message


def test_every_setting_is_in_the_property_test() -> None:
    """A new setting of a type `accepted` does not know fails here, not silently."""
    for _table, key, hint in SETTINGS:
        assert accepted(key, hint) <= set(SCALARS), key
        assert len(accepted(key, hint)) < len(SCALARS), key
