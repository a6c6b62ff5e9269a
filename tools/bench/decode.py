"""Request decoding, per request shape: `sarpd.protocol.wire.Decoder` (the one path:
msgspec's typed read of the fields, or msgpack's build under the frame budgets, then the
rules of `sarpd.protocol.requests`) on one stream of encoded requests (issues 14, 23).

    python -m tools.bench.decode --json -

Prints requests per CPU second (best of `--rounds`) per shape:

- ``ultrachat``: the loadgen's frames (match, then insert, of the ultrachat
  workload; ids as lists of 64-bit uints, as serving engines send them);
- ``list-256``: match/insert of 256 random 64-bit ids as a list (a 4,096-token prompt);
- ``list-small``: 256 small ids (< 2**32: msgpack's shorter encodings);
- ``bin-256``: the same as ``bin`` of 16 bytes per id; ``tokens-4096``: a ``bin`` of
  4,096 uint32 tokens;
- ``list-4096``: 4,096 ids as a list (a 65,536-token prompt);
- ``errors``: bad requests (bad types, over limits, an unknown field): msgspec's read
  declines them and msgpack builds them.

tests/protocol/test_oracle.py checks that it answers as the validation it replaced did
(issue 23 merged that full path and the msgspec fast path of match/insert into it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click
import numpy as np

from sarpd.client.fields import ids_field
from sarpd.ctl.common import write_json
from sarpd.model import Request
from sarpd.protocol.wire import BadMessage, Decoder, encode_request


def _pairs(rng: np.random.Generator, n: int, count: int, encode: Callable[[Any], Any],
           field: str = "hashes") -> list[bytes]:
    frames = []
    for i in range(count):
        ids = rng.integers(2**32, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)
        frames.append(encode_request(2 * i + 1, "match", {field: encode(ids)}))
        frames.append(encode_request(2 * i + 2, "insert", {field: encode(ids), "meta": i}))
    return frames


def _ids_bin(ids: np.ndarray[Any, Any]) -> bytes:
    out = np.zeros((len(ids), 2), dtype="<u8")
    out[:, 0] = ids
    return out.tobytes()


def shapes(count: int) -> dict[str, list[bytes]]:
    """Frames of every shape the benchmark measures (see the module docstring)."""
    from tools.bench.loadgen import lane_frames, lanes_of
    from tools.bench.workloads import get_workload

    rng = np.random.default_rng(1)
    turns = list(get_workload("ultrachat").turns())[: count // 2]
    ultra = [f for i, lane in enumerate(lanes_of(turns, 16, 4)) for f in lane_frames(i, lane)]
    small = [encode_request(i + 1, "match", {"hashes": list(range(i, i + 256))})
             for i in range(count)]
    tokens = [encode_request(i + 1, "match", {"tokens": rng.integers(
        0, 2**32, size=4096, dtype=np.uint32).astype("<u4").tobytes()}) for i in range(count)]
    bad: list[bytes] = []
    for i in range(count // 4):
        bad += [encode_request(i + 1, "match", {"hashes": [1, "x"]}),
                encode_request(i + 1, "insert", {"hashes": [2**40], "meta": -1}),
                encode_request(i + 1, "match", {"hashes": [2**40], "bogus": 1}),
                encode_request(i + 1, "match", {"tokens": b"\x00" * 6})]
    return {
        "ultrachat": ultra,
        "list-256": _pairs(rng, 256, count // 2, lambda a: ids_field(a, "hashes")),
        "list-small": small,
        "bin-256": _pairs(rng, 256, count // 2, _ids_bin),
        "tokens-4096": tokens,
        "list-4096": _pairs(rng, 4096, max(1, count // 32), lambda a: ids_field(a, "hashes")),
        "errors": bad,
    }


def same(a: Request | BadMessage, b: Request | BadMessage) -> bool:
    """Equal requests (arrays by value, dtype and shape) or equal errors."""
    if type(a) is not type(b):
        return False
    if isinstance(a, BadMessage) and isinstance(b, BadMessage):
        return (a.id, a.error.code, a.error.message) == (b.id, b.error.code, b.error.message)
    return _same_value(a, b)


def _same_value(a: object, b: object) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all()))
    slots = getattr(type(a), "__slots__", None)
    if slots is None or type(a) is not type(b):
        return type(a) is type(b) and a == b
    names = [n for cls in type(a).__mro__ for n in getattr(cls, "__slots__", ())]
    return all(_same_value(getattr(a, n), getattr(b, n)) for n in names)


def rate(stream: bytes, n: int, rounds: int) -> float:
    """Requests per CPU second decoding `stream` (n requests), best of `rounds`."""
    best = float("inf")
    for _ in range(rounds):
        dec = Decoder()
        t0 = time.process_time()
        got = dec.feed(stream)
        best = min(best, time.process_time() - t0)
        assert len(got) == n
    return n / best


@click.command()
@click.option("--count", default=4000, show_default=True, type=click.IntRange(8),
              help="Requests per shape.")
@click.option("--rounds", default=7, show_default=True, type=click.IntRange(1))
@click.option("--json", "json_out", default=None, metavar="FILE|-",
              help="One JSON object (to stdout with -; the table then goes to stderr).")
def main(count: int, rounds: int, json_out: str | None) -> None:
    """Request decoding, requests/s per shape."""
    doc: dict[str, Any] = {"rounds": rounds, "shapes": {}}
    err = json_out == "-"
    for name, frames in shapes(count).items():
        stream = b"".join(frames)
        rps = rate(stream, len(frames), rounds)
        doc["shapes"][name] = {"requests": len(frames),
                               "bytes_per_request": len(stream) / len(frames), "rps": rps}
        click.echo(f"{name:12s} {len(stream) / len(frames):8,.0f} B/req  "
                   f"{rps:10,.0f} req/s", err=err)
    write_json(doc, json_out)


if __name__ == "__main__":
    main()
