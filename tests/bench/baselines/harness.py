"""The harness baselines against a brute-force oracle: random prefix-sharing sessions
(shared system prompts, branches inside and across 64-block windows, two namespaces
holding the same ids, batches whose sequences share blocks new in that batch),
matches checked before every insert, a cold-start recovery in the middle, then more
turns. The `check_*` functions are the checks every baseline passes; each baseline
module's test file runs them on its baselines (on real RocksDB, and a real
redis-server for `redis`)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from tools.bench.baselines import baseline_class
from tools.bench.baselines._common import Baseline
from tools.bench.baselines.segment_radix import SegmentRadix

U64 = np.uint64
HAVE_REDIS = shutil.which("redis-server") is not None
needs_redis = pytest.mark.skipif(not HAVE_REDIS, reason="redis-server is not installed")


def chain(parent: int, n: int, rng: np.random.Generator) -> list[int]:
    """n prefix-chained ids continuing after `parent` (0: the root)."""
    out, h = [], parent
    for v in rng.integers(0, 2**62, n).tolist():
        h = xxhash.xxh3_64_intdigest(int(v).to_bytes(8, "little"), seed=h)
        out.append(h)
    return out


@dataclass
class Oracle:
    blocks: dict[tuple[str, int], int] = field(default_factory=dict)

    def match(self, ns: str, ids: list[int]) -> list[int]:
        out = []
        for i in ids:
            m = self.blocks.get((ns, i))
            if m is None:
                break
            out.append(m)
        return out

    def insert(self, ns: str, ids: list[int], metas: list[int]) -> None:
        for i, m in zip(ids, metas, strict=True):
            self.blocks.setdefault((ns, i), m)


@dataclass
class Step:
    prompts: list[tuple[str, list[int]]]  # matched first
    seqs: list[tuple[str, list[int]]]  # then inserted (may be empty: a probe-only step)


def sessions(seed: int, steps: int) -> Iterator[Step]:
    """Turns of random sessions, a few per batch. System prompts of 20, 64 and 100
    blocks; new sessions start on a (possibly truncated) system prompt or fork an
    existing session anywhere; ns "b" sometimes replays ns "a"'s exact ids."""
    rng = np.random.default_rng(seed)
    systems = [chain(0, n, rng) for n in (20, 64, 100)]
    live: list[tuple[str, list[int]]] = []
    for _ in range(steps):
        batch_p: list[tuple[str, list[int]]] = []
        batch_s: list[tuple[str, list[int]]] = []
        for _ in range(int(rng.integers(1, 4))):
            r = rng.random()
            if not live or r < 0.25:
                base = systems[int(rng.integers(0, 3))]
                cut = len(base) if rng.random() < 0.6 else int(rng.integers(1, len(base)))
                ns, hist = ("a" if rng.random() < 0.7 else "b"), base[:cut]
            elif r < 0.35:
                ns, src = live[int(rng.integers(0, len(live)))]
                ns, hist = ns, src[: int(rng.integers(1, len(src) + 1))]
            elif r < 0.42:
                _, src = live[int(rng.integers(0, len(live)))]
                ns, hist = "b", list(src)
            else:
                k = int(rng.integers(0, len(live)))
                ns, hist = live.pop(k)
            prompt = hist + chain(hist[-1], int(rng.integers(1, 90)), rng)
            seq = prompt + chain(prompt[-1], int(rng.integers(0, 30)), rng)
            batch_p.append((ns, prompt))
            batch_s.append((ns, seq))
            live.append((ns, seq))
        if rng.random() < 0.3:  # a probe: a known prefix then unknown blocks
            ns, src = live[int(rng.integers(0, len(live)))]
            cut = int(rng.integers(0, len(src) + 1))
            probe = src[:cut] + chain(src[cut - 1] if cut else 7, int(rng.integers(0, 70)), rng)
            batch_p.append((ns, probe))
        yield Step(batch_p, batch_s)


def arr(ids: list[int]) -> np.ndarray[Any, np.dtype[np.uint64]]:
    return np.array(ids, dtype=U64)


class Runner:
    def __init__(self, index: Baseline) -> None:
        self.index = index
        self.oracle = Oracle()
        self.turn = 0
        self.matched_blocks = 0
        self.inserted: list[tuple[str, list[int]]] = []

    def step(self, step: Step) -> None:
        got = self.index.match_many([arr(p) for _, p in step.prompts],
                                    [ns for ns, _ in step.prompts])
        for (ns, p), g in zip(step.prompts, got, strict=True):
            want = self.oracle.match(ns, p)
            assert g.dtype == U64
            assert g.tolist() == want, f"turn {self.turn}: {len(g)} blocks vs {len(want)}"
            self.matched_blocks += len(want)
        if not step.seqs:
            return
        metas = []
        for _ns, s in step.seqs:
            self.turn += 1
            metas.append(arr([self.turn * 10_000 + i for i in range(len(s))]))
        self.index.insert_many([arr(s) for _, s in step.seqs], [ns for ns, _ in step.seqs],
                               metas)
        for (ns, s), m in zip(step.seqs, metas, strict=True):
            self.oracle.insert(ns, s, m.tolist())
            self.inserted.append((ns, s))


