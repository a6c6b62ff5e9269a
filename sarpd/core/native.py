"""The one place that picks native code: a `Kernels` object, built once for an index.

Every hot path has a numpy/Python reference beside it; its C counterpart, when the
install built it, replaces the reference. Which one runs is decided here and nowhere
else, once, when an index is built: `pick()` returns a `Kernels` (one slot per path:
the loaded extension module, or None where the reference runs) that the index hands
to its store, router, writer and matcher, which call through it. So `sarp` and
`sarp-py` (`pick(reference=True)`: every reference) run side by side in one process,
same build, same run (the bench). `SARPD_NO_EXTENSIONS=1` makes every slot the
reference (`pick()` loads nothing), for the tests' second run. `status()` says which paths
the default runs natively (the bench's `native` field); `expected()` says which the
install should have built, for the test suite's guard (a compiler is here, and, for
hashing, libxxhash's header): an extension that should have loaded and did not is a
broken install, not a slower one.

    path      extension                          reference
    verify    sarpd.core.verify._cverify         sarpd.core.verify._numpy
    match     sarpd.core._cmatch                 sarpd.core.router (deepest, plan_at),
                                                 sarpd.core.index (_verify_round),
                                                 sarpd.core.segcache (SegmentCache)
    hash      sarpd.core._chash (libxxhash)      sarpd.core.ids (Python + xxhash)
    write     sarpd.core._cwrite                 sarpd.core.segment (codecs, locators),
                                                 sarpd.core.delta (encode_delta),
                                                 sarpd.core.router (segment_filters),
                                                 sarpd.core.writer (a window's loops)
    map       sarpd.core._cmap                   sarpd.core.blockmap (BlockMap)
    dir       sarpd.core._cdir                   sarpd.core.directory (Directory)

Every extension's functions are declared in its `.pyi` stub and, for the slots, in
the protocols below (mypy checks that each module satisfies its protocol where `pick`
assigns it). The C sources share sarpd/core/csrc/sarp.h (buffer checks, the id mix).

Standard library only at run time: setup.py loads this file to decide what to build
(`xxhash_found`).
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import numpy as np
    import numpy.typing as npt

    from sarpd.core.blockmap import MapArrays, Spill
    from sarpd.core.directory import DirectoryArrays, FlatDirectory
    from sarpd.core.segment import Segment
    from sarpd.model import IdArray, U64Array

    I64Array = npt.NDArray[np.int64]
    BufferLike = bytes | bytearray | memoryview | npt.NDArray[Any]
    # a segment a window kernel changed: (its index, presence, meta, xmeta, xmask)
    Change = tuple[int, int, bytearray, bytearray, bytearray]

__all__ = ["ENABLED", "EXTENSIONS", "XXHASH_PROBE", "BlockMapLike", "DirKernel", "DirectoryLike",
           "HashKernel", "Kernels", "MapKernel", "MatchKernel", "SegmentCacheLike", "VerifyKernel",
           "WriteKernel",
           "compiler", "expected", "pick", "status", "summary", "xxhash_found"]

ENABLED = os.environ.get("SARPD_NO_EXTENSIONS") != "1"

# path -> the extension module that runs it natively
EXTENSIONS: dict[str, str] = {
    "verify": "sarpd.core.verify._cverify",
    "hash": "sarpd.core._chash",
    "match": "sarpd.core._cmatch",
    "write": "sarpd.core._cwrite",
    "map": "sarpd.core._cmap",
    "dir": "sarpd.core._cdir",
}


class VerifyKernel(Protocol):
    """sarpd/core/verify/_cverify.c (and its reference, sarpd/core/verify/_numpy.py)."""

    def first_mismatch(self, cand: IdArray, query: IdArray, /) -> int: ...
    def first_mismatch_many(self, cands: Sequence[IdArray], queries: Sequence[IdArray],
                            /) -> list[int]: ...


class HashKernel(Protocol):
    """sarpd/core/_chash.c (references: sarpd.core.ids `_ref_chain_ids*`,
    sarpd.indexer.hashing `_ref_local_hashes`)."""

    def chain_ids(self, parent: BufferLike, tokens: BufferLike, block_tokens: int,
                  /) -> bytearray: ...
    def chain_ids_flat(self, parents: BufferLike, tokens: BufferLike, offsets: BufferLike,
                       block_tokens: int, /) -> tuple[bytearray, bytearray]: ...
    def block_hashes(self, tokens: BufferLike, block_tokens: int, seed: int,
                     /) -> bytearray: ...
    def msgpack_u32(self, raw: BufferLike, /) -> bytes | None: ...


class MatchKernel(Protocol):
    """sarpd/core/_cmatch.c (layout: sarpd/core/kernel.py)."""

    def route(self, qids: IdArray, qlens: I64Array, bkeys: U64Array, bsegs: U64Array,
              bfilts: U64Array, dkeys: U64Array, dsegs: U64Array, dfilts: U64Array,
              dorder: I64Array, sb: int, gap: int, cap: int, kfilter: U64Array = ...,
              /) -> tuple[bytes, bytes]: ...
    def verify(self, qids: IdArray, qstarts: I64Array, rows: I64Array, first: U64Array,
               segs: Mapping[int, Segment], sb: int, /) -> tuple[bytes, bytes]: ...
    def assemble(self, rows: I64Array, span: I64Array, best: I64Array, sids: U64Array,
                 segs: Mapping[int, Segment], ks: I64Array, with_spans: I64Array | None = ...,
                 /) -> tuple[bytes, bytearray, bytearray, bytearray]: ...
    def match(self, qids: IdArray, qlens: I64Array, bkeys: U64Array, bsegs: U64Array,
              bfilts: U64Array, dkeys: U64Array, dsegs: U64Array, dfilts: U64Array,
              dorder: I64Array, sb: int, gap: int, cap: int,
              read: Callable[[list[int]], Mapping[int, object]],
              indexed: Callable[[bytes], Sequence[bool]] | None, ks: I64Array, exact: bool,
              kfilter: U64Array | None = ..., cache: SegmentCacheLike | None = ...,
              with_spans: I64Array | None = ...,
              /) -> tuple[bytes, bytearray, bytearray, bytearray, int]: ...
    @property
    def SegmentCache(self) -> type[SegmentCacheLike]: ...
    def salt(self, ids: IdArray, out: IdArray, lo: int, hi: int, /) -> None: ...
    def salt_runs(self, ids: IdArray, out: IdArray, ends: I64Array, salts: U64Array,
                  /) -> None: ...
    def salt_into(self, seqs: Sequence[IdArray], out: IdArray, salts: U64Array,
                  /) -> None: ...
    def merge_order(self, keys: U64Array, old: I64Array, old_keys: U64Array,
                    /) -> tuple[bytes, bytes]: ...


class SegmentCacheLike(Protocol):
    """The decoded-segment cache (sarpd/core/segcache.py's `SegmentCache`)."""

    capacity: int
    trace: list[int] | None
    decoder: Callable[[int, bytes], Segment] | None

    def __init__(self, capacity: int, /) -> None: ...

    def __len__(self) -> int: ...
    def __contains__(self, sid: object, /) -> bool: ...
    def get(self, sid: int, /) -> Segment | None: ...
    def hits(self, sids: Sequence[int], /) -> tuple[dict[int, Segment], list[int]]: ...
    def put_many(self, segs: Mapping[int, Segment], /) -> None: ...
    def put_values(self, sids: Sequence[int], values: Sequence[bytes | None], /
                   ) -> Mapping[int, object]: ...
    def items(self) -> list[tuple[int, Segment]]: ...
    def clear(self) -> None: ...


class WriteKernel(Protocol):
    """sarpd/core/_cwrite.c (references in sarpd.core.segment and sarpd.core.router)."""

    def encode_segment(self, seg_id: int, window: int, presence: int, ns_tag: int,
                       ids: U64Array, meta: U64Array, xmeta: U64Array, xmask: U64Array,
                       /) -> bytes: ...
    def parse_segment(self, value: bytes, /) -> tuple[int, int, int, int, int, int, int] | int: ...
    def block_keys(self, ids: U64Array, /) -> list[bytes]: ...
    def filters(self, ids: U64Array, offsets: Sequence[int], /) -> list[int]: ...
    def encode_delta(self, before: Segment, after: Segment, /) -> bytes: ...
    def drop_windows(self, segs: Sequence[Segment], seg_ends: I64Array, offs: I64Array,
                     ids: IdArray, tgt_ends: I64Array, holder: int | None, /
                     ) -> tuple[list[Change], bytes, bytes]: ...
    def add_holders(self, segs: Sequence[Segment], offs: I64Array, ids: IdArray,
                    metas: U64Array, /) -> tuple[list[Change], bytes]: ...
    def refill_blocks(self, segs: Sequence[Segment], offs: I64Array, ids: IdArray,
                      metas: U64Array, /) -> tuple[list[Change], bytes]: ...


class BlockMapLike(Protocol):
    """What the store asks of a block map (sarpd/core/blockmap.py's `BlockMap`)."""

    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def stats(self) -> dict[str, int]: ...
    def lookup(self, ids: IdArray, /) -> tuple[U64Array, npt.NDArray[Any]]: ...
    def peek(self, ids: IdArray, /) -> tuple[U64Array, npt.NDArray[Any]]: ...
    def add(self, ids: IdArray, heads: U64Array, pos: npt.NDArray[Any], /) -> Spill | None: ...
    def add_bulk(self, ids: IdArray, heads: U64Array, pos: npt.NDArray[Any],
                 /) -> Spill | None: ...
    def discard(self, ids: IdArray, /) -> None: ...
    def clear(self) -> None: ...
    def to_arrays(self) -> MapArrays: ...
    def load_arrays(self, arrays: MapArrays, /) -> Spill | None: ...


class MapKernel(Protocol):
    """sarpd/core/_cmap.c (reference: sarpd.core.blockmap)."""

    @property
    def BlockMap(self) -> Callable[[int, int], BlockMapLike]: ...


class DirectoryLike(Protocol):
    """What the router, the writer and the index ask of a routing directory
    (sarpd/core/directory.py's `Directory`)."""

    @property
    def version(self) -> int: ...
    @property
    def merges(self) -> int: ...
    @property
    def merge_s_max(self) -> float: ...
    @property
    def merge_s_total(self) -> float: ...
    delta_max_entries: int
    @property
    def entries(self) -> int: ...
    @property
    def keys_count(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def probe(self, keys: U64Array, /) -> npt.NDArray[np.bool_]: ...
    def posting(self, key: int, /) -> tuple[U64Array, U64Array]: ...
    def flat(self) -> FlatDirectory: ...
    def count(self, key: int, /) -> int: ...
    def has(self, key: int, seg: int, /) -> bool: ...
    def add(self, key: int, seg: int, filt: int, /) -> None: ...
    def set_filter(self, key: int, seg: int, filt: int, /) -> bool: ...
    def drop(self, key: int, seg: int, /) -> bool: ...
    def needs_merge(self) -> bool: ...
    def merge(self) -> None: ...
    def to_arrays(self) -> DirectoryArrays: ...
    def load_arrays(self, arrays: DirectoryArrays, /) -> None: ...
    def clear(self) -> None: ...
    def iter_entries(self) -> list[tuple[int, int, int]]: ...


class DirKernel(Protocol):
    """sarpd/core/_cdir.c (reference: sarpd.core.directory)."""

    @property
    def Directory(self) -> Callable[[int], DirectoryLike]: ...


@dataclass(frozen=True, slots=True)
class Kernels:
    """Which implementation runs each path, picked once (`pick`) and handed to an
    index: an extension module, or None where the reference runs."""

    verify: VerifyKernel | None
    hash: HashKernel | None
    match: MatchKernel | None
    write: WriteKernel | None
    map: MapKernel | None
    dir: DirKernel | None

    def status(self) -> dict[str, bool]:
        """Per path: whether it runs natively."""
        return {path: getattr(self, path) is not None for path in EXTENSIONS}

    def block_map(self, budget_bytes: int, generation: int) -> BlockMapLike:
        """A new block map: the native one, else the reference (imported here:
        setup.py loads this module alone)."""
        if self.map is not None:
            return self.map.BlockMap(budget_bytes, generation)
        from sarpd.core.blockmap import BlockMap

        return BlockMap(budget_bytes, generation)

    def segment_cache(self, capacity: int) -> SegmentCacheLike:
        """A new decoded-segment cache: the match kernel's (which it reads in C), else
        the reference (imported here, as `block_map`'s)."""
        if self.match is not None:
            return self.match.SegmentCache(capacity)
        from sarpd.core.segcache import SegmentCache

        cache: SegmentCache[Segment] = SegmentCache(capacity)
        return cache

    def directory(self, delta_max_entries: int) -> DirectoryLike:
        """A new routing directory: the native one, else the reference (imported here,
        as `block_map`'s)."""
        if self.dir is not None:
            return self.dir.Directory(delta_max_entries)
        from sarpd.core.directory import Directory

        return Directory(delta_max_entries, self)

    @property
    def name(self) -> str:
        """"native" (every built path native), "reference", or "mixed"."""
        got = set(self.status().values())
        return "mixed" if len(got) > 1 else "native" if got == {True} else "reference"


REFERENCE = Kernels(None, None, None, None, None, None)


def _load(path: str) -> object | None:
    if not ENABLED:
        return None
    try:
        return importlib.import_module(EXTENSIONS[path])
    except ImportError:
        return None


@functools.lru_cache(maxsize=2)
def pick(reference: bool = False) -> Kernels:
    """The kernels of an index: every extension the install built and this process
    loads (missing ones, and all with SARPD_NO_EXTENSIONS=1, run their references),
    or with `reference` every reference. Loaded on first use: an extension's package
    may itself import this module."""
    if reference:
        return REFERENCE
    if TYPE_CHECKING:  # what mypy checks: each module satisfies its protocol
        from sarpd.core import _cdir, _chash, _cmap, _cmatch, _cwrite
        from sarpd.core.verify import _cverify

        return Kernels(_cverify, _chash, _cmatch, _cwrite, _cmap, _cdir)
    return Kernels(_load("verify"), _load("hash"), _load("match"), _load("write"), _load("map"),
                   _load("dir"))


def status() -> dict[str, bool]:
    """Per path: whether `pick()` (what an index built without kernels runs) runs it
    natively."""
    return pick().status()


def _cc() -> list[str]:
    """The C compiler command the install builds with ($CC, as setuptools honours it)."""
    import shlex  # the build-time checks import what they need: a cold start does not
    import sysconfig

    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def compiler() -> str | None:
    """The C compiler the install would build with, if it is here."""
    import shutil

    cc = _cc()
    return shutil.which(cc[0]) if cc else None


XXHASH_PROBE = """#include <xxhash.h>
int main(void) { return (int)(XXH3_128bits("", 0).low64 & 0); }
"""


@functools.lru_cache(maxsize=1)
def xxhash_found() -> bool:
    """Whether the compiler finds libxxhash's header and library (Debian:
    libxxhash-dev): native hashing is built only then. Compiles and links a probe."""
    import subprocess
    import tempfile

    if compiler() is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*_cc(), "-x", "c", "-", "-o", os.path.join(tmp, "probe"), "-lxxhash"]
        try:
            done = subprocess.run(cmd, input=XXHASH_PROBE, capture_output=True, text=True,
                                  timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0


def expected() -> dict[str, bool]:
    """Per path: whether the install should have built (and this process loaded) it."""
    build = ENABLED and compiler() is not None
    return {path: build and (path != "hash" or xxhash_found()) for path in EXTENSIONS}


def summary() -> str:
    """One line for the install's output: which paths run natively, and why not."""

    def why(path: str) -> str:
        if not ENABLED:
            return "SARPD_NO_EXTENSIONS=1"
        if compiler() is None:
            return "no C compiler"
        if path == "hash" and not xxhash_found():
            return "libxxhash not found: apt-get install libxxhash-dev"
        return "built but not loaded: reinstall"

    run = status()
    return "sarp native paths: " + ", ".join(
        f"{p} native" if run[p] else f"{p} reference ({why(p)})" for p in EXTENSIONS)
