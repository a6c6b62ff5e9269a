"""numpy reference implementation of first-mismatch verification."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sarpd.model import IdArray


def first_mismatch(cand: IdArray, query: IdArray) -> int:
    """Index of the first row where `cand` and `query` differ; min(len) if none."""
    n = min(len(cand), len(query))
    if n == 0:
        return 0
    neq = (cand[:n] != query[:n]).any(axis=1)
    i = int(neq.argmax())
    return i if neq[i] else n


def first_mismatch_many(cands: Sequence[IdArray], queries: Sequence[IdArray]) -> list[int]:
    """`first_mismatch` of each (candidate, query) pair, in one vectorised comparison."""
    m = len(cands)
    if m == 0:
        return []
    lens = [min(len(c), len(q)) for c, q in zip(cands, queries, strict=True)]
    width = max(lens)
    if width == 0:
        return [0] * m
    a = np.zeros((m, width, 2), dtype=np.uint64)
    b = np.zeros((m, width, 2), dtype=np.uint64)
    for i, (c, q, n) in enumerate(zip(cands, queries, lens, strict=True)):
        a[i, :n] = c[:n]
        b[i, :n] = q[:n]
    neq = (a != b).any(axis=2)
    first = np.where(neq.any(axis=1), neq.argmax(axis=1), width)
    return np.minimum(first, np.array(lens)).tolist()  # type: ignore[no-any-return]
