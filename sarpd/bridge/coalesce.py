"""Requests of one round, in order, and the coalescing of chained stores (sans-I/O).

The bridge turns a round of event batches into one ordered list of `Req` (one sarpd
request each) and `Mark` (the end of a batch: the position may pass it once every
request before it is acknowledged). sarpd applies them in order on one connection.

Coalescing. vLLM stores a sequence a few blocks at a time, each `BlockStored` after
the previous one's last block. `coalesce` folds such a store into the insert of the
earlier one when that changes nothing that any answer of sarpd can show:

- same namespace and same holder word (`meta`), and the store's parent is the open
  run's last block (its tail);
- no request between the run's start and the store names, in that namespace, one of
  the run's blocks or parent (a removal, a branch off the run, the same blocks from
  another tier...): such a request closes the run, and ``clear`` closes every run of
  its namespace;
- no request between them named one of the store's own blocks (moving the store
  earlier would reorder the two), and the store repeats no block of the run;
- the run stays within `MAX_RUN_BLOCKS`; neither is a guessed-namespace insert (it
  may still be re-routed: `alternatives`).

The coalesced insert sits where the run's first store was: every request it moves
ahead of names none of its blocks, and inserts and removals of disjoint blocks
commute (a block's position is fixed by its parent, which the run holds). `parts`
keeps the block count of every store the insert carries, so that an answer counts
one event per store and an ``unknown_parent`` drops exactly the first store (it
carries the run's parent; the rest is re-sent after it, `split_first`), as store by
store would. Namespaces are distinct id spaces (sarpd salts ids with them), so runs
of different namespaces never interact.

With ``removals=True``, removals coalesce the same way: a removal joins the open
removal of its namespace and holder (one ``remove`` with both id lists, at the first
one's place) when no request since the first named one of its ids; a run whose
block it removes ends. The index then answers every match alike, but it is off by
default: sarpd's ``remove`` counts the blocks it takes off by their offset in a
window, so two blocks of sibling branches at one position removed by ONE request
count once (``removed``, and the index's ``blocks`` counter keeps one too many),
and coalescing would make that happen where separate requests count right.

The rule behind both: `touched` keeps, per block, the latest place (in the coalesced
order) of a request naming it, and a request moves to an earlier place only if every
request naming one of its blocks already sits before that place; so two requests
naming a common block keep their order. tests/bridge/test_coalesce.py checks it
against store-by-store application on a real index, on random streams.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
from msgspec.structs import replace as dc_replace

from sarpd.bridge.mapping import CanaryOp, ClearOp, InsertOp, Op, RemoveOp

__all__ = ["MAX_RUN_BLOCKS", "Mark", "Req", "coalesce", "split_first"]

MAX_RUN_BLOCKS = 4096  # blocks of one coalesced insert (sarpd's limit: 65,536 by default)


class Req(msgspec.Struct, frozen=True):
    kind: str | None  # the event counter to bump on success (first op of an event)
    op: Op
    tried: tuple[str, ...] = ()  # namespaces an insert got unknown_parent in
    alternatives: tuple[str, ...] = ()  # other namespaces to try then (Translated)
    # a coalesced insert: the block count of each store it carries, in order (each one
    # event); () for any other request
    parts: tuple[int, ...] = ()
    merged: int = 0  # a coalesced removal: the events it carries (0: not coalesced)

    @property
    def events(self) -> int:
        """Events this request stands for (its counter's increment on success)."""
        return len(self.parts) or self.merged or int(self.kind is not None)


class Mark(msgspec.Struct, frozen=True):
    """End of one batch: the position may advance past it once reached."""

    seq: int
    ts: float


@dataclass(slots=True)
class _Run:
    at: int  # index of its insert in the output
    start: int  # the step at which it started (touches before it do not matter)
    ns: str
    meta: int
    tail: int
    ids: set[int] = field(default_factory=set)  # its blocks and its parent


def split_first(req: Req) -> tuple[int, Req]:
    """A coalesced insert answered ``unknown_parent``: (the first store's block count,
    the insert of the other stores, after the first store's last block)."""
    op = req.op
    assert isinstance(op, InsertOp) and len(req.parts) > 1
    n = req.parts[0]
    rest = req.parts[1:]
    op2 = dc_replace(op, hashes=op.hashes[n:], parent=op.hashes[n - 1])
    return n, Req(req.kind, op2, parts=rest if len(rest) > 1 else ())


class _Coalescer:
    def __init__(self, removals: bool) -> None:
        self.merge_removals = removals
        self.out: list[Req | Mark] = []
        self.runs: dict[tuple[str, int], _Run] = {}  # (ns, tail) -> open run
        self.owner: dict[tuple[str, int], _Run] = {}  # (ns, block) -> its open run
        self.touched: dict[tuple[str, int], int] = {}  # (ns, block) -> last step naming it
        # (ns, holder) -> (index in the output, step) of the open removal
        self.removals: dict[tuple[str, int | None], tuple[int, int]] = {}
        self.step = 0

    def add(self, it: Req | Mark) -> None:
        self.step += 1
        if isinstance(it, Mark):
            self.out.append(it)
            return
        op = it.op
        if isinstance(op, InsertOp) and not it.alternatives and self._join(it, op):
            return
        if isinstance(op, RemoveOp) and self.merge_removals and self._join_removal(it, op):
            return
        if isinstance(op, ClearOp):
            self._close_ns(op.ns)
            for key in [k for k in self.removals if k[0] == op.ns]:
                del self.removals[key]
        elif it.alternatives:  # may land in any namespace: a barrier for every run
            self._close_all()
            self.removals.clear()
        elif isinstance(op, RemoveOp):
            self._touch(op.ns, op.ids)
        elif isinstance(op, InsertOp):
            self._touch(op.ns, op.hashes if op.parent is None else (*op.hashes, op.parent))
        else:
            assert isinstance(op, CanaryOp)  # its own namespace: touches no run's blocks
        self.out.append(it)
        if isinstance(op, InsertOp) and not it.alternatives and it.kind is not None:
            self._open(op)
        elif isinstance(op, RemoveOp) and len(set(op.ids)) == len(op.ids):
            self.removals[(op.ns, op.meta)] = (len(self.out) - 1, self.step)

    def _join_removal(self, it: Req, op: RemoveOp) -> bool:
        """A removal joins the open removal of its namespace and holder when no request
        since named one of its blocks (then the two commute with what lies between)."""
        open_ = self.removals.get((op.ns, op.meta))
        if open_ is None or not op.ids or len(set(op.ids)) != len(op.ids):
            return False
        at, start = open_
        ns, touched = op.ns, self.touched
        if any(touched.get((ns, h), -1) >= start for h in op.ids):
            return False  # named since (or by the open removal itself)
        head = self.out[at]
        assert isinstance(head, Req) and isinstance(head.op, RemoveOp)
        if len(head.op.ids) + len(op.ids) > MAX_RUN_BLOCKS:
            return False
        merged = head.events + int(it.kind is not None)
        self.out[at] = Req(head.kind or it.kind, dc_replace(head.op, ids=head.op.ids + op.ids),
                           merged=merged)  # fmt: skip
        for h in op.ids:
            touched[(ns, h)] = start
            run = self.owner.get((ns, h))
            if run is not None:  # a run whose block it removes takes no more stores
                self._close(run)
        return True

    def _join(self, it: Req, op: InsertOp) -> bool:
        if op.parent is None or not op.hashes or it.kind is None:
            return False
        ns, hs = op.ns, op.hashes
        run = self.runs.get((ns, op.parent))
        if run is None or run.meta != op.meta or len(run.ids) + len(hs) > MAX_RUN_BLOCKS:
            return False
        if len(set(hs)) != len(hs) or not run.ids.isdisjoint(hs):
            return False
        touched = self.touched
        if any(touched.get((ns, h), -1) > run.start for h in hs):
            return False  # named since the run began: the store may not move before it
        head = self.out[run.at]
        assert isinstance(head, Req) and isinstance(head.op, InsertOp)
        parts = head.parts or (len(head.op.hashes),)
        self.out[run.at] = Req(head.kind, dc_replace(head.op, hashes=head.op.hashes + hs),
                               parts=(*parts, len(hs)))  # fmt: skip
        del self.runs[(ns, run.tail)]
        for h in hs:  # now named at the run's place: other runs holding them end
            other = self.owner.get((ns, h))
            if other is not None:
                self._close(other)
            touched[(ns, h)] = max(touched.get((ns, h), -1), run.start)
            self.owner[(ns, h)] = run
        run.tail = hs[-1]
        run.ids.update(hs)
        self.runs[(ns, run.tail)] = run
        return True

    def _open(self, op: InsertOp) -> None:
        hs = op.hashes
        if not hs or len(set(hs)) != len(hs):
            return
        run = _Run(len(self.out) - 1, self.step, op.ns, op.meta, hs[-1], set(hs))
        if op.parent is not None:
            run.ids.add(op.parent)
        self.runs[(op.ns, run.tail)] = run
        for h in run.ids:
            self.owner[(op.ns, h)] = run

    def _touch(self, ns: str, ids: Sequence[int]) -> None:
        """A request (at this step) names `ids`: runs holding one of them end."""
        step, touched, owner = self.step, self.touched, self.owner
        for h in ids:
            touched[(ns, h)] = step
            run = owner.get((ns, h))
            if run is not None:
                self._close(run)

    def _close(self, run: _Run) -> None:
        if self.runs.get((run.ns, run.tail)) is run:
            del self.runs[(run.ns, run.tail)]
        for h in run.ids:
            if self.owner.get((run.ns, h)) is run:
                del self.owner[(run.ns, h)]

    def _close_ns(self, ns: str) -> None:
        for run in [r for r in self.runs.values() if r.ns == ns]:
            self._close(run)

    def _close_all(self) -> None:
        for run in list(self.runs.values()):
            self._close(run)


def coalesce(items: Sequence[Req | Mark], removals: bool = False) -> list[Req | Mark]:
    """`items` with chained stores folded into earlier inserts (and with `removals`,
    removals into earlier ones: off by default, module doc)."""
    c = _Coalescer(removals)
    for it in items:
        c.add(it)
    return c.out
