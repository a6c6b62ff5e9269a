"""Branchy workloads: sessions that branch from inside earlier ones (issue 12).

Where a capped matcher loses reuse: many segments share a window's prefix and tie on
their fingerprints. These generators make that the normal case, as chat and agent
traffic does on a few hot system prompts:

| name          | what branches                                                          |
|---------------|------------------------------------------------------------------------|
| branchy       | a pool of conversations: a request continues one (55 %), branches from |
|               | inside one at any block (35 %; a third of the branch points become hot |
|               | and gather siblings by the dozen) or starts a new one (10 %)           |
| mixed         | the three below, mixed                                                 |
| retries       | many siblings of one parent: a turn regenerated 4-16 times (retry,     |
|               | "regenerate", best-of-n sampling), each sibling a few blocks of its own |
|               | (half the time at a popular branch point, which gathers dozens)        |
| tree-search   | an agent's tree search: from a node inside a session, 2-6 children,    |
|               | each explored a few turns deep, then children of those                 |
| edits         | a message edited: the session goes on from a cut 1-6 blocks back       |

Branch sessions are bounded (`BRANCHES_PER_SESSION` per session started), so a
workload's size is linear in its scale. Every session starts on one of three shared
templates (system prompt + tool
schema, 40-150 blocks, the first 32 common to all three) followed by a task of 2-20
blocks, and runs 4-16 turns of 1-40 blocks. A branch is a session of its own (a new
`Turn.session`) whose first turn matches the prefix it branches from plus its new
input. Cuts fall anywhere, inside 64-block windows included (where the paper's
segment copies share a head). Sessions advance round-robin over `active` sessions, as
the synthetic workloads do.

Sequences are block contents (uint64 per block); ids are `chains.chain_ids` of the
whole sequence from one root per workload, so sequences that share a content prefix
share their ids there and nothing after it. Deterministic for a given seed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tools.bench.api import Ids, Turn, Workload
from tools.bench.chains import chain_ids, root_state

Content = npt.NDArray[np.uint64]

KINDS = ("retries", "tree-search", "edits")
BRANCHES_PER_SESSION = 4  # branch sessions at most, per session started


@dataclass(frozen=True, slots=True)
class BranchShape:
    sessions: int  # sessions at scale 1 (branches come on top)
    active: int  # sessions advancing round-robin at once
    kinds: tuple[str, ...]  # which branch kinds this workload makes
    branch_p: float = 0.35  # chance that a turn also branches


SHAPES: dict[str, BranchShape] = {
    "branchy": BranchShape(2000, 0, ()),  # requests, not sessions: see pool_turns
    "mixed": BranchShape(48, 12, KINDS),
    "retries": BranchShape(48, 12, ("retries",)),
    "tree-search": BranchShape(32, 8, ("tree-search",)),
    "edits": BranchShape(48, 12, ("edits",)),
}


@dataclass(slots=True)
class _Session:
    sid: int
    content: Content  # the accumulated history
    turns_left: int
    pending: list[Content] = field(default_factory=list)  # first turns queued (branches)


class _Gen:
    """The generator's state: one random stream, the templates, the sessions."""

    def __init__(self, shape: BranchShape, scale: int, seed: int) -> None:
        self.shape, self.rng = shape, np.random.default_rng([seed, 0x62726E6368])
        common = self.blocks(32)
        self.templates = [np.concatenate([common, self.blocks(int(self.rng.integers(8, 119)))])
                          for _ in range(3)]
        self.to_start = shape.sessions * scale
        self.branch_budget = BRANCHES_PER_SESSION * shape.sessions * scale
        self.hot: list[Content] = []  # popular branch points: retried and explored again
        self.next_sid = 0

    def blocks(self, n: int) -> Content:
        return self.rng.integers(1, 2**63, n, dtype=np.uint64)

    def new_session(self, content: Content) -> _Session:
        self.next_sid += 1
        return _Session(self.next_sid - 1, content, int(self.rng.integers(4, 17)))

    def fresh(self) -> _Session:
        self.to_start -= 1
        t = self.templates[int(self.rng.integers(0, 3))]
        return self.new_session(np.concatenate([t, self.blocks(int(self.rng.integers(2, 21)))]))

    def pick_hot(self, node: Content) -> Content:
        """A popular branch point half the time (it gathers siblings by the dozen, as a
        shared prompt retried by many users does), else `node`, which may become one."""
        if self.hot and self.rng.random() < 0.5:
            return self.hot[int(self.rng.integers(0, len(self.hot)))]
        if self.rng.random() < 0.2:
            self.hot.append(node)
        return node

    def branches(self, s: _Session, sessions: list[_Session]) -> list[_Session]:
        """The branches a turn of `s` makes (often none)."""
        if self.branch_budget <= 0 or self.rng.random() >= self.shape.branch_p:
            return []
        kind = self.shape.kinds[int(self.rng.integers(0, len(self.shape.kinds)))]
        n = len(s.content)
        if kind == "retries":  # siblings of one turn (often a popular one), a turn or two each
            base = self.pick_hot(s.content)
            out = [self.new_session(np.concatenate([base, self.blocks(
                int(self.rng.integers(1, 4)))])) for _ in range(int(self.rng.integers(4, 17)))]
            for kid in out:
                kid.turns_left = int(self.rng.integers(1, 3))
            self.branch_budget -= len(out)
            return out
        if kind == "edits":  # the session goes on from an edited message
            cut = max(1, n - int(self.rng.integers(1, 7)))
            self.branch_budget -= 1
            return [self.new_session(np.concatenate([s.content[:cut], self.blocks(
                int(self.rng.integers(1, 9)))]))]
        # tree search: children of a node anywhere in some session's history
        src = sessions[int(self.rng.integers(0, len(sessions)))] if sessions else s
        node = self.pick_hot(src.content[: int(self.rng.integers(1, len(src.content) + 1))])
        kids = []
        for _ in range(int(self.rng.integers(2, 7))):
            kid = self.new_session(np.concatenate([node, self.blocks(
                int(self.rng.integers(1, 12)))]))
            kid.turns_left = int(self.rng.integers(1, 5))
            kids.append(kid)
        self.branch_budget -= len(kids)
        return kids


