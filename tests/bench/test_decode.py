"""The decoding micro-benchmark (tools.bench.decode): its frames decode as the test
oracle decodes them, and it prints a rate per shape."""

from __future__ import annotations

import json

from click.testing import CliRunner

from sarpd.protocol.wire import Decoder, Limits
from tests.protocol import oracle
from tools.bench.decode import main, same, shapes


def test_every_shape_decodes_alike_and_the_check_can_fail() -> None:
    frames = shapes(16)
    assert set(frames) >= {"ultrachat", "list-256", "bin-256", "list-4096", "errors"}
    for name, fs in frames.items():
        raw = b"".join(fs)
        got = Decoder().feed(raw)
        want = [oracle.decode_frame(f, Limits()) for f in fs]  # no hello: protocol 1
        assert len(got) == len(want) == len(fs), name
        assert all(map(same, want, got)), name
    a, b = Decoder().feed(b"".join(frames["list-256"][:2]))  # a match, an insert
    assert same(a, a) and not same(a, b)
    e = Decoder().feed(frames["errors"][0])[0]
    assert same(e, e) and not same(a, e)


def test_cli_prints_a_rate_per_shape() -> None:
    res = CliRunner().invoke(main, ["--count", "16", "--rounds", "1", "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout[res.stdout.index("{"):])
    for name, row in doc["shapes"].items():
        assert row["rps"] > 0 and row["requests"] >= 2, name
