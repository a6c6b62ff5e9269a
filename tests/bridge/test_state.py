"""The bridge's persisted state (sarpd.bridge.state): the position file, the
namespace map, and `StateFile`'s rewrite and fsync policy."""

from __future__ import annotations

import json
from pathlib import Path

import msgpack
import pytest

from sarpd.bridge.state import (
    StateFile,
    load_nsmap,
    load_position,
    nsmap_path,
    save_nsmap,
    save_position,
)
from sarpd.errors import ConfigError


def test_position_file_roundtrip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "pos.json"
    with pytest.raises(ConfigError, match=r"directory .*/sub does not exist"):
        load_position(path, "tcp://e:1", 3)  # refused up front, not at the first save
    path.parent.mkdir()
    assert load_position(path, "tcp://e:1", 3).last_seq is None
    save_position(path, "tcp://e:1", 3, 41, {"b", "a"})
    pos = load_position(path, "tcp://e:1", 3)
    assert (pos.last_seq, pos.namespaces) == (41, ("a", "b"))
    assert not (tmp_path / "sub" / "pos.json.tmp").exists()
    # another engine or worker: start afresh rather than skip its events
    assert load_position(path, "tcp://other:1", 3).last_seq is None
    assert load_position(path, "tcp://e:1", 4).last_seq is None
    path.write_text(json.dumps({"format": 9}))
    with pytest.raises(ConfigError, match="format"):
        load_position(path, "tcp://e:1", 3)


@pytest.mark.parametrize(("text", "message"), [
    ("{not json", "unreadable"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({"format": 1, "endpoint": "tcp://e:1", "worker": 3, "last_seq": "x"}),
     "last_seq or namespaces malformed"),
    (json.dumps({"format": 1, "endpoint": "tcp://e:1", "worker": 3, "namespaces": [1]}),
     "last_seq or namespaces malformed"),
])
def test_bad_position_file_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pos.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        load_position(path, "tcp://e:1", 3)
    assert str(path) in info.value.message


def test_nsmap_is_valid_for_exactly_its_position(tmp_path: Path) -> None:
    state = tmp_path / "pos.json"
    assert load_nsmap(state, 5) is None  # no map
    assert load_nsmap(None, 5) is None and load_nsmap(state, None) is None
    ns_of = {1: "", 2: "salt=a", 2**64 - 1: "lora=x"}
    save_nsmap(state, 5, ns_of)
    assert nsmap_path(state) == tmp_path / "pos.json.nsmap"
    assert load_nsmap(state, 5) == ns_of
    assert load_nsmap(state, 6) is None  # another position: guess instead
    doc = msgpack.unpackb(nsmap_path(state).read_bytes(), strict_map_key=False)
    assert doc["format"] == 1 and doc["ns"] == ["", "lora=x", "salt=a"]
    nsmap_path(state).write_bytes(b"\xc1 damaged")
    assert load_nsmap(state, 5) is None  # a damaged map is only a lost optimisation


def test_state_file_saves_when_the_position_moves(tmp_path: Path) -> None:
    path = tmp_path / "w3.json"
    sf = StateFile(path, "tcp://e:1", 3, save_interval_s=3600.0)
    pos, ns_of = sf.load()
    assert (pos.last_seq, pos.namespaces, ns_of) == (None, (), None)
    sf.save(None, set())  # nothing moved: nothing written
    assert not path.exists()
    sf.save(7, {"a"})  # the first save is durable (the interval started at 0)
    assert json.loads(path.read_text())["last_seq"] == 7
    sf.save(8, {"a", "b"})  # moved within the interval: rewritten, not fsync'd
    assert json.loads(path.read_text())["namespaces"] == ["a", "b"]
    path.unlink()
    sf.save(8, {"a", "b"})  # unchanged and not forced: left alone
    assert not path.exists()
    sf.save(8, {"a", "b"}, force=True)  # unchanged but not yet fsync'd: a stop syncs it
    assert json.loads(path.read_text())["last_seq"] == 8
    sf.save_map(8, {9: "b"})
    again = StateFile(path, "tcp://e:1", 3, save_interval_s=3600.0)
    pos, ns_of = again.load()
    assert (pos.last_seq, pos.namespaces, ns_of) == (8, ("a", "b"), {9: "b"})
    path.unlink()
    again.save(8, {"a", "b"})  # what it loaded counts as saved
    assert not path.exists()


def test_state_file_without_a_path_keeps_nothing(tmp_path: Path) -> None:
    sf = StateFile(None, "tcp://e:1", 3, save_interval_s=0.0)
    assert sf.load()[0].last_seq is None
    sf.save(3, {"a"}, force=True)
    sf.save_map(3, {1: "a"})
    assert list(tmp_path.iterdir()) == []
