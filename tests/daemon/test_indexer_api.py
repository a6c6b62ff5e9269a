"""The indexer API in a real sarpd (--http-port) fed by real publishers of vLLM's
schema: answers, /workers, /unregister clearing its blocks, bad input answered 4xx
without harm, and a kill -9 with publishers going on meanwhile: the restarted sarpd
answers as before from its index at once, resubscribes every registered worker and
replays what it missed (no re-registration)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.indexer_helpers import call, forget, free_port, stable, wait_until
from tests.daemon_helpers import SarpdProc
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import Publisher

T = list(range(7000, 7000 + 16 * 16))
IDS = [900000 + i for i in range(16)]


@pytest.fixture
def pubs() -> Iterator[list[Publisher]]:
    ps = [Publisher(), Publisher()]
    yield ps
    for p in ps:
        p.close()


def start(tmp_path: Path, port: int, config: dict[str, dict[str, object]] | None = None
          ) -> SarpdProc:
    d = SarpdProc(tmp_path / "d", config=config,
                  extra_args=("--http-port", str(port))).start()
    wait_until(lambda: call(port, "GET", "/health")[0] == 200, 30, what="http")
    return d


def serve_one(port: int, p: Publisher, blocks: int) -> None:
    """Instance 1 registered on `p`, which stored `blocks` blocks; answered so."""
    assert call(port, "POST", "/register", {"instance_id": 1, "endpoint": p.endpoint,
                                            "model_name": "m", "block_size": 16})[0] == 201
    assert p.subscribed.wait(10)
    p.publish(stored(0, blocks))
    assert stable(lambda: answer(port)) == {"1": reach(blocks)}


def stored(a: int, b: int, medium: str = "GPU") -> bytes:
    return vs.encode_events([vs.block_stored(IDS[a:b], IDS[a - 1] if a else None,
                                             T[16 * a:16 * b], 16, medium=medium)])


def answer(port: int, n: int = 16) -> Any:
    forget(port)
    status, body = call(port, "POST", "/query", {"token_ids": T[:16 * n], "model_name": "m"})
    assert status == 200, body
    return body["instances"]


def reach(gpu: int, cpu: int | None = None) -> dict[str, Any]:
    c = gpu if cpu is None else cpu
    return {"longest_matched": 16 * c, "gpu": 16 * gpu, "dp": {"0": 16 * gpu}, "cpu": 16 * c,
            "disk": 16 * c}


def test_kill_9_then_restart_without_registering_again(tmp_path: Path,
                                                       pubs: list[Publisher]) -> None:
    port = free_port()
    d = start(tmp_path, port)
    try:
        for i, p in enumerate(pubs):
            p.subscribed.clear()
            status, body = call(port, "POST", "/register", {
                "instance_id": 10 + i, "endpoint": p.endpoint,
                "replay_endpoint": p.replay_endpoint, "model_name": "m", "block_size": 16})
            assert (status, body) == (201, {"status": "ok"})
            assert p.subscribed.wait(10)
        pubs[0].publish(stored(0, 4))
        pubs[0].publish(stored(4, 6, "CPU"))
        pubs[1].publish(stored(0, 2))
        want = {"10": reach(4, 6), "11": reach(2)}
        assert stable(lambda: answer(port)) == want
        time.sleep(0.3)  # the watermarks saved (as soon as a batch is applied)
        pubs[1].publish(stored(2, 3))  # may or may not be saved: replayed either way
        wait_until(lambda: answer(port) == {**want, "11": reach(3)}, 10)
        d.kill()
        pubs[0].publish(stored(6, 8, "CPU"))  # while sarpd is down: only the replay has it
        pubs[1].publish(vs.encode_events([vs.block_removed(IDS[2:3])]))
        spawned = time.monotonic()
        d.start(wait=False)
        first = wait_until(lambda: _answered(port), 30, interval=0.005)
        took = time.monotonic() - spawned
        # each engine's blocks as before the crash, or already replayed (independently)
        assert first["10"] in (reach(4, 6), reach(4, 8)), first
        assert first["11"] in (reach(3), reach(2)), first
        assert stable(lambda: answer(port)) == {"10": reach(4, 8), "11": reach(2)}
        status, rows = call(port, "GET", "/workers")
        assert status == 200 and [r["instance_id"] for r in rows] == [10, 11]
        assert all(r["status"] == "active" for r in rows)
        print(f"first answer {took:.3f} s after the spawn")  # the benchmark measures it
        pubs[1].publish(stored(2, 5))  # live again: applied as before
        assert stable(lambda: answer(port)) == {"10": reach(4, 8), "11": reach(5)}
        forget(port)

        def reported() -> bool:  # the listeners' counters, in /metrics (about every 1 s)
            text = call(port, "GET", "/metrics")[1]
            return 'sarpd_reported{name="replays",source="indexer"} 2.0' in text and \
                'sarpd_reported{name="listeners_active",source="indexer"} 2.0' in text
        wait_until(reported, 10, 0.2, "the indexer's report in /metrics")
    finally:
        d.cleanup()


def _answered(port: int) -> Any:
    try:
        forget(port)
        status, body = call(port, "POST", "/query", {"token_ids": T, "model_name": "m"},
                            timeout=2)
    except OSError:
        return None
    return body["instances"] if status == 200 else None


def test_unregister_clears_its_blocks_and_the_indexer_goes_with_its_last(
        tmp_path: Path, pubs: list[Publisher]) -> None:
    port = free_port()
    d = start(tmp_path, port)
    try:
        for i, p in enumerate(pubs):
            p.subscribed.clear()
            assert call(port, "POST", "/register", {
                "instance_id": 1 + i, "endpoint": p.endpoint, "model_name": "m",
                "block_size": 16})[0] == 201
            assert p.subscribed.wait(10)
            p.publish(stored(0, 3))
        assert stable(lambda: answer(port)) == {"1": reach(3), "2": reach(3)}
        assert call(port, "POST", "/unregister", {"instance_id": 1, "model_name": "m",
                                                  "dp_rank": 5}) == (200, {"status": "ok"})
        assert answer(port) == {"2": reach(3)}  # cleared before the answer
        assert call(port, "POST", "/unregister", {"instance_id": 1, "model_name": "m"}) == \
            (404, {"error": "instance 1 not found"})
        assert call(port, "POST", "/unregister", {"instance_id": 2, "model_name": "m"})[0] == 200
        assert call(port, "POST", "/query", {"token_ids": T, "model_name": "m"}) == \
            (404, {"error": "no indexer for model=m routing_group=default"})
        assert call(port, "GET", "/workers") == (200, [])
    finally:
        d.cleanup()


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/query", b"{bad", 400, "body: JSON is malformed"),
    ("/query", b"[1, 2]", 422, "Expected `object`, got `array`"),
    ("/query", b'{"token_ids": [1, -2], "model_name": "m"}', 422, "$.token_ids[1]"),
    ("/query", b'{"token_ids": [1]}', 422, "missing required field `model_name`"),
    ("/register", b'{"instance_id": 1, "endpoint": "tcp://*:1", "model_name": "m", '
                  b'"block_size": 16}', 400, "* is a bind address"),
    ("/register", b'{"instance_id": 1, "endpoint": "tcp://h:1", "model_name": "m", '
                  b'"block_size": 8}', 409, "block_size: 8 is not this index's block size"),
    ("/query_by_hash", b'{"block_hashes": [1], "model_name": "m", "cache_salt": "s"}', 400,
     "cache_salt is not accepted"),
])
def test_bad_input_is_a_4xx_naming_the_field(tmp_path: Path, path: str, body: bytes,
                                             status: int, words: str) -> None:
    import http.client
    import json

    port = free_port()
    d = start(tmp_path, port)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        got = json.loads(resp.read())
        assert resp.status == status and words in got["error"], got
        assert call(port, "GET", "/health")[0] == 200 and d.alive
    finally:
        d.cleanup()


def test_the_api_s_own_requests_pass_an_access_policy(tmp_path: Path,
                                                      pubs: list[Publisher]) -> None:
    """Under bind_namespaces a socket client may use only its uid's namespaces; the
    indexer API is sarpd's own part (its requests come from inside the daemon)."""
    port = free_port()
    d = start(tmp_path, port, {"server": {"bind_namespaces": True}})
    try:
        serve_one(port, pubs[0], 2)
    finally:
        d.cleanup()


