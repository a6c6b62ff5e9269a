"""Bound-and-verify: how the candidates of one query window are read, in rounds.

A window's candidates are the segments listed under its deepest routing point. Each
carries a bound taken from its fingerprints (`routing.bounds`): the most blocks from
the window start it can match, safe because a fingerprint that differs proves the ids
differ. The first round reads the `window_cap` strongest (most agreement, then
newest: the paper's capped matching). With exact matching, a window whose best
verified run is short of the query's end and short of an unread candidate's bound
reads another round: the strongest unread candidates whose bound exceeds that run,
twice as many as the round before, until no bound exceeds it. The answer is then the
exact index's: every candidate left unread provably matches no further.

The first round is the router's ranking (cached, or the match kernel's); the
candidates after it and their bounds are computed only when a window needs another
round, from the posting list the plan holds (`posting`: the arrays themselves, or a
view of the directory's flat arrays built on demand, for a batch's own use; nothing
is cached). Two cheap proofs come
first: the first round is the top by agreement, so a run that reaches the weakest
first-round bound is settled (`first_bound`); and where the index keeps block
locators, a window whose next block has no locator is settled by that one point read
(no segment holds the block: the index does this, `SarpIndex._exact_rounds`). On a hot
prefix shared by thousands of segments, where 1 in 15 of them ties with any query on
a 4-bit fingerprint, that read replaces hundreds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sarpd.core.routing import bounds, filter_at, fingerprints
from sarpd.model import IdArray, U64Array


@dataclass(slots=True, eq=False)
class WindowPlan:
    """One window of one query: its candidates, what was read, the best run so far."""

    window: int
    length: int  # the query's blocks in this window
    offset: int  # the routing point the candidates are listed under
    first: list[int]  # the first round, strongest first (the router's ranking)
    count: int  # the candidates under the point
    posting: Callable[[], tuple[U64Array, U64Array]]  # every one of them and its filter
    qw: IdArray  # the query's ids from the window start (its filter: only when needed)
    sb: int  # blocks per window
    chunk: int  # the size of the next extra round (doubles each round)
    # the bound of the weakest first-round candidate: no unread one has a higher bound
    # (the first round is the top by agreement), so a run that reaches it is settled
    first_bound: int = 0
    best: int = 0  # the longest verified run from the window start
    best_sid: int = 0  # the candidate that has it (0: none)
    rounds: int = 1
    settled: bool = False  # no unread candidate can beat `best`
    checked_at: int = -1  # the run at which the next block was looked up (locators)
    _rest: U64Array | None = None  # candidates not in the first round (built on demand)
    _bounds: npt.NDArray[np.int64] | None = None
    _taken: npt.NDArray[np.bool_] | None = None

    def offer(self, sid: int, run: int) -> None:
        """A verified run of a candidate; the first of equal runs is kept."""
        if run > self.best:
            self.best, self.best_sid = run, sid

    def open(self, floor: int) -> bool:
        """Whether an unread candidate may still beat `floor` (cheap: no bound of the
        unread ones is computed)."""
        return (not self.settled and floor < self.length
                and self.count > len(self.first) and self.first_bound > floor)

    def settle(self) -> None:
        """Proved elsewhere that no candidate beats `best` (e.g. the next block is not
        indexed anywhere)."""
        self.settled = True

    def more(self, floor: int) -> list[int]:
        """The next round: the strongest unread candidates whose bound exceeds `floor`
        (at most `chunk` of them); [] when none can beat it (the plan is then settled)."""
        if not self.open(floor):
            return []
        if self._rest is None:
            segs, filts = self.posting()
            keep = ~np.isin(segs, np.array(self.first, dtype=np.uint64))
            self._rest = segs[keep]
            qfilt = filter_at(fingerprints(self.qw, self.sb), self.offset)
            self._bounds = bounds(filts[keep], qfilt, self.offset, self.length)
            self._taken = np.zeros(self._rest.size, dtype=bool)
        assert self._bounds is not None and self._taken is not None
        idx = np.flatnonzero((self._bounds > floor) & ~self._taken)
        if not idx.size:
            self.settled = True
            return []
        score = (self._bounds[idx].astype(np.uint64) << np.uint64(56)) | self._rest[idx]
        if idx.size > self.chunk:
            part = np.argpartition(score, idx.size - self.chunk)[idx.size - self.chunk :]
            idx, score = idx[part], score[part]
        idx = idx[np.argsort(score)[::-1]]
        self._taken[idx] = True
        self.chunk *= 2
        self.rounds += 1
        return [int(s) for s in self._rest[idx]]


def held(segs: U64Array, filts: U64Array) -> Callable[[], tuple[U64Array, U64Array]]:
    """A plan's `posting` for arrays already in hand."""
    return lambda: (segs, filts)
