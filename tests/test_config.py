"""sarpd/config.py: TOML loading ([server] and [index] tables, then command-line
overrides; the documented systemd/sarpd.toml, every setting uncommented) and the
checks of every setting: each raises ConfigError (an operator's error, not the wire's
BadRequest) naming the setting, its value and its limit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sarpd.config import ClusterConfig, IndexConfig, ServerConfig, load_config
from sarpd.errors import BadRequest, ConfigError
from tests.daemon_helpers import REPO


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


@pytest.mark.parametrize("table", ["server", "index"])
def test_an_unknown_setting_is_named_with_the_known_ones(tmp_path: Path, table: str) -> None:
    path = write(tmp_path, f"[{table}]\nbatch_size = 3\n")
    with pytest.raises(ConfigError, match=rf"\[{table}\]: unknown setting 'batch_size'") as err:
        load_config(path)
    assert "known: [" in err.value.message


def test_a_value_of_the_wrong_kind_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^config: ") as err:
        load_config(write(tmp_path, '[index]\nsegment_blocks = "many"\n'))
    assert isinstance(err.value.__cause__, TypeError)


@pytest.mark.parametrize(("settings", "named"), [
    ({"segment_blocks": 64, "routing_points": 3},
     r"segment_blocks \(64\) must be a multiple of routing_points \(3\)"),
    ({"segment_blocks": 128, "routing_points": 4}, r"segment_blocks 128 not in 1\.\.64"),
    ({"block_tokens": 0}, "block_tokens 0 must be >= 1"),
    ({"window_cap": 0}, "window_cap 0 must be >= 1"),
    ({"namespace_quota_blocks": -1}, "namespace_quota_blocks: -1 is not a block count >= 0"),
    ({"namespace_quota_blocks": True}, "namespace_quota_blocks: True is not a block count"),
    ({"namespace_quotas": {"t": "many"}}, r"namespace_quotas\['t'\]: 'many' is not a block"),
])
def test_each_index_check_names_the_setting_and_the_limit(settings: dict[str, object],
                                                          named: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=named) as err:
        IndexConfig(**settings)  # type: ignore[arg-type]
    assert not isinstance(err.value, BadRequest)
    lines = "".join(f"{k} = {_toml(v)}\n" for k, v in settings.items())
    with pytest.raises(ConfigError, match=named):  # the same from a file
        load_config(write(tmp_path, f"[index]\n{lines}"))


def _toml(value: object) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    return f'"{value}"' if isinstance(value, str) else str(value)


def test_cluster_settings_are_checked_by_name(tmp_path: Path) -> None:
    assert not ClusterConfig().enabled  # a single node by default
    with pytest.raises(ConfigError, match="cluster: urls given without shard and replica_id"):
        load_config(None, cluster={"urls": ("nats://x:4222",), "shard": "s0"})
    with pytest.raises(ConfigError, match=r"cluster: stream_replicas 6 is outside 1\.\.5"):
        ClusterConfig(urls=("nats://x",), shard="s", replica_id="r", stream_replicas=6)
    with pytest.raises(ConfigError, match="cluster: write_timeout_s 0 must be > 0"):
        ClusterConfig(urls=("nats://x",), shard="s", replica_id="r", write_timeout_s=0)
    cfg = load_config(write(tmp_path, '[cluster]\nurls = "nats://a:4222"\nshard = "s1"\n'
                                      'replica_id = "r2"\n'),
                      cluster={"replica_id": "r3", "shard": None})  # flags override
    assert (cfg.cluster.urls, cfg.cluster.shard, cfg.cluster.replica_id) == (
        ("nats://a:4222",), "s1", "r3")
    with pytest.raises(ConfigError, match=r"\[cluster\]: unknown setting 'url'"):
        load_config(write(tmp_path, '[cluster]\nurl = "nats://a"\n'))
