"""What every baseline shares: namespace salting, key and value encoding, the base
class, and the cold-start measurement behind `recover()`.

Namespaces: a block id is XOR-ed with a 64-bit salt of its namespace
(`xxh3_64("sarp-bench-ns\\0" + ns)`) before it is used as a key or stored, so two
namespaces never share an entry (a cross-namespace collision is as likely as any
64-bit id collision).

Encodings (all baselines): a key holding a block id is the salted id as 8 bytes
big-endian (so keys sort like the ids); metadata is 8 bytes little-endian; an array of
ids or metas is raw little-endian uint64.

Cold start: `Baseline.recover()` closes the index, then runs a fresh Python process
(`python -m tools.bench.baselines.recover NAME ...`) that opens it and answers its
first match (the probe: the last sequence inserted). `RecoveryResult.seconds` is the
child's own time from after its imports to that answer (backend open, the index's
load, the match: in-process, as for sarp); `spawn_s` is the parent's time from the
spawn to the line the child prints (interpreter start and imports included). The
child's answer must equal the one given before the restart. The parent then reopens
the index in-process and goes on.

Budget and counters: the backend is opened with the run's cache budget and
`direct_io`; `memory_bytes()` of a backend baseline is the engine's
`stats()["memory_bytes"]` (cache in use, memtables, table readers) plus what the
index keeps itself; every key the index reads from the backend is counted
(`backend_reads()`, behind the bench's reads_per_match).
"""

from __future__ import annotations

import abc
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from backends.base import Backend, WriteBatch
from sarpd.core import open_backend
from tools.bench.api import Ids, RecoveryResult
from tools.bench.spawn import compile_bytecode

U64 = npt.NDArray[np.uint64]
WINDOW = 64  # blocks per segment window (as sarp)
RECOVER_TIMEOUT_S = 3600.0


class BaselineError(RuntimeError):
    """A baseline could not do what was asked (e.g. recovery lost data)."""


@lru_cache(maxsize=4096)
def ns_salt(ns: str) -> np.uint64:
    return np.uint64(xxhash.xxh3_64_intdigest(b"sarp-bench-ns\0" + ns.encode()))


def salted(ids: Ids, ns: str) -> U64:
    """The ids of `ns` as the baselines store them (1-D uint64, a new array)."""
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"ids: expected a 1-D array of block ids, got shape {arr.shape}")
    if arr.dtype != np.uint64:
        if arr.size and (arr.dtype.kind not in "ui" or int(arr.min()) < 0):
            raise ValueError(f"ids: expected uint64 block ids, got dtype {arr.dtype}")
        arr = arr.astype(np.uint64)
    out: U64 = np.bitwise_xor(arr, ns_salt(ns))
    return out


