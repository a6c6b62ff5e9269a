"""Replay of request traces in the Mooncake JSON Lines format.

One request per line, in arrival order:
`{"timestamp": ..., "input_length": N, "output_length": M, "hash_ids": [...], "session_id": ...}`
(`session_id` optional; other fields ignored). `hash_ids` are prefix-chained ids of
coarse blocks of B tokens (B = 512 in Mooncake's traces, 16 in the LMCache-agent
conversion; the spec `trace:PATH@B` says which, default 16), the last usually partial,
so len(hash_ids) = ceil(input_length / B); a row must have at least the ids covering
its whole 16-token blocks and at most that (else the block size is wrong). The file is
streamed and hashed in batches of about 65k fine blocks; a malformed line raises
ValueError naming path:line and the field.

Fine ids: each coarse id becomes B/16 fine ids of 16-token blocks, from the chained
hash of `tools.bench.chains.chain_segments` whose block content is (coarse id, j): a
fine id depends on every coarse id before it, so two requests sharing k coarse ids
share their first k*B/16 fine ids and no more. Only the input_length // 16 whole
blocks are ids, so a partial last coarse block contributes its whole fine blocks.
(A partial coarse block has its own id in these traces, so its fine blocks never
match the full block's: the traces hide reuse below B tokens, and so do we.)

Every row is one `Turn` (prompt = sequence: the traces index the input only), replayed
in file order. Sessions: `session_id` if present (numbered in order of first
appearance), else derived: a row continues the session of the earlier row whose
whole-block prefix it extends most deeply, counting only rows whose last whole block
was new when they arrived (so a prefix every session shares, like a common system
prompt, links no rows); otherwise it starts a new session.

`scale` > 1 replays `scale` independent copies of the trace in lockstep (each row
`scale` times, copy c with its own chain root and sessions `session * scale + c`);
`seed` salts the chain root (same structure, other ids).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tools.bench.api import BLOCK_TOKENS, Ids, Turn
from tools.bench.chains import U64, chain_segments, mix64, root_state

_TRACE_TAG = 0x7472616365  # salts the chain root of trace ids
_COARSE_SALT = U64(0xC0A25E1D5A17B10C)
_J_MUL = U64(0xD6E8FEB86659FD93)
_BATCH_BLOCKS = 1 << 16  # rows are hashed in batches of about this many fine blocks
_BATCH_ROWS = 512

U64s = npt.NDArray[np.uint64]
I64s = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class Row:
    """One parsed trace line."""

    line: int
    input_length: int
    hash_ids: list[int]
    session_id: str | None
    timestamp: float = 0.0  # ms since the trace's start
    output_length: int = 0


def _field(path: Path, line: int, obj: dict[str, Any], key: str) -> Any:
    if key not in obj:
        raise ValueError(f"{path}:{line}: missing field {key!r}")
    return obj[key]


def _nonneg_int(path: Path, line: int, key: str, v: Any) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"{path}:{line}: field {key!r} must be a non-negative integer, "
                         f"got {v!r}")
    return v


def parse_line(path: Path, line: int, text: str, block_tokens: int) -> Row:
    """Parse and check one line (`line` is 1-based); ValueError names path:line."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}:{line}: expected a JSON object, got {type(obj).__name__}")
    ts = _field(path, line, obj, "timestamp")
    if type(ts) not in (int, float):
        raise ValueError(f"{path}:{line}: field 'timestamp' must be a number, got {ts!r}")
    n_in = _nonneg_int(path, line, "input_length", _field(path, line, obj, "input_length"))
    n_out = _nonneg_int(path, line, "output_length", _field(path, line, obj, "output_length"))
    ids = _field(path, line, obj, "hash_ids")
    if not isinstance(ids, list):
        raise ValueError(f"{path}:{line}: field 'hash_ids' must be a list, got {ids!r:.60}")
    for k, x in enumerate(ids):
        if type(x) is not int or not 0 <= x < 1 << 64:
            raise ValueError(f"{path}:{line}: hash_ids[{k}] must be an integer in "
                             f"[0, 2^64), got {x!r}")
    need = math.ceil((n_in // BLOCK_TOKENS) * BLOCK_TOKENS / block_tokens)
    most = math.ceil(n_in / block_tokens)
    if not need <= len(ids) <= most:
        want = f"{need}" if need == most else f"{need}-{most}"
        raise ValueError(f"{path}:{line}: hash_ids has {len(ids)} ids but input_length "
                         f"{n_in} at {block_tokens} tokens per id needs {want} "
                         "(wrong block size? give it as trace:PATH@BLOCKSIZE)")
    sid = obj.get("session_id")
    if sid is not None and type(sid) not in (str, int):
        raise ValueError(f"{path}:{line}: field 'session_id' must be a string or integer, "
                         f"got {sid!r}")
    return Row(line, n_in, ids, None if sid is None else str(sid), float(ts), n_out)


def read_rows(path: Path, block_tokens: int) -> Iterator[Row]:
    """The file's rows, streamed (blank lines are skipped)."""
    with path.open(encoding="utf-8") as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                yield parse_line(path, line, text, block_tokens)


def fine_content(rows: Sequence[Row], block_tokens: int) -> tuple[U64s, I64s]:
    """Content hashes of the fine blocks of `rows` (concatenated) and their counts:
    fine block j (from 1) of coarse id x hashes (x, j); only input_length // 16."""
    per = block_tokens // BLOCK_TOKENS
    n = np.array([r.input_length // BLOCK_TOKENS for r in rows], dtype=np.int64)
    k = -(-n // per)  # coarse ids holding at least one whole fine block
    coarse = np.fromiter(itertools.chain.from_iterable(
        r.hash_ids[:m] for r, m in zip(rows, k.tolist(), strict=True)), dtype=U64,
        count=int(k.sum()))
    full = k * per
    local = np.arange(int(full.sum()), dtype=np.int64) - np.repeat(np.cumsum(full) - full, full)
    keep = local < np.repeat(n, full)
    j = (local % per + 1).astype(U64) * _J_MUL
    content = mix64(np.repeat(mix64(coarse ^ _COARSE_SALT), per) + j)
    return content[keep], n


def fine_ids(rows: Sequence[Row], block_tokens: int, root: int) -> list[Ids]:
    """Each row's input_length // 16 fine ids, chained from `root` (module doc)."""
    content, n = fine_content(rows, block_tokens)
    ids = chain_segments(content, n, root)
    ids.setflags(write=False)
    return np.split(ids, np.cumsum(n)[:-1])


class SessionDeriver:
    """Numbers sessions: by session_id, else by prefix continuation (module doc)."""

    __slots__ = ("_by_name", "_by_tail", "_seen", "block_tokens", "count")

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.count = 0
        self._by_name: dict[str, int] = {}
        self._by_tail: dict[int, int] = {}
        self._seen: set[int] = set()

    def _new(self) -> int:
        self.count += 1
        return self.count - 1

    def session(self, row: Row) -> int:
        if row.session_id is not None:
            s = self._by_name.get(row.session_id)
            if s is None:
                s = self._by_name[row.session_id] = self._new()
            return s
        ids = row.hash_ids
        full = min(len(ids), row.input_length // self.block_tokens)
        s = next((self._by_tail[ids[k]] for k in range(full - 1, -1, -1)
                  if ids[k] in self._by_tail), None)
        if s is None:
            s = self._new()
        if full and ids[full - 1] not in self._seen:
            self._by_tail[ids[full - 1]] = s
        self._seen.update(ids)
        return s


@dataclass(frozen=True, slots=True)
class TraceStats:
    rows: int
    sessions: int
    fine_blocks: int


class TraceWorkload:
    """A Mooncake-format trace as a `Workload` (see the module doc)."""

    __slots__ = ("_stats", "block_tokens", "name", "path", "scale", "seed")

    def __init__(self, path: str | Path, block_tokens: int = BLOCK_TOKENS,
                 scale: int = 1, seed: int = 0) -> None:
        self.path = Path(path)
        if block_tokens < BLOCK_TOKENS or block_tokens % BLOCK_TOKENS:
            raise ValueError(f"trace {self.path}: block size must be a positive multiple "
                             f"of {BLOCK_TOKENS} tokens, got {block_tokens}")
        if scale < 1:
            raise ValueError(f"trace {self.path}: scale must be >= 1, got {scale}")
        if seed < 0:
            raise ValueError(f"trace {self.path}: seed must be >= 0, got {seed}")
        if not self.path.is_file():
            raise FileNotFoundError(f"trace {self.path}: no such file")
        self.block_tokens = block_tokens
        self.scale = scale
        self.seed = seed
        self.name = f"trace:{self.path.name}@{block_tokens}"
        self._stats: TraceStats | None = None

    def stats(self) -> TraceStats:
        """Rows, sessions and fine blocks of one copy (one pass over the file, kept)."""
        if self._stats is None:
            sessions = SessionDeriver(self.block_tokens)
            rows = blocks = 0
            for row in read_rows(self.path, self.block_tokens):
                sessions.session(row)
                rows += 1
                blocks += row.input_length // BLOCK_TOKENS
            self._stats = TraceStats(rows, sessions.count, blocks)
        return self._stats

    def describe(self) -> str:
        st, k = self.stats(), self.scale
        mean = st.fine_blocks / st.rows if st.rows else 0.0
        copies = f" x {k} copies" if k > 1 else ""
        return (f"{self.name}: {st.rows * k:,} rows, {st.sessions * k:,} sessions{copies}, "
                f"{mean:,.1f} blocks of {BLOCK_TOKENS} tokens per request (mean), ids of "
                f"{self.block_tokens} tokens expanded to {BLOCK_TOKENS}; seed {self.seed}")

    def turns(self) -> Iterator[Turn]:
        roots = [root_state(_TRACE_TAG, self.seed, c) for c in range(self.scale)]
        sessions = SessionDeriver(self.block_tokens)
        batch: list[Row] = []
        blocks = 0
        for row in itertools.chain(read_rows(self.path, self.block_tokens), [None]):
            if row is not None:
                batch.append(row)
                blocks += row.input_length // BLOCK_TOKENS
            if batch and (row is None or blocks >= _BATCH_BLOCKS or len(batch) >= _BATCH_ROWS):
                yield from self._replay(batch, roots, sessions)
                batch, blocks = [], 0

    def _replay(self, batch: list[Row], roots: list[int],
                sessions: SessionDeriver) -> Iterator[Turn]:
        """The turns of a batch of rows: ids hashed in one pass per copy."""
        content, n = fine_content(batch, self.block_tokens)
        per_copy = []
        for root in roots:
            ids = chain_segments(content, n, root)
            ids.setflags(write=False)
            per_copy.append(np.split(ids, np.cumsum(n)[:-1]))
        for r, row in enumerate(batch):
            s = sessions.session(row)
            for c, split in enumerate(per_copy):
                yield Turn(session=s * self.scale + c, ns=self.name,
                           prompt=split[r], sequence=split[r])
