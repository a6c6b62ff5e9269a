"""sarpd's HTTP endpoints (sarpd.daemon.http): /metrics, /healthz and /readyz of a real
sarpd process, and of a `Daemon` run in this process whose recovery and final snapshot
are held, to see /readyz while it recovers and while it shuts down."""

from __future__ import annotations

import asyncio
import http.client
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from sarpd.client import SyncClient
from sarpd.config import ServerConfig
from sarpd.core.index import SarpIndex
from sarpd.daemon.cli import Daemon
from tests.daemon_helpers import SarpdProc, free_port, launcher, scrape

WINDOW_MS = 20.0  # every request waits about this long in the batcher
HIST = "sarpd_request_duration_seconds"


def get(port: int, path: str, method: str = "GET",
        headers: dict[str, str] | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def http_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SarpdProc, int]]:
    port = free_port()
    with launcher(tmp_path_factory.mktemp("http")) as lau:
        args = ("--metrics-port", str(port), "--batch-window-ms", str(WINDOW_MS))
        yield lau(extra_args=args), port


def test_health_readiness_and_404_elsewhere(http_daemon: tuple[SarpdProc, int]) -> None:
    _, port = http_daemon
    assert get(port, "/healthz") == (200, "ok\n")
    assert get(port, "/readyz") == (200, "ready\n")
    status, text = get(port, "/metrics")
    assert status == 200 and "# TYPE sarpd_ready gauge" in text
    for path in ("/foo", "/metrics/x", "/", "/metricsx", "/healthz/"):
        assert get(port, path)[0] == 404, path
    assert get(port, "/metrics", method="POST")[0] == 405
    assert get(port, "/readyz", method="DELETE")[0] == 405


def test_latency_histogram_counts_each_answer(http_daemon: tuple[SarpdProc, int]) -> None:
    """One sample per match and insert answered, measured from the request decoded:
    each waited the batch window, so none is under half of it."""
    proc, port = http_daemon
    before = scrape(port)
    with SyncClient(proc.socket) as c:
        for i in range(3):
            c.insert(tokens=list(range(i * 1000, i * 1000 + 64)), meta=1, ns="lat")
        for i in range(5):
            c.match(tokens=list(range(i * 1000, i * 1000 + 80)), ns="lat")
        c.ping()
    after = scrape(port)

    def delta(sample: str, op: str, le: str | None = None) -> float:
        key = f'{HIST}_{sample}{{le="{le}",op="{op}"}}' if le else f'{HIST}_{sample}{{op="{op}"}}'
        return after[key] - before.get(key, 0.0)

    assert (delta("count", "insert"), delta("count", "match"), delta("count", "ping")) == (3, 5, 1)
    for op, n in (("insert", 3), ("match", 5)):
        assert delta("bucket", op, "+Inf") == n
        assert delta("bucket", op, "0.005") == 0  # all waited ~WINDOW_MS in the batcher
        assert delta("sum", op) >= n * WINDOW_MS / 2000
        les = [k for k in after if k.startswith(f"{HIST}_bucket{{") and f'op="{op}"' in k]
        counts = sorted(after[k] for k in les)
        assert [after[k] for k in les] == counts  # cumulative, in order of le


def test_openmetrics_when_the_scraper_asks(http_daemon: tuple[SarpdProc, int]) -> None:
    _, port = http_daemon
    status, text = get(port, "/metrics",
                       headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert status == 200 and text.rstrip().endswith("# EOF")
    names = {f.name for f in text_string_to_metric_families(text)}  # type: ignore[no-untyped-call]
    assert {HIST, "sarpd_requests", "sarpd_ready"} <= names


# -- a Daemon in this process: /readyz while recovering and while shutting down ------


def hold(monkeypatch: pytest.MonkeyPatch, name: str,
         before: Callable[[tuple[Any, ...]], object]) -> None:
    """Make SarpIndex.<name> call `before(args)` first (in the worker thread)."""
    real = getattr(SarpIndex, name)

    def held(self: SarpIndex, *args: Any) -> Any:
        before(args)
        return real(self, *args)

    monkeypatch.setattr(SarpIndex, name, held)


async def readyz(http: aiohttp.ClientSession, port: int) -> tuple[int, str]:
    async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
        return resp.status, await resp.text()


async def until(http: aiohttp.ClientSession, port: int, status: int, text: str) -> str:
    """Poll /readyz until it answers `status` with a body starting with `text`."""
    seen: set[tuple[int, str]] = set()
    for _ in range(600):
        try:
            got = await readyz(http, port)
        except aiohttp.ClientConnectionError:  # not listening yet
            got = (0, "")
        if got[0] == status and got[1].startswith(text):
            return got[1]
        seen.add(got)
        await asyncio.sleep(0.05)
    raise AssertionError(f"/readyz never answered {status} {text!r}; it said {sorted(seen)}")


def test_readyz_follows_recovery_and_shutdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recovering, stopping = threading.Event(), threading.Event()
    hold(monkeypatch, "recover", lambda args: (args[0](1, 4), recovering.wait(30)))
    hold(monkeypatch, "snapshot", lambda args: stopping.wait(30))
    sock_dir = Path(tempfile.mkdtemp(prefix="sarp-", dir="/tmp"))
    port = free_port()
    cfg = ServerConfig(data_dir=tmp_path, socket=sock_dir / "s.sock", metrics_port=port,
                       metrics_host="127.0.0.1")

    async def main() -> int:
        daemon = Daemon(cfg)
        task = asyncio.create_task(daemon.run())
        async with aiohttp.ClientSession() as http:
            await until(http, port, 503, "recovering: 1 of 4 segments (25%, ETA ")
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200  # live while not ready
            recovering.set()
            assert await until(http, port, 200, "") == "ready\n"
            daemon.request_stop("test")
            assert await until(http, port, 503, "") == "shutting down\n"  # final snapshot held
            stopping.set()
            return await task

    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            assert runner.run(main()) == 0
    finally:
        recovering.set()
        stopping.set()
        shutil.rmtree(sock_dir, ignore_errors=True)
    with pytest.raises(ConnectionRefusedError):  # the HTTP server went with the daemon
        get(port, "/healthz")
