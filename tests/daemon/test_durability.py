"""kill -9 at a random moment under concurrent traffic (real sarpd, RocksDB,
--sync always): every acknowledged insert is matched in full after the restart.

Each round: several client tasks, each on its own connection, run multi-turn
sessions (match the history, then insert the history plus a new turn), with the turns
of several sessions in flight at once on each connection (pipelined), recording each
insert once it is acknowledged; periodic snapshots run every 0.25 s, so kills also
land in snapshot writes and change-log trimming; SIGKILL lands at a random moment;
the daemon restarts on the same data directory; every insert acknowledged in any
round so far must match all its blocks with their metadata, and `sarpctl check` must
be clean. Block metadata is a function of (session, block position), so it does not
matter which of several inserts covering a block was first.

Default suite: 3 rounds per persistent backend. `-m slow`: 25 rounds per backend
(`pytest -m slow -s tests/daemon/test_durability.py` prints rounds and inserts acknowledged).
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from backends.registry import backend_names
from sarpd.client import Client, SarpConnectionError
from tests.daemon_helpers import REPO, Launcher, SarpdProc

BT = 16
CLIENTS = 4


@dataclass
class Session:
    ns: str
    key: int
    tokens: list[int] = field(default_factory=list)

    def meta(self, n_blocks: int) -> list[int]:
        return [(self.key << 20) | j for j in range(n_blocks)]


@dataclass
class Acked:
    ns: str
    tokens: list[int]
    meta: list[int]


async def one_turn(c: Client, rng: random.Random, s: Session, acked: list[Acked]) -> None:
    if s.tokens:
        got = await c.match(tokens=s.tokens, ns=s.ns)
        assert got["blocks"] == len(s.tokens) // BT, (s.ns, got["blocks"])
    turn = [rng.randrange(2**32) for _ in range(rng.randrange(1, 6) * BT + 5)]
    tokens = s.tokens + turn
    meta = s.meta(len(tokens) // BT)
    await c.insert(tokens=tokens, meta=meta, ns=s.ns)
    acked.append(Acked(s.ns, tokens, meta))
    s.tokens = tokens


async def client_task(
    path: str, rng: random.Random, sessions: list[Session], acked: list[Acked]
) -> None:
    """Turns of 1..3 sessions at once on one connection, until the daemon dies."""
    try:
        async with await Client.connect(path) as c:
            while True:
                picked = rng.sample(sessions, rng.randrange(1, len(sessions) + 1))
                await asyncio.gather(*(one_turn(c, rng, s, acked) for s in picked))
    except SarpConnectionError:
        return  # the daemon was killed


async def traffic_until_killed(proc: SarpdProc, rng: random.Random, acked: list[Acked]) -> int:
    """Run CLIENTS tasks, SIGKILL the daemon after a random delay; inserts acked."""
    before = len(acked)
    tasks = []
    for k in range(CLIENTS):
        sessions = [Session(ns=f"c{k}", key=rng.randrange(2**40)) for _ in range(3)]
        tasks.append(asyncio.create_task(client_task(str(proc.socket), rng, sessions, acked)))
    await asyncio.sleep(rng.uniform(0.3, 1.2))
    assert proc.proc is not None
    proc.proc.kill()
    await asyncio.gather(*tasks)
    assert proc.proc.wait(30) == -9
    return len(acked) - before


async def verify_all(proc: SarpdProc, acked: list[Acked]) -> None:
    """Every acknowledged insert matches in full (matches pipelined, 256 in flight)."""
    async with await Client.connect(str(proc.socket)) as c:
        for i in range(0, len(acked), 256):
            chunk = acked[i : i + 256]
            got = await asyncio.gather(*(c.match(tokens=a.tokens, ns=a.ns) for a in chunk))
            for a, g in zip(chunk, got, strict=True):
                assert g["blocks"] == len(a.tokens) // BT, f"{a.ns}: lost blocks after kill -9"
                assert g["meta"] == a.meta
        assert isinstance((await c.stats())["recovered_in_s"], float)


def sarpctl_check(proc: SarpdProc) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sarpd.ctl.main", "--socket", str(proc.socket), "check"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


PERSISTENT = [n for n in backend_names() if n != "memory"]


def run_rounds(sarpd_factory: Launcher, rounds: int, seed: int, backend: str) -> None:
    rng = random.Random(seed)
    proc = sarpd_factory(backend=backend, config={"index": {"snapshot_interval_s": 0.25}})
    acked: list[Acked] = []
    for r in range(rounds):
        n = asyncio.run(traffic_until_killed(proc, rng, acked))
        assert n > 0, f"round {r}: no insert was acknowledged before the kill"
        proc.start()
        asyncio.run(verify_all(proc, acked))
        check = sarpctl_check(proc)
        assert check.returncode == 0, check.stdout + check.stderr
    assert proc.stop() == 0
    print(f"\n{backend}: {rounds} rounds of kill -9 survived, {len(acked)} acknowledged "
          f"inserts all matched, check clean")


@pytest.mark.parametrize("backend", PERSISTENT)
def test_kill_9_loses_no_acknowledged_insert(sarpd_factory: Launcher, backend: str) -> None:
    run_rounds(sarpd_factory, rounds=3, seed=20261129, backend=backend)


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("backend", PERSISTENT)
def test_kill_9_many_rounds(sarpd_factory: Launcher, backend: str) -> None:
    run_rounds(sarpd_factory, rounds=25, seed=7, backend=backend)
