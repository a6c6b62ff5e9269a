"""First-mismatch verification of 128-bit block ids.

`first_mismatch(cand, query)` returns the index of the first row where two (n, 2)
uint64 id arrays differ, or n when all n rows agree; `first_mismatch_many` does it for
many pairs in one call (the match path verifies a whole batch at once). The numpy
implementation in `_numpy.py` is the reference; an optional C/AVX2 implementation
replaces it where the kernels given have it (`sarpd.core.native.Kernels`, slot
`verify`: an index's own; None: the process default, numpy with
`SARPD_NO_EXTENSIONS=1`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sarpd.core import native
from sarpd.core.native import Kernels
from sarpd.core.verify._numpy import first_mismatch as _np_first_mismatch
from sarpd.core.verify._numpy import first_mismatch_many as _np_first_mismatch_many
from sarpd.model import IdArray


def first_mismatch(cand: IdArray, query: IdArray, k: Kernels | None = None) -> int:
    """The first row where `cand` and `query` differ, or n when all n rows agree."""
    c = (k or native.pick()).verify
    return int(c.first_mismatch(cand, query)) if c is not None else _np_first_mismatch(cand, query)


def first_mismatch_many(cands: Sequence[IdArray], queries: Sequence[IdArray],
                        k: Kernels | None = None) -> list[int]:
    """first_mismatch of every pair, in one call."""
    c = (k or native.pick()).verify
    if c is None:
        return _np_first_mismatch_many(cands, queries)
    return c.first_mismatch_many(cands, queries)


def implementation(k: Kernels | None = None) -> str:
    """Which implementation `k` (None: the process default) runs: "c" (the C/AVX2
    extension) or "numpy"."""
    return "c" if (k or native.pick()).verify is not None else "numpy"


__all__ = ["ManyFn", "first_mismatch", "first_mismatch_many", "implementation",
           "implementations"]

ManyFn = Callable[[Sequence[IdArray], Sequence[IdArray]], list[int]]


def implementations() -> dict[str, ManyFn]:
    """Every `first_mismatch_many` this process can run, by name: "numpy" (the
    reference) and "c" when the extension is loaded (to compare them: the bench)."""
    impls: dict[str, ManyFn] = {"numpy": _np_first_mismatch_many}
    c = native.pick().verify
    if c is not None:
        impls["c"] = c.first_mismatch_many
    return impls
