"""`sarpctl bench --preload BLOCKS`: fill every index with BLOCKS blocks of the
workload's own shape before the workload replays on top.

Shape (`shape_of`, read from the workload's turns): its namespaces; its system
prompts (per namespace, each session's first prompt cut to the longest prefix it
shares with another session's: the hot prefixes); its blocks added per turn and
turns per session. The fill (`sequences`) draws sessions from that shape: a system
prompt, then that many turns of new blocks; and branches: one in four sequences
leaves an earlier one at a random block (regenerate, edit, retry), a fifth of those
with 2-16 siblings of the same parent (tree search). New blocks get fresh random
64-bit ids, so the replay shares only the system prompts with the fill, as a new
day's traffic would; hot posting lists hold thousands of sessions.
Each session is inserted once, whole (its last turn: what its turns would leave in
the index, without replaying each turn's match and insert), parents before their
branches.

Fill path: inserts for all. Every index (sarp and every baseline, SSD or memory)
gets the same sequences through its own `insert_many`, in batches of BATCH, then
`flush`: every SSD store is an LSM (or engine) built by its own writes, none
compacted or bulk-ingested where another is not. (`sarpctl import` and
`--recovery-only` use sarp's bulk path, sarpd/core/bulk.py, where no SSD baseline
is compared.)

Cache (`--preload-cache DIR`): a filled, flushed and closed index directory is
copied to DIR/<index>-<backend>-<shape digest>-<seed>-<blocks> (marked complete by
a file DONE written last) and copied back in by later runs instead of a rebuild;
sarp-py shares sarp's (SAME_STORE).
At MEMORY_LIMIT_BLOCKS and more the in-memory indexes (MEMORY_INDEXES) are left out
(~100 B per block in RAM each), with a note.

Segment-radix is preloaded uncapped (its snapshot holds the whole tree). Its cap is
fitted afterwards, on a copy of the preloaded store with the workload replayed on it
(tools/bench/runner.py `fitted_radix`); the measured run then opens the preloaded
store itself under that cap (the snapshot is loaded only as far as the cap allows).
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.bench.api import BenchIndex, Ids, Turn

BATCH = 32  # sequences per insert call
BRANCH_P = 0.25  # a sequence branches from an earlier one
SIBLINGS_P = 0.2  # ... with many siblings of the same parent
MAX_BLOCKS = 65_536  # longest sequence (sarp's default max_sequence_tokens / 16)
LIVE = 4096  # recent sequences a branch may leave
MEMORY_INDEXES = frozenset({"dram-blockhash", "redis"})
MEMORY_LIMIT_BLOCKS = 100_000_000
# indexes whose filled store is another's, byte for byte: sarp-py writes what sarp
# writes (the same format through the reference of the same write path, parity-tested),
# so the cache keeps one store for both and a 10M fill is not repeated on the reference
SAME_STORE = {"sarp-py": "sarp"}

ProgressFn = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class Shape:
    prompts: tuple[tuple[str, Ids], ...]  # (namespace, system prompt), one per session
    turn_blocks: Ids  # blocks added by each observed turn (> 0)
    session_turns: Ids  # turns of each observed session

    def digest(self) -> str:
        h = hashlib.sha256()
        for ns, p in self.prompts:
            h.update(ns.encode() + b"\0" + p.tobytes())
        h.update(self.turn_blocks.tobytes() + self.session_turns.tobytes())
        return h.hexdigest()[:12]


def shape_of(turns: Sequence[Turn]) -> Shape:
    """The workload's namespaces, system prompts and turn sizes (module docstring)."""
    first: dict[tuple[str, int], Ids] = {}
    last: dict[tuple[str, int], int] = {}
    counts: dict[tuple[str, int], int] = {}
    growth: list[int] = []
    for t in turns:
        key = (t.ns, t.session)
        if key not in first:
            first[key] = t.prompt
        growth.append(len(t.sequence) - last.get(key, len(t.prompt)))
        last[key] = len(t.sequence)
        counts[key] = counts.get(key, 0) + 1
    prompts: list[tuple[str, Ids]] = []
    for ns in sorted({ns for ns, _ in first}):
        heads = sorted((tuple(p[:4096].tolist()) for (n, _), p in first.items() if n == ns))
        for i, h in enumerate(heads):
            shared = max(_lcp(h, heads[i - 1]) if i else 0,
                         _lcp(h, heads[i + 1]) if i + 1 < len(heads) else 0)
            prompts.append((ns, np.array(h[:shared], dtype=np.uint64)))
    g = np.array([x for x in growth if x > 0] or [16], dtype=np.uint64)
    return Shape(tuple(prompts) or (("", np.empty(0, np.uint64)),), g,
                 np.array(sorted(counts.values()) or [1], dtype=np.uint64))


