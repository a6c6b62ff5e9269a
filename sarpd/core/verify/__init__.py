"""First-mismatch verification of 128-bit block ids.

`first_mismatch(cand, query)` returns the index of the first row where two (n, 2)
uint64 id arrays differ, or n when all n rows agree; `first_mismatch_many` does it for
many pairs in one call (the match path verifies a whole batch at once). The numpy implementation in
`_numpy.py` is the reference; an optional C/AVX2 implementation replaces it when
`sarpd.core.native` (the one place that picks native code) loaded it.
`SARPD_NO_EXTENSIONS=1` forces numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sarpd.core import native
from sarpd.core.verify._numpy import first_mismatch as _np_first_mismatch
from sarpd.core.verify._numpy import first_mismatch_many as _np_first_mismatch_many
from sarpd.model import IdArray

IMPLEMENTATION = "numpy"
# positional arguments only: the C functions take no keywords
first_mismatch: Callable[[IdArray, IdArray], int] = _np_first_mismatch
first_mismatch_many: Callable[[Sequence[IdArray], Sequence[IdArray]], list[int]] = (
    _np_first_mismatch_many
)

_c = native.module("verify")  # built by the install when a C compiler is there (setup.py)
if _c is not None:
    first_mismatch = _c.first_mismatch
    first_mismatch_many = _c.first_mismatch_many
    IMPLEMENTATION = "c"

__all__ = ["IMPLEMENTATION", "first_mismatch", "first_mismatch_many"]
