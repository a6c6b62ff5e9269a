"""Replay one workload through every named index, side by side, in one run.

For each index: open it empty under its own directory, replay the same turns in the
same batches (per batch: one match call for the prompts, then one insert call for
the sequences), record memory, flush (durable, write buffers written out), measure
a cold recovery, and record disk. Match latency is the batch's match time divided
by its size (the daemon batches the same way); throughput counts turns (match +
insert) per second of replay; reads_per_match is the index's backend point reads
during its match calls per match request.
All SSD designs get the same memory budget: 10 % of the uncompressed SSD-BlockHash
store (unique blocks x 16 bytes: an 8-byte key and an 8-byte value), which the
engine's memory (cache and write buffers: the backend's whole `cache_bytes`) and the
index's own caches share; with `direct_io` (the default of `sarpctl bench`) the OS
page cache serves none of their reads. WiredTiger keeps a cache of 32 MiB at least
(backends.registry.CACHE_FLOORS), so a smaller budget does not bind it; the report
says so.

Segment-radix's in-memory tree cap is fitted so that its recovery is RADIX_RECOVERY_X
(1.5) times sarp's (sarp runs first; `fitted_radix`, SegmentRadix.fit_cap): on the
tree its measured run will recover. Without a preload, a trial replay of the workload
on an empty store; with `--preload`, the workload replayed on a copy of its preloaded
store (the one `preload` built or copied from `--preload-cache`), the cap searched
there, then the measured run starts from the preloaded store itself, untouched by the
fit, with that cap (which the preload's uncapped snapshot is loaded under). The fit
(cap, whole tree, nodes resident, the recovery it measured, or an unreachable target
at cap 0) is appended to segment-radix's `recovery_detail`.

An index that fails (an exception anywhere in its run) costs only its own result:
its entry is an `IndexFailure` (`{"index": NAME, "error": MESSAGE}` in the JSON),
the other indexes run and are reported, and `BenchResult.failed` tells the caller.

JSON (`BenchResult.to_json`), schema 2: `schema`, `workload`, `description`,
`requests`, `blocks`, `cache_bytes` (the budget), `preload_blocks`, `direct_io`,
`recovery_runs` (cold recoveries timed per index: `recovery_s` and `recovery_spawn_s`
are each the fastest; files without it timed one), `results` (per index:
`IndexResult`'s fields but the per-request latencies, or an `IndexFailure`).
Per sarp index also `native` (`{"match", "hash", "write"}: bool`, which paths ran
natively; `sarp-py` runs every reference) and `kernel_efficiency`: its match time
over the time of ONE bare backend multi-get per batch of the keys the match read,
re-read right after it (warm; untimed in the replay's own figures); null/0 for the
baselines.
Schema 1 (before recovery_s meant in-process time) had no `schema` field.
"""

from __future__ import annotations

import importlib
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tools.bench.api import BLOCK_TOKENS, BenchIndex, Turn, Workload, fastest
from tools.bench.preload import Shape
from tools.bench.preload import preload as preload_index
from tools.bench.preload import shape_of as preload_shape

if TYPE_CHECKING:
    from tools.bench.baselines.segment_radix import CapFit, SegmentRadix

ProgressFn = Callable[[int], None]
SCHEMA = 2
RECOVERY_RUNS = 3  # cold recoveries timed per index; the fastest is reported (api.fastest)