def test_concurrent_queries_all_answer_alike_and_are_counted_once(
        tmp_path: Path, pubs: list[Publisher]) -> None:
    """A query is answered on the loop's thread when the worker is idle, else through
    the batcher (Server.answer_now): 8 clients at once get one answer, the right one,
    and each query is counted once. (Which way each took is not observed here.)"""
    import http.client
    import json
    from concurrent.futures import ThreadPoolExecutor

    port = free_port()
    d = start(tmp_path, port)
    try:
        serve_one(port, pubs[0], 8)
        body = json.dumps({"token_ids": T[:16 * 8], "model_name": "m"})

        def client(_: int) -> set[str]:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            seen = set()
            for _ in range(60):
                conn.request("POST", "/query", body=body,
                             headers={"Content-Type": "application/json"})
                seen.add(conn.getresponse().read().decode())
            conn.close()
            return seen

        with ThreadPoolExecutor(8) as pool:
            answers = set().union(*pool.map(client, range(8)))
        assert [json.loads(a)["instances"] for a in answers] == [{"1": reach(8)}]
        status, text = call(port, "GET", "/metrics")
        assert status == 200
        matches = [ln for ln in text.splitlines()
                   if ln.startswith('sarpd_requests_total{op="match"}')]
        assert matches and float(matches[0].split()[-1]) >= 8 * 60  # each counted once
    finally:
        d.cleanup()