def _lcp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def sequences(shape: Shape, blocks: int, seed: int = 0) -> Iterator[tuple[str, Ids, int]]:
    """(namespace, sequence, new blocks in it) until `blocks` new blocks are out."""
    rng = np.random.default_rng([seed, 0x5EED])
    live: list[tuple[str, Ids]] = []
    done = 0
    while done < blocks:
        if live and rng.random() < BRANCH_P:
            ns, parent = live[int(rng.integers(0, len(live)))]
            cut = int(rng.integers(1, len(parent) + 1))
            kids = int(rng.integers(2, 17)) if rng.random() < SIBLINGS_P else 1
            out = [(ns, parent[:cut], _growth(shape, rng, 1)) for _ in range(kids)]
        else:
            ns, prompt = shape.prompts[int(rng.integers(0, len(shape.prompts)))]
            turns = int(shape.session_turns[int(rng.integers(0, len(shape.session_turns)))])
            out = [(ns, prompt, _growth(shape, rng, turns))]
        for ns, head, n in out:
            n = max(1, min(n, MAX_BLOCKS - len(head), blocks - done))
            seq = np.concatenate([head, rng.integers(1, 2**64 - 1, n, dtype=np.uint64,
                                                     endpoint=True)])
            done += n
            live.append((ns, seq))
            yield ns, seq, n
            if done >= blocks:
                return
        if len(live) > LIVE:
            del live[: LIVE // 2]


def _growth(shape: Shape, rng: np.random.Generator, turns: int) -> int:
    picks = rng.integers(0, len(shape.turn_blocks), turns)
    return int(shape.turn_blocks[picks].sum())


def fill(index: BenchIndex, seqs: Iterator[tuple[str, Ids, int]],
         progress: ProgressFn | None = None) -> None:
    """Insert every sequence through the index's own `insert_many`, BATCH at a time."""
    batch: list[tuple[str, Ids, int]] = []
    for item in seqs:
        batch.append(item)
        if len(batch) == BATCH:
            _insert(index, batch, progress)
            batch = []
    if batch:
        _insert(index, batch, progress)


def _insert(index: BenchIndex, batch: list[tuple[str, Ids, int]],
            progress: ProgressFn | None) -> None:
    index.insert_many([s for _, s, _ in batch], [ns for ns, _, _ in batch],
                      [np.zeros(len(s), dtype=np.uint64) for _, s, _ in batch])
    if progress is not None:
        progress(sum(n for _, _, n in batch))


def left_out(names: Sequence[str], blocks: int) -> tuple[list[str], str]:
    """(the indexes that run, a note naming those left out) for a preload of `blocks`."""
    if blocks < MEMORY_LIMIT_BLOCKS:
        return list(names), ""
    out = [n for n in names if n in MEMORY_INDEXES]
    if not out:
        return list(names), ""
    return ([n for n in names if n not in MEMORY_INDEXES],
            f"preload {blocks:,} blocks: {', '.join(out)} left out (in-memory indexes "
            f"would hold ~{blocks * 100 / 1e9:.0f} GB each)")


def cache_key(name: str, backend: str, shape: Shape, seed: int, blocks: int) -> str:
    return f"{name}-{backend}-{shape.digest()}-s{seed}-{blocks}"


def preload(name: str, make: Callable[[], BenchIndex], dest: Path, backend: str,
            cache_bytes: int, shape: Shape, blocks: int, seed: int = 0,
            cache_dir: Path | None = None, progress: ProgressFn | None = None) -> bool:
    """Leave `dest` holding index `name` filled with `blocks` blocks of `shape`, flushed
    and closed. True when it came from `cache_dir` (no rebuild)."""
    key = cache_key(SAME_STORE.get(name, name), backend, shape, seed, blocks)
    cached = cache_dir / key if cache_dir else None
    if cached is not None and (cached / "DONE").exists():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(cached, dest, ignore=shutil.ignore_patterns("DONE"))
        if progress is not None:
            progress(blocks)
        return True
    index = make()
    index.open(dest, backend, cache_bytes)
    try:
        fill(index, sequences(shape, blocks, seed), progress)
        index.flush()
    finally:
        index.close()
    if cached is not None:
        tmp = cached.with_name(cached.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(dest, tmp)
        (tmp / "DONE").write_text("complete\n")
        shutil.rmtree(cached, ignore_errors=True)
        tmp.rename(cached)
    return False