@dataclass(frozen=True, slots=True)
class IndexResult:
    index: str
    backend: str
    requests: int
    seconds: float
    throughput_rps: float
    match_us_mean: float
    match_us_p99: float
    tokens_reused: int
    tokens_queried: int
    recovery_s: float  # in-process: open, load, first answered match
    memory_bytes: int  # inside the budget: engine cache + write buffers + own caches
    disk_bytes: int
    insert_us_mean: float = 0.0
    recovery_detail: str = ""
    verifier: str = ""  # sarp: which first-mismatch implementation ran (c or numpy)
    recovery_spawn_s: float = 0.0  # process spawn to the first answered match
    routing_bytes: int = 0  # routing structures in memory, outside the budget
    reads_per_match: float = 0.0  # backend point reads per match request (mean)
    native: dict[str, bool] | None = None  # sarp: which paths ran natively
    kernel_efficiency: float = 0.0  # sarp: match time / bare multi-get time of its reads
    match_us: list[float] = field(default_factory=list, repr=False)

    def public(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("match_us")
        return d


@dataclass(frozen=True, slots=True)
class IndexFailure:
    """An index whose run raised: the message names the index and the exception."""

    index: str
    error: str

    def public(self) -> dict[str, Any]:
        return {"index": self.index, "error": self.error}


@dataclass(frozen=True, slots=True)
class BenchResult:
    workload: str
    description: str
    requests: int
    blocks: int
    cache_bytes: int
    results: list[IndexResult | IndexFailure]
    direct_io: bool = False
    preload_blocks: int = 0  # blocks each index held before the replay (--preload)
    schema: int = SCHEMA
    recovery_runs: int = 1  # cold recoveries timed per index, the fastest reported

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "workload": self.workload,
                "description": self.description, "requests": self.requests,
                "blocks": self.blocks, "cache_bytes": self.cache_bytes,
                "preload_blocks": self.preload_blocks, "direct_io": self.direct_io,
                "recovery_runs": self.recovery_runs,
                "results": [r.public() for r in self.results]}

    @staticmethod
    def from_json(doc: dict[str, Any]) -> BenchResult:
        """Schema 2, or schema 1 (no `schema` field; the new fields read as 0)."""
        results: list[IndexResult | IndexFailure] = [
            IndexFailure(**r) if "error" in r else IndexResult(**r) for r in doc["results"]]
        return BenchResult(doc["workload"], doc.get("description", ""), doc["requests"],
                           doc["blocks"], doc.get("cache_bytes", 0), results,
                           bool(doc.get("direct_io", False)), int(doc.get("preload_blocks", 0)),
                           int(doc.get("schema", 1)), int(doc.get("recovery_runs", 1)))

    def by_name(self) -> dict[str, IndexResult]:
        """The indexes that completed, by name."""
        return {r.index: r for r in self.results if isinstance(r, IndexResult)}

    def completed(self) -> list[IndexResult]:
        return [r for r in self.results if isinstance(r, IndexResult)]

    def failed(self) -> list[IndexFailure]:
        return [r for r in self.results if isinstance(r, IndexFailure)]


def index_factories() -> dict[str, Callable[[], BenchIndex]]:
    """Every index the harness knows: sarp first, then the baselines."""
    from tools.bench.sarp_index import SarpBench, capped, no_locators, reference

    out: dict[str, Callable[[], BenchIndex]] = {"sarp": SarpBench,
                                                "sarp-py": reference,
                                                "sarp-cap4": capped,
                                                "sarp-no-locators": no_locators}
    try:
        baselines = importlib.import_module("tools.bench.baselines")
    except ImportError:
        return out
    out.update(getattr(baselines, "BASELINES", {}))
    return out


