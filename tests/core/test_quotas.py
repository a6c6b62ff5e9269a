"""Per-namespace quotas: an insert into a namespace that holds its quota of blocks is
refused with `quota_exceeded` (naming the namespace, what it holds and the quota) and
changes nothing; removals and clears give room back; the counts survive restarts; on
every backend, in-process and through a real daemon."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.registry import backend_names
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.core.store import open_backend
from sarpd.errors import ConfigError, QuotaExceeded
from sarpd.model import Clear, Insert, Match, Remove, SeqSpec
from tests.daemon_helpers import Launcher, RawConn

BT = 16
CFG = IndexConfig(namespace_quota_blocks=8, namespace_quotas={"free": 0, "big": 12})


def seq(ns: str, seed: int, blocks: int) -> SeqSpec:
    toks = np.random.default_rng(seed).integers(0, 50_000, blocks * BT).astype(np.uint32)
    return SeqSpec(ns, tokens=toks)


class Box:
    def __init__(self, name: str, root: Path) -> None:
        self.name, self.root = name, root
        self.backend = open_backend(name, root / "db", cache_bytes=1 << 22)
        self.ix = SarpIndex(self.backend, CFG, root / "snap")
        self.ix.recover()

    def insert(self, s: SeqSpec) -> object:
        return self.ix.write_many([Insert(0, s, meta=1)])[0]

    def matched(self, s: SeqSpec) -> int:
        return int(self.ix.match_many([Match(0, s)])[0].blocks)  # type: ignore[union-attr]

    def restart(self) -> None:
        if self.backend.persistent:
            self.ix.close()
            self.backend = open_backend(self.name, self.root / "db", cache_bytes=1 << 22)
        self.ix = SarpIndex(self.backend, CFG, self.root / "snap")
        self.ix.recover()


@pytest.mark.parametrize("backend_name", backend_names())
def test_quota_refuses_inserts_until_blocks_are_removed(backend_name: str,
                                                        tmp_path: Path) -> None:
    box = Box(backend_name, tmp_path)
    try:
        a1, a2, a3 = seq("a", 1, 5), seq("a", 2, 5), seq("a", 3, 2)
        assert box.insert(a1).new_blocks == 5  # type: ignore[attr-defined]
        assert box.insert(a2).new_blocks == 5  # type: ignore[attr-defined]  # 5 < 8: allowed
        err = box.insert(a3)
        assert isinstance(err, QuotaExceeded) and err.code == "quota_exceeded"
        assert "'a' holds 10 blocks" in str(err) and "quota is 8" in str(err)
        assert box.matched(a3) == 0  # the refused insert changed nothing
        # other namespaces are counted apart; an override of 0 means no quota
        assert box.insert(seq("b", 4, 6)).new_blocks == 6  # type: ignore[attr-defined]
        for i in range(3):
            assert box.insert(seq("free", 10 + i, 9)).new_blocks == 9  # type: ignore[attr-defined]
        assert box.insert(seq("big", 20, 11)).new_blocks == 11  # type: ignore[attr-defined]
        # re-inserting what is indexed adds nothing, but is still refused over quota
        assert isinstance(box.insert(a1), QuotaExceeded)
        box.restart()  # the counts are on the backend
        assert isinstance(box.insert(a3), QuotaExceeded)
        [res] = box.ix.write_many([Remove(0, seq=a1, start=0)])
        assert res.removed == 5  # type: ignore[union-attr]
        assert box.insert(a3).new_blocks == 2  # type: ignore[attr-defined]  # 5 + 2 held now
        [res] = box.ix.write_many([Clear(0, ns="a")])
        assert res.removed == 7  # type: ignore[union-attr]
        box.restart()
        for i in range(2):
            assert box.insert(seq("a", 30 + i, 4)).new_blocks == 4  # type: ignore[attr-defined]
        assert isinstance(box.insert(seq("a", 40, 1)), QuotaExceeded)
        assert box.matched(seq("a", 31, 4)) == 4 and box.matched(a2) == 0
    finally:
        box.ix.close()


def test_quota_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="namespace_quota_blocks"):
        IndexConfig(namespace_quota_blocks=-1)
    with pytest.raises(ConfigError, match="namespace_quotas\\['t'\\]"):
        IndexConfig(namespace_quotas={"t": "many"})  # type: ignore[dict-item]
    assert IndexConfig(namespace_quotas={"t": 5}).quota("t") == 5
    assert IndexConfig(namespace_quota_blocks=7).quota("other") == 7


def test_daemon_answers_quota_exceeded(sarpd_factory: Launcher) -> None:
    proc = sarpd_factory(config={"index": {"namespace_quota_blocks": 4},
                                 "index.namespace_quotas": {"tenant-b": 100}})
    toks = [list(range(i * 1000, i * 1000 + 3 * BT)) for i in range(3)]
    with RawConn(proc.socket) as c:
        assert c.call("insert", tokens=toks[0], meta=1, ns="tenant-a")["new_blocks"] == 3
        assert c.call("insert", tokens=toks[1], meta=1, ns="tenant-a")["new_blocks"] == 3
        r = c.call("insert", tokens=toks[2], meta=1, ns="tenant-a")
        assert r["ok"] is False and r["error"]["code"] == "quota_exceeded"
        assert "'tenant-a' holds 6 blocks" in r["error"]["message"]
        assert "quota is 4" in r["error"]["message"]
        assert c.call("match", tokens=toks[2], ns="tenant-a")["blocks"] == 0
        for t in toks:
            assert c.call("insert", tokens=t, meta=1, ns="tenant-b")["ok"] is True
