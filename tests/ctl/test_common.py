"""What the sarpctl command modules share (sarpd.ctl.common): token input, JSON and
human output, the default socket, and connection errors as exit 2."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sarpd.ctl.common import (
    EXIT_ERROR,
    SYSTEM_SOCKET,
    aligned,
    connect,
    default_socket,
    emit_json,
    flatten,
    fmt,
    hashes_source,
    human_bytes,
    jsonable,
    read_hashes,
    read_sequence,
    read_tokens,
)
from tests.protocol.helpers import SAFE_TEXT, assert_clean


def named(text: str) -> io.StringIO:
    f = io.StringIO(text)
    f.name = "prompt.txt"
    return f


def test_read_tokens_json_or_whitespace() -> None:
    assert read_tokens(named("[1, 2, 3]")) == [1, 2, 3]
    assert read_tokens(named(" 4 5\n6 ")) == [4, 5, 6]
    assert read_tokens(named("7,8, 9")) == [7, 8, 9]
    for bad, message in [("", "tokens: none given"),
                         ("1 two", "tokens[1]: 'two' is not a uint32"),
                         ("[1, 2.5]", "tokens[1]: 2.5 is not a uint32"),
                         ("[1,", "tokens: not valid JSON"),
                         ('{"a":1}', "tokens: {'a': 1} is not a JSON list"),
                         ("[1, 2, 99999999999999999999999]",
                          "tokens[2]: 99999999999999999999999 is not a uint32"),
                         ('["a","b"]', "tokens[0]: 'a' is not a uint32"),
                         ("1 -2", "tokens[1]: -2 is not a uint32"),
                         ("9" * 3000, "tokens[0]: 99999999999999999"),
                         ("9" * 5000, "tokens[0]: '99999999999")]:
        with pytest.raises(click.BadParameter) as info:
            read_tokens(named(bad))
        assert message in info.value.message
        assert_clean(info.value.message, "tokens")
        assert "prompt.txt" in info.value.message


def test_jsonable_and_emit_json(capsys: pytest.CaptureFixture[str]) -> None:
    value = {"ids": [b"\x01\xff", (b"\x00",)], "n": 3, "nested": {"b": b"ab"}}
    assert jsonable(value) == {"ids": ["01ff", ["00"]], "n": 3, "nested": {"b": "6162"}}
    emit_json({"z": 1, "a": b"\x02"})
    assert capsys.readouterr().out == '{\n  "a": "02",\n  "z": 1\n}\n'


def test_human_bytes_and_fmt() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 5 << 20, 3 << 30, 5000 << 30)] == [
        "0 B", "1023 B", "1.0 KiB", "5.0 MiB", "3.0 GiB", "5000.0 GiB"]
    assert (fmt(0.123456), fmt(None), fmt(7), fmt("x")) == ("0.1235", "-", "7", "x")
    assert (fmt(12.0), fmt(123456.78), fmt(4e-06), fmt(True), fmt(b"\x01")) == (
        "12", "123456.8", "4e-06", "true", "01")


def test_stats_as_aligned_text() -> None:
    stats = {"blocks": 6, "backend": "rocksdb", "directory_bytes": 1656, "hit_ratio": 0.25,
             "reports": {"bridge": {"events": 12, "lag_s": 0.5}},
             "cluster": {"applied_seq": 5, "checkpoint_seq": None, "failed": False},
             "backend_cache_bytes_configured": 128 << 20, "mean_batch_size": 3.0}
    flat = flatten(stats)
    assert flat["reports.bridge.events"] == 12 and flat["cluster.applied_seq"] == 5
    lines = aligned(flat)
    assert lines == sorted(lines) and len({line.index("  ") for line in lines}) >= 1
    text = "\n".join(lines)
    width = max(map(len, flat))
    assert f"{'reports.bridge.events':<{width}}  12\n" in text
    assert f"{'directory_bytes':<{width}}  1.6 KiB" in text
    assert f"{'backend_cache_bytes_configured':<{width}}  128.0 MiB" in text
    assert f"{'mean_batch_size':<{width}}  3\n" in text
    assert f"{'cluster.checkpoint_seq':<{width}}  -" in text
    assert "{" not in text and "12.0" not in text


def test_default_socket_prefers_the_local_one(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert default_socket() == str(SYSTEM_SOCKET)
    (tmp_path / "var").mkdir()
    (tmp_path / "var" / "sarpd.sock").touch()
    assert default_socket() == "var/sarpd.sock"


def test_connect_failure_is_a_message_and_exit_2(tmp_path: Path) -> None:
    @click.command()
    @click.pass_context
    def ping(ctx: click.Context) -> None:
        ctx.obj = {"socket": str(tmp_path / "none.sock")}
        with connect(ctx) as c:
            c.ping()

    res = CliRunner().invoke(ping)
    assert res.exit_code == EXIT_ERROR == 2
    assert res.output.startswith("sarpctl: ") and "none.sock" in res.output


def test_hashes_inline_file_or_stdin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    digest = bytes(range(32))  # an engine's sha256 bytes hash: the bridge keeps the last 8
    want = int.from_bytes(digest[-8:], "big")
    assert read_hashes(hashes_source("[1, 2, 18446744073709551615]")) == [1, 2, 2**64 - 1]
    assert read_hashes(hashes_source("1,2 , 3")) == [1, 2, 3]
    assert read_hashes(hashes_source(json.dumps([digest.hex(), 7]))) == [want, 7]
    assert read_hashes(hashes_source(f"0x{digest.hex()} 0x10")) == [want, 16]
    path = tmp_path / "hashes.txt"
    path.write_text("5\n6\n")
    assert read_hashes(hashes_source(str(path))) == [5, 6]
    monkeypatch.setattr("sys.stdin", io.StringIO("[8, 9]"))
    assert read_hashes(hashes_source("-")) == [8, 9]
    for src, says in [("[-5]", "hashes[0]: -5 is not a uint64"),
                      ("[1, 18446744073709551616]", "hashes[1]: 18446744073709551616 is not"),
                      ("[1.5]", "hashes[0]: 1.5 is not a uint64"), ("  ", "hashes: none given"),
                      ("nosuchfile.txt", "no such file, and not a list of hashes"),
                      ('[1, "zz"]', "hashes[1]: 'zz' is not a uint64")]:
        with pytest.raises(click.BadParameter) as info:
            read_hashes(hashes_source(src))
        assert says in info.value.message
        assert_clean(info.value.message, "hashes" if "hashes" in says else "file")
    with pytest.raises(click.UsageError, match="not both"):
        read_sequence(named("1 2"), "[1]")


SCALARS = st.one_of(st.integers(min_value=2**32, max_value=2**200),
                    st.integers(min_value=-(2**200), max_value=-1), st.floats(),
                    st.text(SAFE_TEXT, min_size=1, max_size=20), st.booleans(), st.none(),
                    st.lists(st.integers(0, 9), max_size=2),
                    st.dictionaries(st.text(SAFE_TEXT, max_size=3), st.integers(), max_size=2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), max_size=5), SCALARS,
       st.sampled_from(["json", "words"]))
def test_any_bad_token_input_is_named_cleanly(good: list[int], bad: Any, form: str) -> None:
    # as words, a str of digits is an int after all
    assume(form == "json" or not isinstance(bad, str) or any(c.isalpha() for c in bad))
    assume(form == "json" or not isinstance(bad, list | dict))  # printed: JSON after all
    text = json.dumps([*good, bad]) if form == "json" else " ".join(map(str, [*good, bad]))
    with pytest.raises(click.BadParameter) as info:
        read_tokens(named(text))
    assert_clean(info.value.message, "tokens")


@settings(max_examples=200, deadline=None)
@given(st.text(SAFE_TEXT + '[]{},:" \n0123456789.-+eE', max_size=40))
def test_any_text_is_tokens_or_a_clean_error(text: str) -> None:
    try:
        tokens = read_tokens(named(text))
    except click.BadParameter as exc:
        assert_clean(exc.message, "tokens")
    else:
        assert all(type(t) is int and 0 <= t < 2**32 for t in tokens)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=4),
       st.one_of(st.integers(min_value=2**64, max_value=2**200),
                 st.integers(min_value=-(2**200), max_value=-1), st.floats(),
                 st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=2)))
def test_any_bad_hash_is_named_cleanly(good: list[int], bad: Any) -> None:
    with pytest.raises(click.BadParameter) as info:
        read_hashes(named(json.dumps([*good, bad])))
    assert info.value.message.startswith(f"prompt.txt: hashes[{len(good)}]: ")
    assert_clean(info.value.message, "hashes")
