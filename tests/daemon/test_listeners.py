"""sarpd/daemon/listeners.py: a batch's requests the server cannot take now (busy,
unavailable) are submitted again, in order, from the first of them on; refused ones
are counted and skipped; past the retries the listener fails (its watermark stays)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from sarpd.daemon import listeners
from sarpd.daemon.listeners import Listener
from sarpd.errors import Busy, SarpError, UnknownParent
from sarpd.indexer.ingest import Ingest
from sarpd.indexer.workers import Registry


class FakeConn:
    """Answers each submitted op by the script: op -> the errors of its next attempts."""

    def __init__(self, script: dict[str, list[SarpError]]) -> None:
        self.script, self.sent = script, []  # type: ignore[var-annotated]

    def submit(self, op: str) -> asyncio.Future[dict[str, Any]]:
        self.sent.append(op)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        errs = self.script.get(op, [])
        if errs:
            fut.set_exception(errs.pop(0))
        else:
            fut.set_result({"ok": True})
        return fut


def listener(conn: FakeConn) -> Listener:
    reg = Registry(16)
    w = reg.register("m", "default", 1, 0, 16, "tcp://h:1", None)
    return Listener(w, Ingest(reg), conn, None)  # type: ignore[arg-type]


def test_from_the_first_busy_one_on_all_again_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listeners, "RETRY_PAUSE_S", 0.0)
    conn = FakeConn({"b": [Busy("queue full")], "a": [UnknownParent("p")]})
    lst = listener(conn)
    asyncio.run(lst._apply_ops(["a", "b", "c"]))
    assert conn.sent == ["a", "b", "c", "b", "c"]  # "a" refused for good: not again
    assert (lst.counts["refused_unknown_parent"], lst.counts["retries"]) == (1, 1)


def test_past_the_retries_the_listener_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(listeners, "RETRY_PAUSE_S", 0.0)
    conn = FakeConn({"a": [Busy("queue full")] * (listeners.RETRIES + 1)})
    with pytest.raises(Busy):
        asyncio.run(listener(conn)._apply_ops(["a"]))
    assert len(conn.sent) == listeners.RETRIES + 1
