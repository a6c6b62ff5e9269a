"""Exactness through the daemon: the same randomised sessions as the core test
(shared prompts, branches, namespaces, removals by sequence and by ids, parent
inserts, clears), sent over the socket to a real sarpd, checked against the oracle.
Each example works in namespaces of its own, so one daemon serves them all."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from backends.registry import backend_names
from sarpd.client import SyncClient
from sarpd.core.ids import id_bytes, salt_ids, token_ids
from sarpd.errors import UnknownParent
from tests.core.test_index import sessions
from tests.daemon_helpers import SarpdProc, launcher
from tests.oracle import BT, Oracle

_example = itertools.count()


@pytest.fixture(scope="module", params=backend_names())
def daemon(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[SarpdProc]:
    with launcher(tmp_path_factory.mktemp("exact")) as lau:
        yield lau(backend=request.param)


def ext_id(ns: str, toks: tuple[int, ...], pos: int) -> bytes:
    ids = token_ids(ns, np.array(toks[: BT * (pos + 1)], np.uint32), BT)
    return id_bytes(salt_ids(ns, ids[pos : pos + 1])[0])


def run(c: SyncClient, ops: list[tuple[str, object]], tag: str) -> None:
    oracle = Oracle()
    seen: list[tuple[str, tuple[int, ...]]] = []
    for kind, arg in ops:
        if kind == "insert":
            ns, toks, m = arg  # type: ignore[misc]
            ns = f"{tag}/{ns}"
            seen.append((ns, toks))
            metas = [(m << 8) | i for i in range(len(toks) // BT)]
            r = c.insert(tokens=list(toks), meta=metas, ns=ns)
            assert (r["blocks"], r["new_blocks"], r["matched_blocks"]) == oracle.insert(
                ns, toks, metas)
        elif kind == "parent":
            ns, toks, p, m = arg  # type: ignore[misc]
            ns = f"{tag}/{ns}"
            seen.append((ns, toks))
            metas = [(m << 8) | i for i in range(p + 1, len(toks) // BT)]
            fields = {"tokens": list(toks[BT * (p + 1):]), "meta": metas, "ns": ns,
                      "parent": ext_id(ns, toks, p)}
            if oracle.present(ns, toks, p):
                r = c.insert(**fields)  # type: ignore[arg-type]
                assert (r["blocks"], r["new_blocks"], r["matched_blocks"]) == oracle.insert(
                    ns, toks, metas, first=p + 1)
            else:
                with pytest.raises(UnknownParent):
                    c.insert(**fields)  # type: ignore[arg-type]
        elif kind == "remove":
            ns, toks, start = arg  # type: ignore[misc]
            ns = f"{tag}/{ns}"
            r = c.remove(tokens=list(toks), start=start, ns=ns)
            assert r["removed"] == oracle.remove(ns, toks, start)
        elif kind == "remove_ids":
            ns, toks, pos = arg  # type: ignore[misc]
            ns = f"{tag}/{ns}"
            r = c.remove(ns=ns, ids=[ext_id(ns, toks, p) for p in pos])
            assert r["removed"] == oracle.remove(ns, toks, 0, only=pos)
        elif kind == "clear":
            ns, mask, value = arg  # type: ignore[misc]
            ns = f"{tag}/{ns}"
            r = c.clear(ns, mask << 8, value << 8)
            assert r["removed"] == oracle.clear(ns, mask << 8, value << 8)
        elif kind == "check_all":
            for ns, t in seen:
                r = c.match(tokens=list(t), ns=ns, with_ids=True)
                want = oracle.match(ns, t)
                assert r["meta"] == want
                assert r["ids"] == [ext_id(ns, t, i) for i in range(len(want))]


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(ops=sessions(max_blocks=150))
def test_daemon_matches_oracle(daemon: SarpdProc, ops: list[tuple[str, object]]) -> None:
    with SyncClient(str(daemon.socket)) as c:
        run(c, ops, f"ex{next(_example)}")
        assert c.check()["clean"]
