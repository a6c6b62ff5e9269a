"""The requests the bridge sends (sarpd.bridge.pipe.request_of); the window they go
out in is the client's (`Client.submit`, tests/client/test_conn.py)."""

from __future__ import annotations

import pytest

from sarpd.bridge.pipe import request_of
from sarpd.events.mapping import ClearOp, InsertOp, RemoveOp


def test_request_of_each_op() -> None:
    assert request_of(InsertOp("a", (1, 2), None, 7)) == (
        "insert", {"ns": "a", "hashes": (1, 2), "meta": 7})
    assert request_of(InsertOp("", (2,), 1, 7))[1]["parent"] == 1
    assert request_of(RemoveOp("a", (1,), 7)) == ("remove", {"ns": "a", "ids": (1,), "meta": 7})
    assert "meta" not in request_of(RemoveOp("a", (1,)))[1]
    assert request_of(ClearOp("a", 3, 1)) == ("clear", {"ns": "a", "mask": 3, "value": 1})
    with pytest.raises(TypeError, match="is not one request"):
        request_of("insert")  # type: ignore[arg-type]
