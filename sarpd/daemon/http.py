"""sarpd's HTTP endpoints: aiohttp on sarpd's own event loop (uvloop), not a thread.

    GET /metrics   Prometheus exposition of sarpd's registry (sarpd.daemon.metrics);
                   OpenMetrics when the scraper asks for it (Accept), gzip if accepted
    GET /healthz   liveness: 200 ``ok`` whenever the process serves HTTP
    GET /readyz    readiness: 200 ``ready`` once the index recovered and serves; 503
                   with the reason otherwise: the server's status, e.g. ``recovering:
                   40960 of 163840 segments (25%, ETA 3.1 s)``, ``shutting down``, or
                   why a replica is suspended

Every other path is 404, another method 405 (aiohttp's router; GET routes answer HEAD
too). `make_app` builds the application from the metrics and a readiness source. The
indexer API's port (`http_port`, sarpd.daemon.api_http) answers the same three from
`exposition` and `readiness_answer`.

A scrape runs on the loop and stays short: the exposition is built from counters
kept in memory (`Metrics.families`); the index gauges in it are the newest that the
worker thread left (`Metrics.refresh_index`), never computed by a scrape. No access
log: a scrape every few seconds would fill the log of an idle daemon.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from prometheus_client.exposition import choose_encoder

from sarpd.daemon.metrics import Metrics, registry_for
from sarpd.errors import ConfigError

if TYPE_CHECKING:  # aiohttp is imported by the functions that serve on it (~0.2 s: the
    from aiohttp import web  # indexer API's port alone, sarpd.daemon.api_http, needs none)

log = logging.getLogger("sarpd.daemon.http")

SHUTDOWN_TIMEOUT_S = 2.0  # at stop, for an unfinished HTTP request
Readiness = Callable[[], str | None]  # None: ready; else why not


class Serving(Protocol):
    """What readiness reads of the server (sarpd.daemon.server.Server)."""

    @property
    def service(self) -> object | None: ...

    @property
    def stopping(self) -> bool: ...

    @property
    def suspended(self) -> bool: ...

    @property
    def status(self) -> str: ...


def server_readiness(server: Serving) -> Readiness:
    """Ready while the server serves an index: not starting, recovering, suspended
    (a replica re-bootstrapping) or shutting down; else its status says why."""

    def not_ready() -> str | None:
        if server.service is not None and not server.stopping and not server.suspended:
            return None
        return server.status or "not ready"

    return not_ready


def exposition(metrics: Metrics) -> Callable[[str], tuple[bytes, bytes]]:
    """A scrape of `metrics` for an Accept header: (body, content type)."""
    registry = registry_for(metrics)

    def render(accept: str) -> tuple[bytes, bytes]:
        encoder, content_type = choose_encoder(accept)
        return encoder(registry), content_type.encode()

    return render


def readiness_answer(readiness: Readiness) -> tuple[int, str]:
    """/readyz: (200, "ready") or (503, why not)."""
    why = readiness()
    return (200, "ready\n") if why is None else (503, f"{why}\n")


def make_app(metrics: Metrics, readiness: Readiness) -> web.Application:
    """/metrics, /healthz and /readyz; add routes to the result before `start`."""
    from aiohttp import web

    render = exposition(metrics)

    async def scrape(request: web.Request) -> web.Response:
        body, content_type = render(request.headers.get("Accept", ""))
        resp = web.Response(body=body, headers={"Content-Type": content_type.decode()})
        resp.enable_compression()  # only if the scraper accepts it
        return resp

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        status, text = readiness_answer(readiness)
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def listen_error(exc: OSError, what: str, host: str, port: int) -> ConfigError:
    """The `ConfigError` of a port that cannot be listened on, naming the setting."""
    errno = exc.errno or 0  # < 0: a resolver error, its strerror says it
    reason = os.strerror(errno) if errno > 0 else exc.strerror or str(exc)
    return ConfigError(f"{what}: cannot listen on {host}:{port}: {reason}")


async def start(app: web.Application, host: str, port: int) -> web.AppRunner:
    """Listen on host:port on the running loop; the runner (`await runner.cleanup()`
    stops it). A `ConfigError` naming the setting if it cannot listen (port in use,
    bad address)."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise listen_error(exc, "metrics", host, port) from exc
    log.info("http on %s: /metrics, /healthz, /readyz", url(host, port))
    return runner


async def serve(metrics: Metrics, readiness: Readiness, host: str, port: int) -> web.AppRunner:
    """sarpd's endpoints on host:port: `make_app` then `start`; index stats are
    refreshed for the metrics from now on."""
    runner = await start(make_app(metrics, readiness), host, port)
    metrics.exported = True
    return runner
