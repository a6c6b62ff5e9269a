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
store would; a ``too_large`` (a limit of sarpd's, ids per request or holders per
block, that the stores alone may not pass) re-sends its stores one by one
(`split_all`). Namespaces are distinct id spaces (sarpd salts ids with them), so runs
of different namespaces never interact.

With ``removals=True`` (the default), removals coalesce the same way: a removal joins
the open removal of its namespace and holder (one ``remove`` with both id lists, at
the first one's place) when no request since the first named one of its ids; a run
whose block it removes ends. sarpd counts a removal's blocks by (offset, id), so two
blocks of sibling branches at one position removed by ONE request count twice, as
two requests would (it counted them once by offset until it was fixed; the property
test below compares the counts too).

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

from sarpd.events.mapping import CanaryOp, ClearOp, InsertOp, Op, RemoveOp

__all__ = ["MAX_RUN_BLOCKS", "Mark", "Req", "coalesce", "split_all", "split_first"]

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
    """An open run of chained stores: its insert sits at `at` in the output."""

    at: int
    start: int  # the step at which it started (touches before it do not matter)
    meta: int
    tail: int
    ids: set[int]  # its blocks and its parent
    hashes: list[int]  # its blocks, in order
    parts: list[int]  # blocks per store


@dataclass(slots=True)
class _Removal:
    """An open removal (with ``removals=True``): its request sits at `at`."""

    at: int
    start: int
    kind: str | None
    events: int
    ids: list[int]
    joined: bool = False


@dataclass(slots=True)
class _Space:
    """One namespace's state (namespaces are distinct id spaces)."""

    runs: dict[int, _Run] = field(default_factory=dict)  # tail -> open run
    owner: dict[int, _Run] = field(default_factory=dict)  # block -> its open run
    touched: dict[int, int] = field(default_factory=dict)  # block -> last place naming it
    removals: dict[int | None, _Removal] = field(default_factory=dict)  # holder -> open


def split_first(req: Req) -> tuple[int, Req]:
    """A coalesced insert answered ``unknown_parent``: (the first store's block count,
    the insert of the other stores, after the first store's last block)."""
    op = req.op
    assert isinstance(op, InsertOp) and len(req.parts) > 1
    n = req.parts[0]
    rest = req.parts[1:]
    op2 = dc_replace(op, hashes=op.hashes[n:], parent=op.hashes[n - 1])
    return n, Req(req.kind, op2, parts=rest if len(rest) > 1 else ())


def split_all(req: Req) -> list[Req]:
    """A coalesced insert answered ``too_large`` (a limit of sarpd's: ids per request,
    holders per block): its stores, one request each, as they were."""
    op = req.op
    assert isinstance(op, InsertOp) and len(req.parts) > 1
    out, at, parent = [], 0, op.parent
    for n in req.parts:
        hs = op.hashes[at : at + n]
        out.append(Req(req.kind, dc_replace(op, hashes=hs, parent=parent)))
        at, parent = at + n, hs[-1]
    return out


class _Coalescer:
    def __init__(self, removals: bool) -> None:
        self.merge_removals = removals
        self.out: list[Req | Mark] = []
        self.spaces: dict[str, _Space] = {}
        self.all_runs: list[_Run] = []
        self.all_removals: list[_Removal] = []
        self.step = 0

    def space(self, ns: str) -> _Space:
        sp = self.spaces.get(ns)
        if sp is None:
            sp = self.spaces[ns] = _Space()
        return sp

    def add(self, it: Req | Mark) -> None:
        self.step += 1
        if isinstance(it, Mark):
            self.out.append(it)
            return
        op = it.op
        if isinstance(op, InsertOp) and not it.alternatives and self._join(
                self.space(op.ns), it, op):
            return
        if isinstance(op, RemoveOp) and self.merge_removals and self._join_removal(
                self.space(op.ns), it, op):
            return
        if isinstance(op, ClearOp):  # every block of the namespace: its runs all end
            self.spaces.pop(op.ns, None)
        elif it.alternatives:  # may land in any namespace: a barrier for every run
            self.spaces.clear()
        elif isinstance(op, RemoveOp):
            self._touch(self.space(op.ns), op.ids)
        elif isinstance(op, InsertOp):
            sp = self.space(op.ns)
            self._touch(sp, op.hashes)
            if op.parent is not None:
                self._touch(sp, (op.parent,))
        else:
            assert isinstance(op, CanaryOp)  # its own namespace: touches no run's blocks
        self.out.append(it)
        if isinstance(op, InsertOp) and not it.alternatives and it.kind is not None:
            self._open(self.space(op.ns), op)
        elif isinstance(op, RemoveOp) and self.merge_removals and len(set(op.ids)) == len(op.ids):
            r = _Removal(len(self.out) - 1, self.step, it.kind, int(it.kind is not None),
                         list(op.ids))  # fmt: skip
            self.space(op.ns).removals[op.meta] = r
            self.all_removals.append(r)

    def _join_removal(self, sp: _Space, it: Req, op: RemoveOp) -> bool:
        """A removal joins the open removal of its namespace and holder when no request
        since named one of its blocks (then the two commute with what lies between)."""
        r = sp.removals.get(op.meta)
        ids = op.ids
        if r is None or not ids or len(set(ids)) != len(ids):
            return False
        if len(r.ids) + len(ids) > MAX_RUN_BLOCKS:
            return False
        touched, start = sp.touched, r.start
        for h in ids:
            if touched.get(h, -1) >= start:
                return False  # named since (or by the open removal itself)
        r.ids.extend(ids)
        r.events += it.kind is not None
        r.kind = r.kind or it.kind
        r.joined = True
        for h in ids:
            touched[h] = start
            run = sp.owner.get(h)
            if run is not None:  # a run whose block it removes takes no more stores
                self._close(sp, run)
        return True

    def _join(self, sp: _Space, it: Req, op: InsertOp) -> bool:
        hs = op.hashes
        if op.parent is None or not hs or it.kind is None:
            return False
        run = sp.runs.get(op.parent)
        if run is None or run.meta != op.meta or len(run.hashes) + len(hs) > MAX_RUN_BLOCKS:
            return False
        if len(set(hs)) != len(hs) or not run.ids.isdisjoint(hs):
            return False
        touched, start = sp.touched, run.start
        for h in hs:
            if touched.get(h, -1) > start:
                return False  # named since the run began: the store may not move before it
        del sp.runs[run.tail]
        owner = sp.owner
        for h in hs:  # now named at the run's place: other runs holding them end
            other = owner.get(h)
            if other is not None:
                self._close(sp, other)
            if touched.get(h, -1) < start:
                touched[h] = start
            owner[h] = run
        run.tail = hs[-1]
        run.ids.update(hs)
        run.hashes.extend(hs)
        run.parts.append(len(hs))
        sp.runs[run.tail] = run
        return True

    def _open(self, sp: _Space, op: InsertOp) -> None:
        hs = op.hashes
        if not hs or len(set(hs)) != len(hs):
            return
        ids = set(hs)
        if op.parent is not None:
            ids.add(op.parent)
        run = _Run(len(self.out) - 1, self.step, op.meta, hs[-1], ids, list(hs), [len(hs)])
        sp.runs[run.tail] = run
        for h in ids:
            sp.owner[h] = run
        self.all_runs.append(run)

    def _touch(self, sp: _Space, ids: Sequence[int]) -> None:
        """A request (at this step) names `ids`: runs holding one of them end."""
        step, touched, owner = self.step, sp.touched, sp.owner
        for h in ids:
            touched[h] = step
            run = owner.get(h)
            if run is not None:
                self._close(sp, run)

    @staticmethod
    def _close(sp: _Space, run: _Run) -> None:
        if sp.runs.get(run.tail) is run:
            del sp.runs[run.tail]
        owner = sp.owner
        for h in run.ids:
            if owner.get(h) is run:
                del owner[h]

    def result(self) -> list[Req | Mark]:
        """The output, each run's and removal's request built once, at its place."""
        out = self.out
        for run in self.all_runs:
            if len(run.parts) > 1:
                head = out[run.at]
                assert isinstance(head, Req)
                out[run.at] = Req(head.kind, dc_replace(head.op, hashes=tuple(run.hashes)),
                                  parts=tuple(run.parts))  # fmt: skip
        for r in self.all_removals:
            if r.joined:
                head = out[r.at]
                assert isinstance(head, Req)
                out[r.at] = Req(r.kind, dc_replace(head.op, ids=tuple(r.ids)), merged=r.events)
        return out


def coalesce(items: Sequence[Req | Mark], removals: bool = True) -> list[Req | Mark]:
    """`items` with chained stores folded into earlier inserts and, with `removals`
    (the default), removals into earlier ones (module doc)."""
    c = _Coalescer(removals)
    for it in items:
        c.add(it)
    return c.result()