def be_keys(ids: U64, prefix: bytes = b"") -> list[bytes]:
    """One key per id: `prefix` + the id as 8 bytes big-endian (vectorised)."""
    n = len(ids)
    if not prefix:
        return list(ids.astype(">u8").view("V8").tolist())
    width = len(prefix) + 8
    buf = np.empty((n, width), dtype=np.uint8)
    buf[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    buf[:, len(prefix):] = ids.astype(">u8").view(np.uint8).reshape(n, 8)
    return list(buf.view(f"V{width}").ravel().tolist())


def be_key(prefix: bytes, *ids: int) -> bytes:
    return prefix + b"".join(int(i).to_bytes(8, "big") for i in ids)


def le_values(metas: npt.NDArray[Any]) -> list[bytes]:
    """One 8-byte little-endian value per meta (vectorised)."""
    return list(np.ascontiguousarray(metas, dtype="<u8").view("V8").tolist())


def pack_u64(*arrays: npt.NDArray[Any]) -> bytes:
    return b"".join(np.ascontiguousarray(a, dtype="<u8").tobytes() for a in arrays)


_LE_U64 = np.dtype("<u8")  # == np.uint64 on the little-endian hosts we run on


def unpack_u64(value: bytes) -> U64:
    """A read-only uint64 view of `value` (no copy on little-endian hosts)."""
    out: U64 = np.frombuffer(value, dtype=_LE_U64)
    if out.dtype != np.uint64:
        out = out.astype(np.uint64)
    return out


def first_miss(values: list[Any]) -> int:
    """Index of the first None (len when there is none), at C speed."""
    try:
        return values.index(None)
    except ValueError:
        return len(values)


PROBE_FANOUT = 64


def first_absent(qs: Sequence[U64], present: Callable[[U64], list[bool]]) -> list[int]:
    """Per sequence, the position of its first block that is not indexed (its length
    when all are). Valid because presence is prefix-closed along a chain of ids: every
    insert indexes a sequence from block 0 and nothing is ever removed (the BenchIndex
    API has no remove). Each round is ONE batched lookup (`present` of the ids, in
    order) of up to PROBE_FANOUT evenly spaced positions per unresolved sequence; a
    1,500-block sequence is resolved in two rounds of ~64 + ~24 lookups instead of a
    lookup of every block."""
    lo = [0] * len(qs)
    hi = [len(q) for q in qs]  # the answer is in [lo, hi]; q[hi] is absent (or hi = n)
    while todo := [i for i in range(len(qs)) if lo[i] < hi[i]]:
        probes = [np.unique(np.linspace(lo[i], hi[i] - 1, min(PROBE_FANOUT, hi[i] - lo[i]))
                            .astype(np.int64)) for i in todo]
        found = present(np.concatenate([qs[i][p] for i, p in zip(todo, probes, strict=True)]))
        off = 0
        for i, pos in zip(todo, probes, strict=True):
            got = found[off: off + len(pos)]
            off += len(pos)
            j = first_miss([True if g else None for g in got])
            if j == len(pos):
                lo[i] = int(pos[-1]) + 1
            else:
                hi[i] = int(pos[j])
                lo[i] = int(pos[j - 1]) + 1 if j else lo[i]
    return lo


def run_length(a: npt.NDArray[Any], b: npt.NDArray[Any]) -> int:
    """Length of the common prefix of two id arrays (vectorised)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ne = a[:n] != b[:n]
    i = int(ne.argmax())
    return i if bool(ne[i]) else n


def check_insert_args(seqs: Sequence[Ids], ns: Sequence[str],
                      metas: Sequence[npt.NDArray[np.uint64]], name: str) -> None:
    """The argument lengths of an insert_many call agree, per sequence too."""
    if not len(seqs) == len(ns) == len(metas):
        raise ValueError(f"{name}: insert_many got {len(seqs)} sequences, {len(ns)} "
                         f"namespaces and {len(metas)} meta arrays")
    for i, (s, m) in enumerate(zip(seqs, metas, strict=True)):
        if len(s) != len(m):
            raise ValueError(f"{name}: sequence {i}: {len(s)} ids but {len(m)} metas")


def metas_array(parts: Sequence[npt.NDArray[Any]]) -> U64:
    if not parts:
        return np.zeros(0, dtype=np.uint64)
    out: U64 = np.concatenate(parts).astype(np.uint64, copy=False)
    return out


def engine_memory(backend: Backend) -> int:
    """The engine's memory now (backends.base.Backend.stats: cache in use, write
    buffers / memtables, indexes kept outside the cache)."""
    return int(backend.stats().get("memory_bytes", 0))


class CountingBackend:
    """The run's backend, counting every key read through `get_many`, and each
    `scan` as one read (one seek; segment-hash-head matches by prefix scans)."""

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.persistent = inner.persistent
        self.direct_io = inner.direct_io
        self.reads = 0

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self.reads += len(keys)
        return self.inner.get_many(keys)

    def write(self, batch: WriteBatch, sync: bool) -> None:
        self.inner.write(batch, sync)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        self.reads += 1
        return self.inner.scan(start, end)

    def sync(self) -> None:
        self.inner.sync()

    def flush_buffers(self) -> None:
        self.inner.flush_buffers()

    def ingest(self, items: Iterable[tuple[bytes, bytes]]) -> int:
        return self.inner.ingest(items)

    def copy_to(self, dest: Path) -> None:
        self.inner.copy_to(dest)

    def resume(self) -> None:
        self.inner.resume()

    def close(self) -> None:
        self.inner.close()

    def stats(self) -> dict[str, int | float | str]:
        return self.inner.stats()


class Baseline(abc.ABC):
    """Base of every baseline: open/close bookkeeping, the recovery probe and the
    cold-start measurement. `sync` is the run's durability policy: every
    `insert_many` is one write, fsync'd before returning when true (default false,
    as `tools.bench.sarp_index.SarpBench`: a run must give every index the same)."""

    name: str

    def __init__(self, *, sync: bool = False) -> None:
        self.sync = sync
        self._data_dir: Path | None = None
        self.backend_name = ""
        self.cache_bytes = 0
        self.direct_io = False
        self._probe: tuple[U64, str] = (np.zeros(0, dtype=np.uint64), "")

    @property
    def data_dir(self) -> Path:
        if self._data_dir is None:
            raise BaselineError(f"{self.name}: not open")
        return self._data_dir

    def open(self, data_dir: Path, backend: str, cache_bytes: int,
             direct_io: bool = False) -> None:
        if self._data_dir is not None:
            raise BaselineError(f"{self.name}: already open on {self._data_dir}")
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self._data_dir, self.backend_name, self.cache_bytes = data_dir, backend, cache_bytes
        self.direct_io = direct_io
        try:
            self._open_state()
        except BaseException:
            self._data_dir = None
            raise

    def close(self) -> None:
        if self._data_dir is not None:
            try:
                self._close_state()
            finally:
                self._data_dir = None

    @abc.abstractmethod
    def _open_state(self) -> None:
        """Open (or create) the index's storage under `data_dir` and load what it keeps
        in memory: this is what a cold start pays."""

    @abc.abstractmethod
    def _close_state(self) -> None:
        """Make everything durable and release memory and files."""

    @abc.abstractmethod
    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]: ...

    @abc.abstractmethod
    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None: ...

    @abc.abstractmethod
    def flush(self) -> None: ...

    @abc.abstractmethod
    def memory_bytes(self) -> int: ...

    @abc.abstractmethod
    def disk_bytes(self) -> int: ...

    def routing_bytes(self) -> int:
        """Routing structures kept in memory outside the budget (none by default)."""
        return 0

    @abc.abstractmethod
    def backend_reads(self) -> int: ...

    def remember_probe(self, seqs: Sequence[Ids], ns: Sequence[str]) -> None:
        for ids, name in zip(reversed(seqs), reversed(ns), strict=True):
            if len(ids):
                self._probe = (np.array(ids, dtype=np.uint64), name)
                return

    def recovery_options(self) -> dict[str, Any]:
        """Constructor keywords that rebuild this index in the recovery process."""
        return {"sync": self.sync}

    def recover(self) -> RecoveryResult:
        return cold_start(self)


class BackendBaseline(Baseline):
    """A baseline whose entries live on the run's backend in `data_dir/<backend>/`."""

    _backend: CountingBackend | None = None
    _reads_before = 0  # keys read by backends this index closed (reopens keep counting)

    @property
    def backend(self) -> CountingBackend:
        if self._backend is None:
            raise BaselineError(f"{self.name}: not open")
        return self._backend

    def _open_backend(self) -> CountingBackend:
        self._backend = CountingBackend(open_backend(
            self.backend_name, self.data_dir / self.backend_name,
            cache_bytes=self.cache_bytes, direct_io=self.direct_io))
        return self._backend

    def backend_reads(self) -> int:
        return self._reads_before + (self._backend.reads if self._backend is not None else 0)

    def memory_bytes(self) -> int:
        """The engine's memory (the index keeps nothing else, unless it says so)."""
        return engine_memory(self.backend)

    def _close_state(self) -> None:
        backend, self._backend = self._backend, None
        if backend is not None:
            self._reads_before += backend.reads
            backend.close()

    def flush(self) -> None:
        """Durable, and the engine's write buffers written to its files."""
        self.backend.sync()
        self.backend.flush_buffers()

    def disk_bytes(self) -> int:
        return int(self.backend.stats()["disk_bytes"])