def run_sessions(index: Baseline, seed: int, steps: int, recover_at: int | None) -> Runner:
    r = Runner(index)
    for i, step in enumerate(sessions(seed, steps)):
        if i == recover_at:
            index.flush()
            res = index.recover()
            assert res.seconds > 0
            assert res.detail
            verify_all(index, r)
        r.step(step)
    assert r.matched_blocks > 0
    return r


def make(name: str, **kw: Any) -> Baseline:
    return baseline_class(name)(**kw)


@contextmanager
def opened(name: str, data_dir: Path, backend: str = "rocksdb", **kw: Any) -> Iterator[Baseline]:
    """Baseline `name` (constructor keywords `kw`) open on `data_dir`, with a 1 MiB
    cache on RocksDB; closed at the end."""
    index = make(name, **kw)
    index.open(data_dir, backend, 1 << 20 if backend == "rocksdb" else 0)
    try:
        yield index
    finally:
        index.close()


def verify_all(index: Baseline, r: Runner) -> None:
    """Every sequence inserted so far, whole and cut at a random point, then extended
    by unknown blocks, matches as the oracle says (one batch)."""
    rng = np.random.default_rng(len(r.inserted))
    prompts = []
    for ns, s in r.inserted:
        cut = int(rng.integers(0, len(s) + 1))
        prompts += [(ns, s), (ns, s[:cut] + chain(s[cut - 1] if cut else 3, 5, rng))]
    got = index.match_many([arr(p) for _, p in prompts], [ns for ns, _ in prompts])
    for (ns, p), g in zip(prompts, got, strict=True):
        assert g.tolist() == r.oracle.match(ns, p)


def hot_sessions(seed: int, n: int) -> Iterator[Step]:
    """`n` sessions on ONE system prompt of 40 blocks, each cut at a random block (so
    its first node gets many branches), two turns each, four sessions per batch."""
    rng = np.random.default_rng(seed)
    system = chain(0, 40, rng)
    firsts = []
    for _ in range(n):
        hist = system[: int(rng.integers(5, 41))]
        firsts.append(hist + chain(hist[-1], int(rng.integers(10, 100)), rng))
    for b in range(0, n, 4):
        yield Step([("a", s) for s in firsts[b: b + 4]], [("a", s) for s in firsts[b: b + 4]])
    for b in range(0, n, 4):
        more = [s + chain(s[-1], int(rng.integers(1, 70)), rng) for s in firsts[b: b + 4]]
        yield Step([("a", s) for s in more], [("a", s) for s in more])


def check_exact_with_recovery(name: str, tmp_path: Path) -> None:
    """Exact before and after a cold start in the middle; then a new instance opened
    on the data directory matches everything as the oracle says."""
    with opened(name, tmp_path / name, sync=True) as index:
        r = run_sessions(index, seed=11, steps=60, recover_at=35)
        assert index.disk_bytes() > 0
        assert index.memory_bytes() > 0  # at least the engine's (or redis-server's) own
    with opened(name, tmp_path / name, sync=True) as again:
        verify_all(again, r)


def check_exact_on_memory_backend_other_seed(name: str, tmp_path: Path) -> None:
    with opened(name, tmp_path / name, "memory", sync=False) as index:
        run_sessions(index, seed=5, steps=60, recover_at=None)


def check_first_insert_wins_and_namespaces(name: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    shared = chain(0, 70, rng)
    a = shared + chain(shared[-1], 10, rng)
    b = shared + chain(shared[-1], 5, rng)
    with opened(name, tmp_path / name) as index:
        index.insert_many([arr(a), arr(b)], ["x", "x"],
                          [np.full(len(a), 1, U64), np.full(len(b), 2, U64)])
        got_a, got_b, other_ns = index.match_many([arr(a), arr(b), arr(a)], ["x", "x", "y"])
        assert got_a.tolist() == [1] * len(a)
        assert got_b.tolist() == [1] * 70 + [2] * 5
        assert other_ns.tolist() == []
        index.insert_many([arr(a)], ["y"], [np.full(len(a), 3, U64)])
        index.insert_many([arr(a)], ["x"], [np.full(len(a), 4, U64)])
        got = index.match_many([arr(a[:40]), arr(a), arr([])], ["x", "y", "x"])
        assert [g.tolist() for g in got] == [[1] * 40, [3] * len(a), []]
        index.insert_many([], [], [])  # empty batches and sequences are fine
        index.insert_many([arr([])], ["x"], [arr([])])
        assert index.match_many([], []) == []
        with pytest.raises(ValueError, match="metas"):
            index.insert_many([arr(a)], ["x"], [arr([1])])


def check_hot_shared_prefix(name: str, cap: int | None, tmp_path: Path) -> None:
    kw: dict[str, Any] = {} if cap is None else {"cap_bytes": cap}
    with opened(name, tmp_path / name, **kw) as index:
        r = Runner(index)
        for step in hot_sessions(7, 48):
            r.step(step)
        verify_all(index, r)
        if isinstance(index, SegmentRadix):
            assert index.check() == []
