"""An engine's batch sequence numbers, as a subscriber takes them (sans-I/O): THE rule
the bridge (`sarpctl bridge vllm`) and the daemon's listeners (the indexer API) share.

vLLM numbers its batches from 0 on the PUB socket and keeps the last ones for a
replay ROUTER. A subscriber holds its watermark (`last`: the newest batch taken; None
before the first) and the window of its last replay (`replayed`), and asks `verdict`
of each live message:

- ``take``: the next one (or the first: 0);
- ``gap``: past the next: replay from `expected` first (the first message after a
  late subscription counts from 0), then take it unless the replay brought it;
- ``duplicate``: at or below the watermark and inside the last replay's window: a
  live copy of a batch the replay already took;
- ``restart``: at or below the watermark otherwise: the engine restarted (its
  numbering went back): its blocks are cleared, `restarted`, and the new stream is
  taken (replayed from 0 where it can be).

`taken(seq)` moves the watermark and says how many batches were lost before it
(neither sent nor replayed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Stream", "Verdict"]

Verdict = Literal["take", "gap", "duplicate", "restart"]


@dataclass
class Stream:
    last: int | None = None  # the newest batch taken (None: none yet)
    replayed: tuple[int, int] | None = None  # the batches the last replay took

    @property
    def expected(self) -> int:
        return 0 if self.last is None else self.last + 1

    def verdict(self, seq: int) -> Verdict:
        last = self.last
        if last is not None and seq <= last:
            window = self.replayed
            if window is not None and window[0] <= seq <= window[1]:
                return "duplicate"
            return "restart"
        return "gap" if seq > self.expected else "take"

    def seen(self, seq: int) -> bool:
        """Whether `seq` was taken already (after a replay: the live copy is late)."""
        return self.last is not None and seq <= self.last

    def restarted(self) -> None:
        self.last = self.replayed = None

    def taken(self, seq: int) -> int:
        """Move the watermark to `seq`; the batches lost before it."""
        lost = max(0, seq - self.expected)
        self.last = seq
        if self.replayed is not None and seq > self.replayed[1]:
            self.replayed = None  # past the replay: nothing older can be a duplicate
        return lost

    def replay_done(self, first: int | None) -> None:
        """A replay took batches `first`..`last` (None: it took none)."""
        if first is not None and self.last is not None:
            self.replayed = (first, self.last)
