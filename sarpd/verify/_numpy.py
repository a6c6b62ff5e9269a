"""numpy reference implementation of first-mismatch verification."""

from __future__ import annotations

from sarpd.model import IdArray


def first_mismatch(cand: IdArray, query: IdArray) -> int:
    """Index of the first row where `cand` and `query` differ; min(len) if none."""
    n = min(len(cand), len(query))
    if n == 0:
        return 0
    neq = (cand[:n] != query[:n]).any(axis=1)
    i = int(neq.argmax())
    return i if neq[i] else n
