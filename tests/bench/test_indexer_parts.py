"""tools/bench/indexer_parts.py: the indexer benchmark's workload (seeded, tails
evicted only, the engines' state as expected answers) and its HTTP client's reading
of answers by Content-Length."""

from __future__ import annotations

from tools.bench import indexer_parts as ip
from tools.bench import vllm_schema as vs


def test_the_workload_is_seeded_and_evicts_only_tails() -> None:
    def events(seed: int) -> list[bytes]:
        wl = ip.Workload(2, seed)
        out = [vs.encode_events(b, ts=0) for per in wl.fill(10) for b in per]
        return out + [vs.encode_events(wl.step(e % 2), ts=0) for e in range(200)]

    assert events(1) == events(1) and events(1) != events(2)
    wl = ip.Workload(3, 0)
    wl.fill(9)
    for i in range(300):
        for ev in wl.step(i % 3):
            if isinstance(ev, vs.BlockRemoved):  # the tail of a conversation, no more
                c = next(c for c in wl.convs if ev.block_hashes[0] in c.hashes)
                assert c.hashes[c.held:c.held + len(ev.block_hashes)] == ev.block_hashes
    c = wl.convs[0]
    want = wl.expected(c)
    n = ip.BLOCK * (len(wl.prompt_hashes[c.prompt]) + c.held)
    assert want["instances"][str(ip.instance_id(c.engine))]["longest_matched"] == n
    assert want["frequencies"] == [] and set(want["scores"]) == set(want["instances"])
    assert len(wl.query_tokens(c)) % ip.BLOCK == 5  # a new turn's partial block


def test_answers_are_read_by_content_length() -> None:
    buf = bytearray(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n{}{}HTTP/1.1 404 N")
    assert ip.parse_answer(buf) == (200, b"{}{}")
    assert buf == bytearray(b"HTTP/1.1 404 N")
    assert ip.parse_answer(buf) is None
