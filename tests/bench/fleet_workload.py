"""Small fleet workloads for the fleet tests: shared system prompts, conversations that
grow turn by turn, and branches from inside earlier turns, as `FleetRequest`s whose
block ids are prefix-chained (one id per distinct prefix)."""

from __future__ import annotations

import random

import numpy as np

from tools.bench.fleet_model import FleetRequest


class Prefixes:
    """A distinct id (and content hash) for every distinct block prefix."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def chain(self, blocks: list[int]) -> tuple[np.ndarray, np.ndarray]:
        ids = []
        for i in range(len(blocks)):
            key = tuple(blocks[: i + 1])
            ids.append(self.ids.setdefault(key, len(self.ids) + 1))
        locals_ = [b * 7919 + 13 for b in blocks]
        return np.array(ids, dtype=np.uint64), np.array(locals_, dtype=np.uint64)


def fleet_requests(seed: int, n: int = 60, workers: int = 4, prompts: int = 3,
                   gap_ms: float = 5.0) -> list[FleetRequest]:
    """`n` requests: sessions start from one of `prompts` system prompts (2-5 blocks),
    grow by 1-4 blocks a turn, and sometimes branch from inside an earlier turn."""
    rng = random.Random(seed)
    pre = Prefixes()
    systems = [[1000 * (p + 1) + j for j in range(rng.randint(2, 5))] for p in range(prompts)]
    sessions: list[list[int]] = []
    out: list[FleetRequest] = []
    content = 1
    t = 0.0
    for i in range(n):
        roll = rng.random()
        if not sessions or roll < 0.25:
            sessions.append(list(rng.choice(systems)))
            s = len(sessions) - 1
        elif roll < 0.4:  # a branch: from inside a turn of another session
            base = rng.choice(sessions)
            sessions.append(base[: rng.randint(1, len(base))])
            s = len(sessions) - 1
        else:
            s = rng.randrange(len(sessions))
        blocks = sessions[s]
        for _ in range(rng.randint(1, 4)):
            blocks.append(content)
            content += 1
        hashes, locals_ = pre.chain(blocks)
        t += rng.choice([0.0, gap_ms, 2 * gap_ms])
        out.append(FleetRequest(i, t, s, s % workers, hashes, locals_, rng.randint(1, 6)))
    return out
