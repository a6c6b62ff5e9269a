"""What the sarpctl command modules share (tools.ctl_common): token input, JSON and
human output, the default socket, and connection errors as exit 2."""

from __future__ import annotations

import io
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tools.ctl_common import (
    EXIT_ERROR,
    SYSTEM_SOCKET,
    connect,
    default_socket,
    emit_json,
    fmt,
    human_bytes,
    jsonable,
    read_tokens,
)


def named(text: str) -> io.StringIO:
    f = io.StringIO(text)
    f.name = "prompt.txt"
    return f


def test_read_tokens_json_or_whitespace() -> None:
    assert read_tokens(named("[1, 2, 3]")) == [1, 2, 3]
    assert read_tokens(named(" 4 5\n6 ")) == [4, 5, 6]
    for bad, message in [("", "no token ids"), ("1 two", "whitespace-separated ints"),
                         ("[1, 2.5]", "a list of ints"), ("[1,", "expected a JSON list")]:
        with pytest.raises(click.BadParameter, match=message) as info:
            read_tokens(named(bad))
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