def _check_same(index: Baseline, when: str, expected: U64, got: Sequence[int] | U64) -> None:
    if len(got) != len(expected) or not np.array_equal(np.asarray(got, np.uint64), expected):
        raise BaselineError(
            f"{index.name}: {when}: the probe matched {len(got)} blocks, "
            f"{len(expected)} before the restart (recovery lost or changed data)")


def cold_start(index: Baseline) -> RecoveryResult:
    """Close `index`, time a fresh process opening it and answering the probe, then
    reopen it here. See the module docstring."""
    ids, ns = index._probe
    expected = index.match_many([ids], [ns])[0]
    data_dir = index.data_dir
    index._close_state()
    probe = data_dir / "recovery-probe.npy"
    np.save(probe, ids)
    cmd = [sys.executable, "-m", "tools.bench.baselines.recover", index.name,
           "--data-dir", str(data_dir), "--backend", index.backend_name,
           "--cache-bytes", str(index.cache_bytes), "--probe", str(probe), "--ns", ns,
           "--options", json.dumps(index.recovery_options())]
    if index.direct_io:
        cmd.append("--direct-io")
    compile_bytecode()
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        seconds = time.perf_counter() - t0
        try:
            proc.communicate(timeout=RECOVER_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        err.seek(0)
        if proc.returncode != 0 or not line:
            raise BaselineError(f"{index.name}: recovery process failed "
                                f"(exit {proc.returncode}): {err.read()[-2000:]}")
    report = json.loads(line)
    _check_same(index, "in the recovery process", expected, report["metas"])
    t1 = time.perf_counter()
    index._open_state()
    reopen = time.perf_counter() - t1
    _check_same(index, "after the in-process reopen", expected,
                index.match_many([ids], [ns])[0])
    probe.unlink(missing_ok=True)
    detail = (f"fresh process: imports {report['import_s']:.3f} s, open+load "
              f"{report['open_s']:.3f} s, first match {report['match_s'] * 1e3:.2f} ms "
              f"({len(expected)} blocks); in-process reopen {reopen:.3f} s")
    if report.get("detail"):
        detail += f"; {report['detail']}"
    return RecoveryResult(seconds=report["open_s"] + report["match_s"], spawn_s=seconds,
                          detail=detail)
