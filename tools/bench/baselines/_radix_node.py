"""Segment-Radix's resident node, its memory cost, and path verification.

Costs are what CPython allocates (sys.getsizeof): the slotted node object, its int
fields (ints <= 256 are shared singletons and cost nothing), its eviction-heap tuple
and list slot, and the growth of its parent's children dict. A bulk load computes the
same quantities for a whole snapshot with numpy.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from tools.bench.baselines._common import (
    U64,
    BaselineError,
    first_miss,
    run_length,
    unpack_u64,
)

SHORT_PATH = 3  # paths up to this many nodes are verified node by node
HEAP_ENTRY = sys.getsizeof((0, 0, None)) + 8  # the heap's tuple and its list slot
FIELDS = ("id", "pid", "first", "s", "e", "last")  # a node's int fields (snapshot columns)


class Node:
    """A segment: blocks [s, e) of one sequence inside one window. `first` / `last`
    are the ids of its first and last block; `pid` its parent's node id. Resident
    nodes hold their resident children by first id; `complete` says all are there."""


    __slots__ = ("children", "complete", "e", "first", "id", "keys", "kids", "last", "pid",
                 "resident", "s", "up")

    def __init__(self, nid: int, pid: int, first: int, s: int, e: int, last: int) -> None:
        self.id, self.pid, self.first, self.s, self.e, self.last = nid, pid, first, s, e, last
        self.up: Node | None = None
        self.children: dict[int, Node] | None = None
        self.complete = True  # every child is resident (meaningful when resident)
        self.resident = False
        self.keys: U64 | None = None  # sorted child first ids (SORTED_FROM+ children)
        self.kids: list[Node] | None = None


NODE_OBJ = sys.getsizeof(Node(0, 0, 0, 0, 0, 0))


def int_sizes(a: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """sys.getsizeof of each value as a Python int; 0 for CPython's shared ints <= 256."""
    a = a.astype(np.uint64, copy=False)
    out: npt.NDArray[np.int64] = np.select(
        [a <= 256, a < 1 << 30, a < 1 << 60], [0, 28, 32], 36).astype(np.int64)
    return out


_DICT_SIZES: list[int] = [0]  # sys.getsizeof of a dict of i int keys (0: no dict)


def dict_growth(pids: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Per row, the bytes its parent's children dict grows by when the row is added
    (rows in order: the j-th child of a parent adds size(j+1) - size(j))."""
    n = len(pids)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(pids, kind="stable")
    sp = pids[order]
    starts = np.concatenate([[0], np.flatnonzero(sp[1:] != sp[:-1]) + 1])
    rank_sorted = np.arange(n) - np.repeat(starts, np.diff(np.append(starts, n)))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = rank_sorted
    most = int(rank_sorted.max()) + 1
    if len(_DICT_SIZES) <= most:
        d = {i: None for i in range(len(_DICT_SIZES) - 1)}
        while len(_DICT_SIZES) <= most:
            d[len(d)] = None
            _DICT_SIZES.append(sys.getsizeof(d))
    sizes = np.array(_DICT_SIZES, dtype=np.int64)
    out: npt.NDArray[np.int64] = sizes[rank + 1] - sizes[rank]
    return out


def node_cost(node: Node) -> int:
    """Bytes a resident node adds besides its parent's dict growth: the slotted object,
    its int fields (CPython shares those <= 256) and its eviction-heap entry."""
    ints = (node.id, node.pid, node.first, node.s, node.e, node.last)
    return NODE_OBJ + HEAP_ENTRY + sum(sys.getsizeof(v) for v in ints if v > 256)


@dataclass(slots=True)
class Walk:
    path: list[tuple[Node, int | None]]  # node, blocks claimed (None: verify to find)
    m: int = 0
    parts: list[U64] | None = None
    last_payload: U64 | None = None


def verify_path(q: U64, path: list[tuple[Node, int | None]],
                vs: list[bytes | None]) -> Walk:
    """Verify a query's path against its nodes' payloads (`vs`, in order): the
    matched blocks and their metas, all nodes in one numpy gather. The path is
    contiguous from block 0; every node but the last agrees on all it claims."""
    walk = Walk(path, parts=[])
    if not path:
        return walk
    if (miss := first_miss(vs)) < len(vs):
        raise BaselineError(f"segment-radix: payload of node {path[miss][0].id} is missing")
    values = cast("list[bytes]", vs)
    if len(path) <= SHORT_PATH:
        return _verify_short(q, walk, values)
    lens = np.array([len(v) for v in values], dtype=np.int64) // 16
    spans = np.array([(node.s, node.e) for node, _ in path], dtype=np.int64)
    wants = np.array([min(node.e, len(q)) - node.s if c is None else c
                      for node, c in path], dtype=np.int64)
    ends = np.cumsum(wants)
    if (lens != spans[:, 1] - spans[:, 0]).any() or (spans[:, 0] != ends - wants).any():
        raise BaselineError("segment-radix: a node's payload or position disagrees "
                            "with its edge")
    buf = unpack_u64(b"".join(values))
    base = np.repeat(np.cumsum(2 * lens) - 2 * lens, wants)
    idx = base + np.arange(int(ends[-1])) - np.repeat(ends - wants, wants)
    run = run_length(buf[idx], q[: int(ends[-1])])
    partial = path[-1][1] is None  # the match ends inside the last node, at >= 1 block
    claimed = int(ends[-1]) - (int(wants[-1]) if partial else 0)
    if run < claimed or (partial and run == claimed):
        raise BaselineError("segment-radix: a node disagrees with its key (a 64-bit id "
                            "collision)")
    walk.parts = [buf[idx[:run] + np.repeat(lens, wants)[:run]]]
    walk.m = run
    walk.last_payload = unpack_u64(values[-1])
    return walk


def _verify_short(q: U64, walk: Walk, values: list[bytes]) -> Walk:
    """verify_path node by node: fewer numpy calls for a path of a few nodes."""
    assert walk.parts is not None
    for i, ((node, claim), v) in enumerate(zip(walk.path, values, strict=True)):
        seg = unpack_u64(v)
        length = len(seg) // 2
        if length != node.e - node.s or node.s != walk.m:
            raise BaselineError(f"segment-radix: node {node.id}'s payload or position "
                                "disagrees with its edge")
        want = claim if claim is not None else min(node.e, len(q)) - node.s
        run = run_length(seg[:want], q[node.s: node.s + want])
        walk.parts.append(seg[length: length + run])
        walk.m, walk.last_payload = node.s + run, seg
        if run < want and (claim is not None or run == 0 or i < len(walk.path) - 1):
            raise BaselineError(f"segment-radix: node {node.id} disagrees with its key "
                                "(a 64-bit id collision)")
    return walk