@dataclass(slots=True)
class BranchyWorkload:
    """A branchy workload (`SHAPES[name]`) with `scale` times its sessions."""

    name: str
    scale: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in SHAPES:
            raise ValueError(f"unknown branchy workload {self.name!r}; known: "
                             f"{', '.join(SHAPES)}")
        if self.scale < 1 or self.seed < 0:
            raise ValueError(f"workload {self.name}: scale must be >= 1 and seed >= 0, "
                             f"got {self.scale}, {self.seed}")

    def describe(self) -> str:
        s = SHAPES[self.name]
        if not s.kinds:
            return (f"{self.name}: {s.sessions * self.scale:,} requests over a pool of "
                    "conversations on 3 templates of 10-150 blocks: 55 % continue one by "
                    "1-40 blocks, 35 % branch from inside one at any block (hot branch "
                    "points gather siblings), 10 % start one; "
                    f"scale {self.scale}, seed {self.seed}")
        return (f"{self.name}: {s.sessions * self.scale:,} sessions ({s.active} active) on 3 "
                f"templates of 40-150 blocks (32 common), 4-16 turns of 1-40 blocks; a turn "
                f"branches with p={s.branch_p} ({', '.join(s.kinds)}); branches are sessions "
                f"of their own; scale {self.scale}, seed {self.seed}")

    def turns(self) -> Iterator[Turn]:
        if not SHAPES[self.name].kinds:
            yield from pool_turns(SHAPES[self.name].sessions * self.scale, self.seed)
            return
        g = _Gen(SHAPES[self.name], self.scale, self.seed)
        root = root_state(0x62726E, self.seed)
        active: list[_Session] = []
        queued: list[_Session] = []  # branches wait for a free slot
        while active or queued or g.to_start:
            while len(active) < g.shape.active and (queued or g.to_start):
                active.append(queued.pop(0) if queued else g.fresh())
            nxt: list[_Session] = []
            for s in active:
                turn_in = g.blocks(int(g.rng.integers(1, 41)))
                prompt = np.concatenate([s.content, turn_in])
                ids: Ids = chain_ids(prompt, root)
                yield Turn(session=s.sid, ns="", prompt=ids, sequence=ids)
                s.content, s.turns_left = prompt, s.turns_left - 1
                queued.extend(g.branches(s, active))
                if s.turns_left > 0:
                    nxt.append(s)
            active = nxt


def pool_turns(requests: int, seed: int) -> Iterator[Turn]:
    """`branchy`: every request picks a conversation of the pool (see the module doc)."""
    rng = np.random.default_rng([seed, 0x706F6F6C])
    root = root_state(0x706F6F6C, seed)

    def blocks(lo: int, hi: int) -> Content:
        return rng.integers(1, 2**63, int(rng.integers(lo, hi + 1)), dtype=np.uint64)

    templates = [blocks(10, 150) for _ in range(3)]
    pool: list[Content] = []
    hot: list[Content] = []
    for _ in range(requests):
        r = rng.random()
        if not pool or r < 0.10:
            seq = np.concatenate([templates[int(rng.integers(0, 3))], blocks(1, 40)])
            pool.append(seq)
            i = len(pool) - 1
        elif r < 0.45:
            src = (hot[int(rng.integers(0, len(hot)))] if hot and rng.random() < 0.25
                   else pool[int(rng.integers(0, len(pool)))])
            head = src[: int(rng.integers(1, len(src) + 1))]
            if rng.random() < 0.3:
                hot.append(head)
            pool.append(np.concatenate([head, blocks(1, 30)]))
            i = len(pool) - 1
        else:
            i = int(rng.integers(0, len(pool)))
            pool[i] = np.concatenate([pool[i], blocks(1, 40)])
        ids: Ids = chain_ids(pool[i], root)
        yield Turn(session=i, ns="", prompt=ids, sequence=ids)


def factories() -> dict[str, Callable[[int, int], Workload]]:
    """The branchy workloads, for the registry in tools.bench.workloads."""
    def make(name: str) -> Callable[[int, int], Workload]:
        def build(scale: int = 1, seed: int = 0) -> Workload:
            return BranchyWorkload(name, scale, seed)
        return build
    return {name: make(name) for name in SHAPES}
