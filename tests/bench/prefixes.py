"""Prefix relations of id arrays, shared by the workload, trace and chain tests."""

from __future__ import annotations

import numpy as np

from tools.bench.api import Ids


def is_prefix(a: Ids, b: Ids) -> bool:
    return len(a) <= len(b) and bool((b[: len(a)] == a).all())


def common_prefix(a: Ids, b: Ids) -> int:
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m