def cache_budget(turns: Sequence[Turn], preload: int = 0) -> tuple[int, int]:
    """(unique blocks, cache bytes = 10 % of the uncompressed SSD-BlockHash store,
    counting the `preload` blocks every index holds too)."""
    if not turns:
        return 0, max(1 << 20, preload * 16 // 10)
    unique = int(np.unique(np.concatenate([t.sequence for t in turns])).size)
    return unique, max(1 << 20, (unique + preload) * 16 // 10)


def batches(turns: Sequence[Turn], size: int) -> list[tuple[int, Sequence[Turn]]]:
    """Consecutive turns, at most `size` per batch and one turn per session per batch,
    so that a turn always sees what the previous turn of its session inserted."""
    out: list[tuple[int, Sequence[Turn]]] = []
    start, sessions = 0, set[tuple[str, int]]()
    for i, t in enumerate(turns):
        key = (t.ns, t.session)
        if i - start >= size or key in sessions:
            out.append((start, turns[start:i]))
            start, sessions = i, set()
        sessions.add(key)
    if start < len(turns):
        out.append((start, turns[start:]))
    return out


@dataclass(slots=True)
class Replayed:
    """What one replay measured."""

    match_us: list[float] = field(default_factory=list)  # per request
    total_s: float = 0.0
    insert_s: float = 0.0
    reused: int = 0  # blocks
    queried: int = 0  # blocks
    match_reads: int = 0  # backend point reads during the match calls
    match_s: float = 0.0
    bare_s: float = 0.0  # bare multi-gets of what the match calls read (bare_reread)


def replay(index: BenchIndex, turns: Sequence[Turn], batch: int,
           progress: ProgressFn | None = None,
           on_batch: Callable[[float, float], None] | None = None,
           ) -> tuple[list[float], float, float, int, int]:
    """(per-request match µs, total seconds, insert seconds, blocks reused, blocks queried).
    `on_batch(match_s, insert_s)` is called after each batch."""
    r = replay_counted(index, turns, batch, progress, on_batch)
    return r.match_us, r.total_s, r.insert_s, r.reused, r.queried


def replay_counted(index: BenchIndex, turns: Sequence[Turn], batch: int,
                   progress: ProgressFn | None = None,
                   on_batch: Callable[[float, float], None] | None = None) -> Replayed:
    """`replay`, also counting the index's backend reads during its match calls."""
    out = Replayed()
    match_us = out.match_us
    total = inserting = 0.0
    reused = queried = reads = 0
    bare: Callable[[], float] | None = getattr(index, "bare_reread", None)
    for b, chunk in batches(turns, batch):
        ns = [t.ns for t in chunk]
        r0 = index.backend_reads()
        t0 = time.perf_counter()
        metas = index.match_many([t.prompt for t in chunk], ns)
        t1 = time.perf_counter()
        reads += index.backend_reads() - r0
        if bare is not None:  # untimed here: the kernel-efficiency baseline
            out.bare_s += bare()
        t1b = time.perf_counter()
        index.insert_many([t.sequence for t in chunk], ns,
                          [np.full(len(t.sequence), b + i + 1, dtype=np.uint64)
                           for i, t in enumerate(chunk)])
        t2 = time.perf_counter()
        match_us.extend([(t1 - t0) * 1e6 / len(chunk)] * len(chunk))
        out.match_s += t1 - t0
        total += (t1 - t0) + (t2 - t1b)
        inserting += t2 - t1b
        reused += sum(len(m) for m in metas)
        queried += sum(len(t.prompt) for t in chunk)
        if progress is not None:
            progress(len(chunk))
        if on_batch is not None:
            on_batch(t1 - t0, t2 - t1)
    out.total_s, out.insert_s, out.reused, out.queried = total, inserting, reused, queried
    out.match_reads = reads
    return out


def run_index(name: str, index: BenchIndex, turns: Sequence[Turn], data_dir: Path,
              backend: str, cache_bytes: int, batch: int,
              progress: ProgressFn | None = None, direct_io: bool = False,
              recovery_runs: int = RECOVERY_RUNS) -> IndexResult:
    """memory_bytes: the larger of the sample at the end of the replay (write buffers
    still full) and the one after the recovery's reopen; routing_bytes likewise.
    Recovery is timed `recovery_runs` times, the fastest reported (api.fastest)."""
    if recovery_runs < 1:
        raise ValueError(f"recovery_runs must be at least 1, got {recovery_runs}")
    index.open(data_dir / name, backend, cache_bytes, direct_io)
    try:
        r = replay_counted(index, turns, batch, progress)
        memory, routing = index.memory_bytes(), index.routing_bytes()
        index.flush()
        stats = getattr(index, "stats", None)
        verifier = str(stats().get("verifier", "")) if callable(stats) else ""
        paths = getattr(index, "native", None)
        native = paths() if callable(paths) else None
        disk = index.disk_bytes()
        rec = fastest([index.recover() for _ in range(recovery_runs)])
        memory = max(memory, index.memory_bytes())
        routing = max(routing, index.routing_bytes())
    finally:
        index.close()
    n = len(turns)
    arr = np.array(r.match_us) if r.match_us else np.zeros(1)
    return IndexResult(
        index=name, backend=backend if name not in ("redis", "dram-blockhash-memory") else name,
        requests=n, seconds=r.total_s, throughput_rps=n / r.total_s if r.total_s else 0.0,
        match_us_mean=float(arr.mean()), match_us_p99=float(np.percentile(arr, 99)),
        tokens_reused=r.reused * BLOCK_TOKENS, tokens_queried=r.queried * BLOCK_TOKENS,
        recovery_s=rec.seconds, memory_bytes=memory, disk_bytes=disk,
        insert_us_mean=r.insert_s * 1e6 / n if n else 0.0, recovery_detail=rec.detail,
        verifier=verifier, recovery_spawn_s=rec.spawn_s, routing_bytes=routing,
        reads_per_match=r.match_reads / n if n else 0.0, native=native,
        kernel_efficiency=r.match_s / r.bare_s if r.bare_s else 0.0, match_us=r.match_us,
    )


def failure(name: str, exc: BaseException) -> IndexFailure:
    return IndexFailure(name, f"{name}: {type(exc).__name__}: {exc}")


@dataclass(frozen=True, slots=True)
class _Run:
    """What every index of one `run_bench` shares."""

    turns: list[Turn]
    data_dir: Path
    backend: str
    cache: int
    batch: int
    sync: bool
    direct_io: bool
    shape: Shape | None  # with a preload
    preload: int
    seed: int
    preload_cache: Path | None
    progress: Callable[[str, int], ProgressFn] | None
    recovery_runs: int


def run_bench(workload: Workload, names: Sequence[str], backend: str, data_dir: Path,
              batch: int = 16, progress: Callable[[str, int], ProgressFn] | None = None,
              sync: bool = False, preload: int = 0, preload_cache: Path | None = None,
              seed: int = 0, direct_io: bool = False,
              recovery_runs: int = RECOVERY_RUNS) -> BenchResult:
    """Every index is built with the same durability policy (`sync`: fsync each
    insert call before it returns) and the same `direct_io`; with `preload`, each is
    first filled with that many blocks of the workload's shape (tools/bench/preload.py).
    sarp runs first: segment-radix's cap is then fitted to RADIX_RECOVERY_X times
    sarp's recovery (`fitted_radix`). An index that raises gets an IndexFailure and
    the run goes on (module docstring)."""
    factories = index_factories()
    unknown = [n for n in names if n not in factories]
    if unknown:
        raise ValueError(f"unknown index {', '.join(unknown)} (known: {', '.join(factories)})")
    turns = list(workload.turns())
    blocks, cache = cache_budget(turns, preload)
    run = _Run(turns, data_dir, backend, cache, batch, sync, direct_io,
               preload_shape(turns) if preload else None, preload, seed, preload_cache,
               progress, recovery_runs)
    results: list[IndexResult | IndexFailure] = []
    for name in sorted(names, key=lambda n: n != "sarp"):  # sarp first: radix's cap follows it
        try:
            results.append(_bench_one(run, name, _maker(factories[name], sync),
                                      results[0] if results else None))
        except Exception as exc:  # one index failing must not cost the others' results
            results.append(failure(name, exc))
    results.sort(key=lambda r: list(names).index(r.index))
    return BenchResult(workload.name, workload.describe(), len(turns), blocks, cache, results,
                       direct_io=direct_io, preload_blocks=preload,
                       recovery_runs=recovery_runs)


def _maker(factory: Callable[[], BenchIndex], sync: bool) -> Callable[[], BenchIndex]:
    """A factory of the index with the run's durability policy (every index takes sync=)."""
    return lambda: factory(sync=sync)  # type: ignore[call-arg]


def _bench_one(run: _Run, name: str, make: Callable[[], BenchIndex],
               sarp: IndexResult | IndexFailure | None) -> IndexResult:
    """Preload (if asked), fit segment-radix's cap to sarp's recovery, then the run."""
    bar = run.progress(name, len(run.turns)) if run.progress is not None else None
    preloaded: Path | None = None
    if run.shape is not None:
        preloaded = run.data_dir / name
        preload_index(name, make, preloaded, run.backend, run.cache, run.shape, run.preload,
                      run.seed, run.preload_cache,
                      run.progress(f"{name} preload", run.preload) if run.progress else None)
    index, note = make(), ""
    if name == "segment-radix" and isinstance(sarp, IndexResult) and sarp.index == "sarp":
        index, fit = fitted_radix(index, run.turns, run.data_dir, run.backend, run.cache,
                                  run.batch, RADIX_RECOVERY_X * sarp.recovery_s, run.direct_io,
                                  preloaded=preloaded)
        note = fit_note(fit, sarp.recovery_s, preloaded is not None)
    result = run_index(name, index, run.turns, run.data_dir, run.backend, run.cache, run.batch,
                       bar, run.direct_io, run.recovery_runs)
    if not note:
        return result
    return replace(result, recovery_detail=f"{result.recovery_detail}; {note}")


RADIX_RECOVERY_X = 1.5  # segment-radix's memory cap: recovery ~1.5x sarp's (brief: 0.96-1.96x)
FIT_DIR = "segment-radix-fit"  # under the run's data dir, removed after the fit


def fitted_radix(index: BenchIndex, turns: Sequence[Turn], data_dir: Path, backend: str,
                 cache: int, batch: int, target_s: float, direct_io: bool = False,
                 preloaded: Path | None = None, measure: Callable[[], float] | None = None,
                 ) -> tuple[BenchIndex, CapFit]:
    """Choose segment-radix's memory cap on the tree its measured run will recover: the
    largest cap whose cold recovery (in-process: RecoveryResult.seconds; `measure`
    overrides, for tests) takes at most `target_s` (SegmentRadix.fit_cap). The fit
    replays the workload in data_dir/FIT_DIR: on an empty store without a preload (a
    trial replay), or on a copy of the preloaded store `preloaded` (its tree is the
    preload's plus the replay's, as in the measured run, which still starts from
    `preloaded` untouched). Returns a fresh index with that cap, and the fit."""
    radix = cast("SegmentRadix", index)
    fit_dir = data_dir / FIT_DIR
    shutil.rmtree(fit_dir, ignore_errors=True)
    if preloaded is not None:
        shutil.copytree(preloaded, fit_dir)
    try:
        radix.open(fit_dir, backend, cache, direct_io)
        try:
            replay(radix, turns, batch)
            fit = radix.fit_cap(target_s, measure=measure)
        finally:
            radix.close()
    finally:
        shutil.rmtree(fit_dir, ignore_errors=True)
    return type(radix)(cap_bytes=fit.cap_bytes, sync=radix.sync), fit


def fit_note(fit: CapFit, sarp_s: float, preloaded: bool) -> str:
    """The fit, for segment-radix's recovery_detail."""
    where = ("a copy of the preloaded store after the workload's replay" if preloaded
             else "a trial replay of the workload")
    return (f"cap fitted to {RADIX_RECOVERY_X}x sarp's recovery ({sarp_s:.3f} s) on {where}: "
            f"{fit.describe()}")
