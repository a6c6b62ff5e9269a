"""Helpers for the indexer API's tests against the real Dynamo standalone KV indexer
(`python -m dynamo.indexer`, ai-dynamo-runtime 1.6.1) run beside sarpd.

- `free_port()`, `call(port, method, path, body)`: a small JSON client (keep-alive
  connections per port; the answer parsed as JSON, else its text); `query(...)`
  for /query; `wait_http(port)` until `/health` answers;
- `dynamo_available()`, `dynamo_indexer(...)`: start Dynamo's indexer (from a temp
  working directory: a `dynamo/` folder in the cwd would shadow the wheel) and wait
  for its `/health`;
- `wait_until(fn, timeout)`: poll until `fn()` is truthy;
- `register_body(...)`, `register_both(...)`: one publisher registered on several
  indexers, each subscription seen by the publisher before the next registration
  (its `subscribed` event tells one subscriber from two only that way);
- `settle(...)`: both indexers apply events asynchronously; after a phase each
  engine publishes, as its last batch, a store of the same fresh marker block, and
  the indexers are polled until the marker's /query lists every engine on each: the
  batches an engine published before it were applied (one engine's batches are
  applied in order). `stable(fn)`: `fn()` once two calls 100 ms apart agree.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from tools.bench.vllm_publisher import Publisher

T = TypeVar("T")
BLOCK = 16

__all__ = ["BLOCK", "DynamoIndexer", "call", "dynamo_available", "dynamo_indexer", "forget",
           "free_port", "query", "register_body", "register_both", "settle", "stable",
           "wait_http", "wait_until"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


_conns: dict[int, http.client.HTTPConnection] = {}


def call(port: int, method: str, path: str, body: Any = None,
         timeout: float = 10.0) -> tuple[int, Any]:
    """One HTTP request to 127.0.0.1:`port` -> (status, JSON answer or text)."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"} if data is not None else {}
    for attempt in range(2):
        conn = _conns.get(port)
        if conn is None:
            conn = _conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode()
            break
        except (OSError, http.client.HTTPException):
            _conns.pop(port, None)
            conn.close()
            if attempt:
                raise
    try:
        return resp.status, json.loads(text)
    except ValueError:
        return resp.status, text


def forget(port: int) -> None:
    """Close the kept-alive connection to `port`."""
    conn = _conns.pop(port, None)
    if conn is not None:
        conn.close()


def wait_until(fn: Callable[[], T], timeout: float = 10.0, interval: float = 0.02,
               what: str = "condition") -> T:
    """`fn()`'s first truthy value (TimeoutError after `timeout` s, with the last one)."""
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not met after {timeout} s (last: {value!r})")
        time.sleep(interval)


def _healthy(port: int) -> bool:
    try:
        return call(port, "GET", "/health", timeout=2)[0] == 200
    except OSError:
        forget(port)
        return False


def dynamo_available() -> bool:
    try:
        return importlib.util.find_spec("dynamo.indexer") is not None
    except ModuleNotFoundError:
        return False


@dataclass
class DynamoIndexer:
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


@contextlib.contextmanager
def dynamo_indexer(log_dir: Path, port: int | None = None, threads: int = 1,
                   timeout: float = 60.0, peers: str | None = None
                   ) -> Iterator[DynamoIndexer]:
    """`python -m dynamo.indexer --port P --threads N [--peers URL]`, up (its /health
    answers: with peers, once it loaded a peer's /dump), then stopped (terminated,
    killed if it lingers)."""
    port = port or free_port()
    log_path = log_dir / f"dynamo-indexer-{port}.log"
    cwd = tempfile.mkdtemp(prefix="dynamo-cwd-")
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("PYTHONPATH", None)  # the wheel's package, not a checkout's `dynamo/`
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dynamo.indexer", "--port", str(port), "--threads",
             str(threads), *(["--peers", peers] if peers else [])],
            stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    ix = DynamoIndexer(port, proc, log_path)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"dynamo.indexer exited with {proc.returncode}:\n{ix.log()}")
            return _healthy(port)

        wait_until(up, timeout, 0.05, "dynamo.indexer /health")
        yield ix
    finally:
        forget(port)
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError):
            os.rmdir(cwd)


def wait_http(port: int, timeout: float = 30.0) -> None:
    """Until `/health` on `port` answers 200."""
    wait_until(lambda: _healthy(port), timeout, 0.05, f"/health on port {port}")


def register_body(instance: int, pub: Publisher, model: str, *, dp_rank: int | None = None,
                  replay: bool = True, block_size: int = BLOCK) -> dict[str, Any]:
    body: dict[str, Any] = {"instance_id": instance, "endpoint": pub.endpoint,
                            "model_name": model, "block_size": block_size}
    if replay:
        body["replay_endpoint"] = pub.replay_endpoint
    if dp_rank is not None:
        body["dp_rank"] = dp_rank
    return body


def register_both(ports: Sequence[int], pub: Publisher, body: dict[str, Any],
                  timeout: float = 15.0) -> None:
    """Register `body` on each indexer in turn, waiting for each one's subscription
    before the next (so that the publisher has all of them before anything is sent)."""
    for port in ports:
        pub.subscribed.clear()
        status, answer = call(port, "POST", "/register", body)
        assert status == 201, (port, body, status, answer)
        if not pub.subscribed.wait(timeout):
            raise TimeoutError(f"no subscription from the indexer on port {port}")
    time.sleep(0.05)  # a subscription is seen by the XPUB just before it takes effect


def query(port: int, model: str, tokens: Sequence[int], **kw: Any) -> tuple[int, Any]:
    return call(port, "POST", "/query", {"token_ids": list(tokens), "model_name": model, **kw})


def settle(ports: Sequence[int], model: str, marker: Sequence[int], instances: Sequence[int],
           timeout: float = 20.0) -> None:
    """Until `/query` of the `marker` tokens (one block each engine just stored as the
    last event it published) lists every instance of `instances` on every indexer."""
    want = {str(i) for i in instances}

    def seen(port: int) -> bool:
        status, answer = query(port, model, marker)
        return status == 200 and want <= set(answer.get("instances", {}))

    for port in ports:
        wait_until(functools.partial(seen, port), timeout, 0.02,
                   f"the marker of {sorted(want)} on port {port}")


def stable(fn: Callable[[], T], timeout: float = 10.0, gap: float = 0.1) -> T:
    """`fn()` once two calls `gap` s apart agree."""
    deadline = time.monotonic() + timeout
    last = fn()
    while True:
        time.sleep(gap)
        now = fn()
        if now == last or time.monotonic() > deadline:
            return now
        last = now
