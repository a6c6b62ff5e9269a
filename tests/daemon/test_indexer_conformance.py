"""sarpd's indexer API against the real Dynamo standalone KV indexer (docs/HTTP.md).

One sarpd (`--http-port`) and one `python -m dynamo.indexer` (ai-dynamo-runtime
1.6.1) listen to the same vLLM-schema publishers, and every answer is compared:

- `test_randomized_scenario_answers_as_dynamo`: three engines (one with two dp ranks
  carried by the batches' `data_parallel_rank`, one registered only after it had
  published: its first live batch makes both indexers replay it from 0) drive a
  deterministic random scenario: a system prompt every engine stores, new requests,
  continuations, branches from inside sequences, a LoRA tenant, a salted tenant
  (vLLM's plain ``dynamo-cache-salt:<salt>`` key in block 0's extra keys), evictions
  from the tails of chains (Dynamo and sarp deliberately differ on a middle block:
  the next test), CPU- and disk-tier stores extending device prefixes, offloads
  followed by device evictions, CPU and disk removals, AllBlocksCleared. After each phase
  every probe (each stored sequence, prefixes, extensions with unknown blocks, a
  partial last block, with and without the tenant's lora/salt) is asked on `/query`
  and on `/query_by_hash` of both: the parsed answers must be equal, and enough of
  them non-empty (and showing every feature) that the test cannot pass vacuously.
- `test_salted_continuation_answers_as_dynamo`: the salted tenant's case alone: a
  continuation store carries no salt key, and Dynamo hashes it with its parent's salt.
- `test_middle_removal_differs_as_documented`: each side's own behaviour for a
  removal inside a chain ("Where sarp differs").
- `test_registration_statuses_and_bodies_as_dynamo`: /register, /unregister and
  unknown-model answers, status and body.

The dev extra installs the ai-dynamo-runtime wheel (`make setup`); without it these
tests fail, as `test_dynamo_s_indexer_is_installed` says.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash

from sarpd.indexer import hashing
from tests.daemon.indexer_helpers import (
    BLOCK,
    call,
    dynamo_available,
    dynamo_indexer,
    forget,
    free_port,
    query,
    register_body,
    register_both,
    settle,
    stable,
    wait_http,
)
from tests.daemon_helpers import SarpdProc
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import Publisher


def test_dynamo_s_indexer_is_installed() -> None:
    """The comparison needs the real thing: the dev extra installs it (never skipped)."""
    assert dynamo_available(), "ai-dynamo-runtime==1.6.1 is missing: `make setup` installs it"


SEED = 20_260_611
SALT_KEY = "dynamo-cache-salt:"
MARK_BASE = 4_000_000_000  # marker tokens (near the top of u32), apart from the scenario's


@dataclass(frozen=True)
class Pair:
    sarp: int  # HTTP ports
    dynamo: int
    logs: Path | None = None  # where the indexers' logs go

    @property
    def ports(self) -> tuple[int, int]:
        return (self.sarp, self.dynamo)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    base = tmp_path_factory.mktemp("conformance")
    (base / "data").mkdir()
    port = free_port()
    sarpd = SarpdProc(base / "data", sync="always", extra_args=("--http-port", str(port)))
    try:
        sarpd.start()
        wait_http(port)
        with dynamo_indexer(base) as dyn:
            yield Pair(port, dyn.port, base)
    finally:
        forget(port)
        if sarpd.alive:
            with contextlib.suppress(Exception):
                sarpd.stop()
        sarpd.cleanup()


# ------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Tenant:
    name: str
    lora: str | None = None
    salt: str | None = None

    def query_kw(self) -> dict[str, str]:
        kw = {}
        if self.lora:
            kw["lora_name"] = self.lora
        if self.salt:
            kw["cache_salt"] = self.salt
        return kw


PLAIN = Tenant("plain")
LORA = Tenant("lora", lora="adapter-a")
SALTED = Tenant("salted", salt="tenant-7")

Block = tuple[int, ...]


def engine_hashes(blocks: Sequence[Block], tenant: Tenant) -> tuple[int, ...]:
    """The engine's block hashes: u64 ints chained over the content (and the tenant),
    the same on every engine, as vLLM's are (Dynamo keeps the first storer's hash for
    a path: equal paths must carry equal hashes, FACTS F5.2)."""
    h = xxhash.xxh3_64_intdigest(f"{tenant.lora}|{tenant.salt}".encode())
    out = []
    for b in blocks:
        h = xxhash.xxh3_64_intdigest(h.to_bytes(8, "little") + np.array(b, "<u4").tobytes())
        out.append(h)
    return tuple(out)


@dataclass(frozen=True)
class Seq:
    index: int
    tenant: Tenant
    blocks: tuple[Block, ...]
    hashes: tuple[int, ...]
    story: str

    @property
    def tokens(self) -> list[int]:
        return [t for b in self.blocks for t in b]

    def __len__(self) -> int:
        return len(self.blocks)

    def describe(self) -> str:
        return f"seq#{self.index} ({self.tenant.name}, {len(self)} blocks, {self.story})"


@dataclass
class Worker:
    """What one (engine, dp rank) holds, as the engine knows it: device blocks (hash ->
    parent hash; closed under parents, tails evicted only), CPU and disk blocks."""

    instance: int
    rank: int
    device: dict[int, int | None] = field(default_factory=dict)
    cpu: set[int] = field(default_factory=set)
    disk: set[int] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"{self.instance}/dp{self.rank}"

    def prefix(self, seq: Seq) -> int:
        """How many leading blocks of `seq` are on the device."""
        n = 0
        while n < len(seq) and seq.hashes[n] in self.device:
            n += 1
        return n

    def leaves(self) -> list[int]:
        parents = set(self.device.values())
        return sorted(h for h in self.device if h not in parents)

    def clear(self) -> None:
        self.device.clear()
        self.cpu.clear()
        self.disk.clear()


@dataclass
class Engine:
    instance: int
    pub: Publisher
    workers: dict[int, Worker]
    registered: bool = False


def stored(seq: Seq, a: int, b: int, medium: str = "GPU", partial: bool = False
           ) -> vs.BlockStored:
    """The engine's BlockStored of blocks [a, b) of `seq` (parent: block a-1), the salt
    key on block 0 only, as vLLM puts it."""
    tokens = [t for blk in seq.blocks[a:b] for t in blk]
    if partial:
        tokens += [7, 7, 7, 7, 7]  # a partial block after them: not a block
    extra: list[tuple[Any, ...] | None] | None = None
    if seq.tenant.salt and a == 0:
        extra = [(SALT_KEY + seq.tenant.salt,)] + [None] * (b - a - 1)
    return vs.block_stored(list(seq.hashes[a:b]), seq.hashes[a - 1] if a else None, tokens,
                           BLOCK, medium=medium, lora_name=seq.tenant.lora, extra_keys=extra)


class Scenario:
    """The random scenario: a catalogue of sequences and the engines' ops on them."""

    def __init__(self, rng: random.Random, engines: dict[int, Engine], model: str) -> None:
        self.rng = rng
        self.engines = engines
        self.model = model
        self.catalog: list[Seq] = []
        self.system = [self.fresh_block() for _ in range(3)]
        self.ops: list[str] = []  # a log of what was done (for failure messages)

    def fresh_block(self) -> Block:
        return tuple(self.rng.randrange(1, 100_000) for _ in range(BLOCK))

    def new_seq(self, tenant: Tenant, prefix: Sequence[Block], n_new: int, story: str) -> Seq:
        blocks = (*prefix, *(self.fresh_block() for _ in range(n_new)))
        seq = Seq(len(self.catalog), tenant, blocks, engine_hashes(blocks, tenant), story)
        self.catalog.append(seq)
        return seq

    @property
    def workers(self) -> list[Worker]:
        return [w for e in self.engines.values() for w in e.workers.values()]

    def publish(self, w: Worker, events: list[Any], what: str) -> None:
        if not events:
            return
        rank: int | None = w.rank
        if w.rank == 0 and self.rng.random() < 0.15:
            rank = None  # no data_parallel_rank: the registered rank (0)
        self.engines[w.instance].pub.publish(vs.encode_events(events, rank=rank))
        self.ops.append(f"{w.name}: {what}")

    # -- ops ------------------------------------------------------------------------
    def store(self, w: Worker, seq: Seq, upto: int | None = None) -> None:
        """A request's prefill: the blocks of `seq` up to `upto` the device lacks."""
        upto = len(seq) if upto is None else upto
        k = w.prefix(seq)
        if k >= upto:
            if k and self.rng.random() < 0.3:  # stored again: idempotent
                self.publish(w, [stored(seq, k - 1, k)], f"re-store {seq.describe()} [{k - 1}]")
            return
        partial = self.rng.random() < 0.1
        for i in range(k, upto):
            w.device[seq.hashes[i]] = seq.hashes[i - 1] if i else None
        self.publish(w, [stored(seq, k, upto, partial=partial)],
                     f"store {seq.describe()} [{k},{upto})")

    def request(self, w: Worker) -> None:
        """A new request: a new sequence, a continuation or a branch of one, or one
        another engine served."""
        rng = self.rng
        kind = rng.choices(["new", "continue", "branch", "shared"], [3, 3, 2, 2])[0]
        if kind != "new" and self.catalog:
            base = rng.choice(self.catalog)
            if kind == "continue":
                seq = self.new_seq(base.tenant, base.blocks, rng.randint(1, 3),
                                   f"continues #{base.index}")
            elif kind == "branch" and len(base) > 1:
                cut = rng.randint(1, len(base) - 1)
                seq = self.new_seq(base.tenant, base.blocks[:cut], rng.randint(1, 3),
                                   f"branches from #{base.index} after {cut}")
            else:
                seq = base
        else:
            tenant = rng.choices([PLAIN, LORA, SALTED], [5, 2, 2])[0]
            seq = self.new_seq(tenant, self.system, rng.randint(1, 4), "new request")
        upto = len(seq) if rng.random() < 0.75 else rng.randint(1, len(seq))
        self.store(w, seq, upto)

    def evict(self, w: Worker) -> None:
        """Device eviction of a chain's tail: a leaf, and its parents while they become
        leaves (never a block that still has a child on the device)."""
        leaves = w.leaves()
        if not leaves:
            return
        chain = [self.rng.choice(leaves)]
        for _ in range(self.rng.randint(0, 3)):
            parent = w.device[chain[-1]]
            if parent is None or any(p == parent for h, p in w.device.items()
                                     if h not in chain):
                break
            chain.append(parent)
        for h in chain:
            del w.device[h]
        self.publish(w, [vs.block_removed(chain)], f"evict tail {len(chain)} blocks")

    def _with_prefix(self, w: Worker, least: int, room: bool) -> list[tuple[Seq, int]]:
        out = []
        for seq in self.catalog:
            g = w.prefix(seq)
            if g >= least and (not room or g < len(seq)):
                out.append((seq, g))
        return out

    def offload(self, w: Worker) -> None:
        """Lower-tier blocks extending a device prefix: CPU blocks after the last device
        block (its hash the parent), then maybe disk blocks after the last CPU one (or
        straight after the device prefix)."""
        cands = self._with_prefix(w, 1, room=True)
        if not cands:
            return
        seq, g = self.rng.choice(cands)
        events: list[Any] = []
        end = g
        if self.rng.random() < 0.8:
            end = min(len(seq), g + self.rng.randint(1, 3))
            events.append(stored(seq, g, end, medium=self.rng.choice(["CPU", "CPU_PINNED"])))
            w.cpu.update(seq.hashes[g:end])
        # (not for the salted tenant: measured, Dynamo's disk tier does not take the
        # parent's salt as its device and CPU tiers do, a quirk left out of the scenario)
        if end < len(seq) and seq.tenant.salt is None and self.rng.random() < 0.6:
            stop = min(len(seq), end + self.rng.randint(1, 2))
            events.append(stored(seq, end, stop, medium=self.rng.choice(["DISK", "STORAGE"])))
            w.disk.update(seq.hashes[end:stop])
        self.publish(w, events, f"offload {seq.describe()} after {g}")

    def offload_evict(self, w: Worker, seq: Seq | None = None, j: int | None = None) -> None:
        """The device's tail (from block `j`) copied to the CPU, then evicted from the
        device."""
        if seq is None:
            cands = self._with_prefix(w, 1, room=False)
            if not cands:
                return
            seq = self.rng.choice(cands)[0]
        g = w.prefix(seq)
        j = self.rng.randint(0, g - 1) if j is None else j
        events: list[Any] = [stored(seq, j, g, medium="CPU")]
        w.cpu.update(seq.hashes[j:g])
        gone: list[int] = []
        for i in range(g - 1, j - 1, -1):
            h = seq.hashes[i]
            if h not in w.leaves():
                break
            del w.device[h]
            gone.append(h)
        if gone:
            events.append(vs.block_removed(gone))
        self.publish(w, events, f"offload+evict {seq.describe()} [{j},{g}) ({len(gone)} gone)")

    def lower_remove(self, w: Worker) -> None:
        """A CPU or disk block dropped (that block only, on that tier)."""
        tiers = [(held, medium) for held, medium in ((w.cpu, "CPU"), (w.disk, "DISK")) if held]
        if not tiers:
            return
        held, medium = self.rng.choice(tiers)
        h = self.rng.choice(sorted(held))
        held.discard(h)
        self.publish(w, [vs.block_removed([h], medium=medium)], f"{medium} remove 1 block")

    def clear(self, w: Worker) -> None:
        w.clear()
        self.publish(w, [vs.AllBlocksCleared()], "AllBlocksCleared")

    def random_op(self, w: Worker) -> None:
        op = self.rng.choices(
            [self.request, self.evict, self.offload, self.offload_evict, self.lower_remove],
            [6, 3, 2, 1, 1])[0]
        op(w)

    def mark(self, phase: int) -> list[int]:
        """Each engine's last batch of the phase: a store of the phase's marker block."""
        tokens = [MARK_BASE + phase * BLOCK + i for i in range(BLOCK)]
        mark = Seq(-1, PLAIN, (tuple(tokens),), engine_hashes([tuple(tokens)], PLAIN), "marker")
        for e in self.engines.values():
            e.workers[0].device[mark.hashes[0]] = None
            e.pub.publish(vs.encode_events([stored(mark, 0, 1)], rank=0))
        return tokens

    # -- probes ---------------------------------------------------------------------
    def probes(self) -> list[Probe]:
        rng = random.Random(self.rng.random())
        out: list[Probe] = []
        sys_tokens = [t for b in self.system for t in b]
        out.append(Probe("the system prompt", sys_tokens, {}))
        out.append(Probe("the system prompt, lora", sys_tokens, LORA.query_kw()))
        out.append(Probe("no tokens", [], {}))
        out.append(Probe("less than a block", sys_tokens[:10], {}))
        for seq in self.catalog:
            kw, d, toks, t = seq.tenant.query_kw(), seq.describe(), seq.tokens, seq.tenant.name
            out.append(Probe(d, toks, kw, t))
            if len(seq) > 1:
                n = rng.randint(1, len(seq) - 1)
                out.append(Probe(f"{d}: its first {n} blocks", toks[: n * BLOCK], kw, t))
            unknown = [x for _ in range(2) for x in self.fresh_block_from(rng)]
            out.append(Probe(f"{d} + 2 unknown blocks", toks + unknown, kw, t))
            out.append(Probe(f"{d} + a partial block", toks + unknown[:7], kw, t))
            if seq.tenant is not PLAIN:
                out.append(Probe(f"{d} without its lora/salt", toks, {}, t))
            if seq.tenant is SALTED:
                out.append(Probe(f"{d} with another salt", toks, {"cache_salt": "tenant-8"}, t))
        return out

    @staticmethod
    def fresh_block_from(rng: random.Random) -> Block:
        return tuple(rng.randrange(100_000, 200_000) for _ in range(BLOCK))


@dataclass(frozen=True)
class Probe:
    label: str
    tokens: list[int]
    kw: dict[str, str]
    tenant: str = "plain"

    def requests(self, model: str) -> list[tuple[str, dict[str, Any]]]:
        """/query, and /query_by_hash of the same blocks' hashes (signed int64)."""
        q = {"token_ids": self.tokens, "model_name": model, **self.kw}
        seed = hashing.seed_of(self.kw.get("lora_name"), self.kw.get("cache_salt"))
        local = hashing.local_hashes(np.array(self.tokens, dtype=np.uint32), BLOCK, seed)
        h = {"block_hashes": hashing.signed(local), "model_name": model}
        return [("/query", q), ("/query_by_hash", h)]


def _short(body: dict[str, Any]) -> str:
    b = dict(body)
    toks = b.get("token_ids")
    if isinstance(toks, list) and len(toks) > 8:
        b["token_ids"] = f"[{', '.join(map(str, toks[:4]))}, ... ({len(toks)} tokens)]"
    return json.dumps(b)


@dataclass
class Tally:
    answers: int = 0
    non_empty: int = 0
    features: set[str] = field(default_factory=set)

    def add(self, kw: dict[str, str], answer: Any) -> None:
        self.answers += 1
        inst = answer.get("instances") if isinstance(answer, dict) else None
        if not inst:
            self.features.add("no match")
            return
        self.non_empty += 1
        if len(inst) >= 3:
            self.features.add("3 instances")
        for v in inst.values():
            if v["cpu"] > v["gpu"]:
                self.features.add("cpu > gpu")
            if v["disk"] > v["cpu"]:
                self.features.add("disk > cpu")
            if v["gpu"] == 0:
                self.features.add("lower tiers only")
            if len(v["dp"]) >= 2:
                self.features.add("2 dp ranks")
        if "lora_name" in kw:
            self.features.add("lora match")
        if "cache_salt" in kw:
            self.features.add("salt match")


@dataclass(frozen=True)
class Diff:
    phase: str
    probe: Probe
    path: str
    body: dict[str, Any]
    sarp: tuple[int, Any]
    dynamo: tuple[int, Any]

    def __str__(self) -> str:
        return (f"[{self.phase}] {self.probe.label}\n    POST {self.path} {_short(self.body)}\n"
                f"    sarp:   {self.sarp[0]} {json.dumps(self.sarp[1], sort_keys=True)}\n"
                f"    dynamo: {self.dynamo[0]} {json.dumps(self.dynamo[1], sort_keys=True)}")


def compare(pair: Pair, model: str, probes: list[Probe], phase: str, tally: Tally
            ) -> list[Diff]:
    """Every probe asked of both; the differences (asked again after a pause before
    they count)."""
    diffs = []
    for probe in probes:
        for path, body in probe.requests(model):
            a = call(pair.sarp, "POST", path, body)
            b = call(pair.dynamo, "POST", path, body)
            assert b[0] == 200, (path, body, b)
            tally.add(probe.kw if path == "/query" else {}, b[1])
            if a != b:
                diffs.append(Diff(phase, probe, path, body, a, b))
    if diffs:
        time.sleep(0.3)
    again = []
    for d in diffs:
        a = call(pair.sarp, "POST", d.path, d.body)
        b = call(pair.dynamo, "POST", d.path, d.body)
        if a != b:
            again.append(Diff(d.phase, d.probe, d.path, d.body, a, b))
    return again


def pair_dir(pair: Pair) -> Path:
    assert pair.logs is not None
    return pair.logs


def report(diffs: list[Diff], scn: Scenario) -> str:
    """The differences: how many per phase and kind of probe, then the first few."""
    counts: dict[str, int] = {}
    for d in diffs:
        key = f"phase {d.phase}, {d.probe.tenant} probes"
        counts[key] = counts.get(key, 0) + 1
    lines = [f"{len(diffs)} answers differ from Dynamo's (seed {SEED}):"]
    lines += [f"  {n:4d}  {key}" for key, n in counts.items()]
    lines += [str(d) for d in diffs[:8]]
    lines.append(f"(the last ops: {scn.ops[-5:]})")
    return "\n".join(lines)


# ------------------------------------------------------------------------- the tests


_marks = itertools.count()


def mark_and_settle(pair: Pair, pub: Publisher, model: str, inst: int) -> None:
    """A store of a fresh marker block as `pub`'s last batch, until both answer it."""
    n = next(_marks)
    block = tuple(MARK_BASE - 100_000 + n * BLOCK + i for i in range(BLOCK))
    mark = Seq(-1, PLAIN, (block,), engine_hashes([block], PLAIN), "marker")
    pub.publish(vs.encode_events([stored(mark, 0, 1)]))
    settle(pair.ports, model, mark.tokens, [inst])


def both(pair: Pair, path: str, body: dict[str, Any]) -> list[Any]:
    """The answer of each (sarp, Dynamo), once two asked 100 ms apart agree."""
    return [stable(functools.partial(call, port, "POST", path, body)) for port in pair.ports]


def unregister(pair: Pair, inst: int, model: str) -> None:
    for port in pair.ports:
        call(port, "POST", "/unregister", {"instance_id": inst, "model_name": model})


def five_blocks(base: int, tenant: Tenant) -> Seq:
    blocks = tuple(tuple(range(base + BLOCK * i, base + BLOCK * (i + 1))) for i in range(5))
    return Seq(0, tenant, blocks, engine_hashes(blocks, tenant), "five blocks")


def test_randomized_scenario_answers_as_dynamo(pair: Pair) -> None:
    model = "conf-scn"
    rng = random.Random(SEED)
    late = 503
    with contextlib.ExitStack() as stack:
        engines: dict[int, Engine] = {}
        for inst in (501, 502, late):
            pub = stack.enter_context(contextlib.closing(Publisher()))
            ranks = (0, 1) if inst == 501 else (0,)
            engines[inst] = Engine(inst, pub, {r: Worker(inst, r) for r in ranks})
        scn = Scenario(rng, engines, model)
        tally = Tally()
        diffs: list[Diff] = []

        def register(e: Engine) -> None:
            register_both(pair.ports, e.pub, register_body(e.instance, e.pub, model))
            e.registered = True

        def check(phase: int, name: str) -> None:
            tokens = scn.mark(phase)
            settle(pair.ports, model, tokens, [e.instance for e in engines.values()
                                               if e.registered])
            diffs.extend(compare(pair, model, scn.probes(), f"{phase} {name}", tally))

        def workers(*insts: int) -> list[Worker]:
            return [w for i in insts for w in engines[i].workers.values()]

        register(engines[501])
        register(engines[502])

        # 1: every engine (the late one unregistered yet) stores the system prompt and
        # a few requests of its own
        for w in scn.workers:
            scn.store(w, scn.new_seq(PLAIN, scn.system, 0, "the system prompt"))
            for _ in range(3):
                scn.request(w)
        check(1, "prefill")

        # 2: more requests: continuations, branches, the tenants
        for _ in range(24):
            scn.request(rng.choice(scn.workers))
        for tenant in (LORA, SALTED):  # each tenant surely present, continued
            seq = scn.new_seq(tenant, scn.system, 2, "a tenant's request")
            cont = scn.new_seq(tenant, seq.blocks, 2, f"continues #{seq.index}")
            for w in workers(501, 502):
                scn.store(w, seq)
                scn.store(w, cont)
        check(2, "requests")

        # 3: the late engine registered: its next live batch (at the latest the phase's
        # marker) makes both replay it from 0
        before = [s for s in scn.catalog if engines[late].workers[0].prefix(s) == len(s)]
        assert before, "the late engine stored nothing before its registration"
        register(engines[late])
        for _ in range(2):
            scn.request(engines[late].workers[0])
        check(3, "late registration")
        for seq in before:  # all there (asked of Dynamo; sarp answered the same)
            ans = query(pair.dynamo, model, seq.tokens, **seq.tenant.query_kw())[1]
            got = ans["instances"].get(str(late), {}).get("gpu")
            assert got == len(seq) * BLOCK, (f"{seq.describe()}: not replayed", ans)
        assert engines[late].pub.replay_requests == [0, 0], engines[late].pub.replay_requests

        # 4: lower tiers: offloads after device prefixes, offload + eviction, CPU and disk removals
        for _ in range(40):
            w = rng.choice(scn.workers)
            rng.choices([scn.offload, scn.offload_evict, scn.request, scn.lower_remove],
                        [5, 3, 2, 1])[0](w)
        for w in workers(502):  # a whole chain moved to the CPU: a CPU root
            seq = scn.new_seq(PLAIN, [], 3, "a prompt without the system prompt")
            scn.store(w, seq)
            scn.offload_evict(w, seq, 0)
        check(4, "tiers")

        # 5: tail evictions, one worker cleared (then serving again)
        for _ in range(12):
            scn.evict(rng.choice(scn.workers))
        scn.clear(engines[502].workers[0])
        scn.clear(engines[501].workers[1])
        for w in (engines[502].workers[0], engines[501].workers[1]):
            for _ in range(2):
                scn.request(w)
        check(5, "evictions and clears")

        # 6, 7: everything mixed
        for phase in (6, 7):
            for _ in range(80):
                scn.random_op(rng.choice(scn.workers))
            check(phase, "churn")

        # 8: sarp is the peer that is always there: a Dynamo indexer started with
        # --peers at sarpd loads its /dump and answers every probe as sarp does
        with dynamo_indexer(pair_dir(pair), peers=f"http://127.0.0.1:{pair.sarp}") as peer:
            diffs.extend(compare(Pair(pair.sarp, peer.port), model, scn.probes(),
                                 "8 a peer loaded sarp's /dump", tally))
            assert call(peer.port, "GET", "/workers") == (200, [])  # it follows nothing

        if diffs:
            pytest.fail(report(diffs, scn))
        share = tally.non_empty / tally.answers
        assert share > 0.4, f"only {tally.non_empty} of {tally.answers} answers matched anything"
        want = {"3 instances", "cpu > gpu", "disk > cpu", "lower tiers only", "2 dp ranks",
                "lora match", "salt match", "no match"}
        assert want <= tally.features, f"not exercised: {sorted(want - tally.features)}"


def test_salted_continuation_answers_as_dynamo(pair: Pair) -> None:
    """vLLM puts a request's cache salt among its block 0's extra keys only; a later
    store continuing the sequence (a parent, no salt key) is hashed by Dynamo with its
    parent's salt, on the device and on the CPU tier: blocks 0-1 salted by the key,
    2-3 a device continuation, 4 a CPU one, all match a /query with the salt (Dynamo:
    gpu 64, cpu 80)."""
    model, inst = "conf-salt", 601
    seq = five_blocks(70_000, SALTED)
    with contextlib.closing(Publisher()) as pub:
        register_both(pair.ports, pub, register_body(inst, pub, model))
        pub.publish(vs.encode_events([stored(seq, 0, 2)]))
        pub.publish(vs.encode_events([stored(seq, 2, 4)]))
        pub.publish(vs.encode_events([stored(seq, 4, 5, medium="CPU")]))
        mark_and_settle(pair, pub, model, inst)
        probe = Probe("salted, continued", seq.tokens, SALTED.query_kw(), "salted")
        diffs = []
        for path, body in probe.requests(model):
            sarp, dyn = both(pair, path, body)
            if sarp != dyn:
                diffs.append(Diff("salted continuation", probe, path, body, sarp, dyn))
        sarp, dyn = both(pair, "/query", probe.requests(model)[0][1])
        assert dyn[1]["instances"][str(inst)] == {
            "longest_matched": 80, "gpu": 64, "dp": {"0": 64}, "cpu": 80, "disk": 80}, dyn
        unregister(pair, inst, model)
        assert not diffs, "\n".join(map(str, diffs))


def test_middle_removal_differs_as_documented(pair: Pair) -> None:
    """dev[0,5), the middle block 2 removed, then stored again: Dynamo dropped blocks
    3 and 4 with it for good (48 tokens); sarp removed only block 2, and blocks 3 and 4
    match again once it is back (80). Before the re-store both answer 32."""
    model, inst = "conf-mid", 401
    seq = five_blocks(60_000, PLAIN)
    body = {"token_ids": seq.tokens, "model_name": model}
    with contextlib.closing(Publisher()) as pub:
        register_both(pair.ports, pub, register_body(inst, pub, model))
        pub.publish(vs.encode_events([stored(seq, 0, 5)]))
        mark_and_settle(pair, pub, model, inst)
        full = {"longest_matched": 80, "gpu": 80, "dp": {"0": 80}, "cpu": 80, "disk": 80}
        assert both(pair, "/query", body) == [(200, {
            "scores": {str(inst): {"0": 80}}, "frequencies": [],
            "instances": {str(inst): full}})] * 2
        pub.publish(vs.encode_events([vs.block_removed([seq.hashes[2]])]))
        mark_and_settle(pair, pub, model, inst)
        sarp, dyn = both(pair, "/query", body)
        assert sarp == dyn, (sarp, dyn)
        assert dyn[1]["instances"][str(inst)]["gpu"] == 32, dyn
        pub.publish(vs.encode_events([stored(seq, 2, 3)]))
        mark_and_settle(pair, pub, model, inst)
        sarp, dyn = both(pair, "/query", body)
        assert dyn[1]["instances"][str(inst)]["gpu"] == 48, dyn  # 3 and 4 gone for good
        assert sarp[1]["instances"][str(inst)]["gpu"] == 80, sarp  # kept, reachable again
        unregister(pair, inst, model)


def test_registration_statuses_and_bodies_as_dynamo(pair: Pair) -> None:
    model = "conf-reg"
    with contextlib.ExitStack() as stack:
        pubs = [stack.enter_context(contextlib.closing(Publisher())) for _ in range(2)]

        def reg(inst: int, pub: Publisher, m: str = model, **kw: Any) -> dict[str, Any]:
            return {**register_body(inst, pub, m), **kw}

        unreg = {"instance_id": 301, "model_name": model}
        cases: list[tuple[str, str, dict[str, Any], int]] = [
            ("register", "/register", reg(301, pubs[0]), 201),
            ("register again", "/register", reg(301, pubs[0]), 409),
            ("register again, another endpoint", "/register", reg(301, pubs[1]), 409),
            ("another dp rank", "/register", reg(301, pubs[0], dp_rank=1), 201),
            ("another block size", "/register", reg(302, pubs[1], block_size=32), 409),
            ("the instance under another model", "/register", reg(301, pubs[1], "conf-reg2"),
             409),
            ("unregister an unknown instance", "/unregister",
             {"instance_id": 399, "model_name": model}, 404),
            ("unregister under another model", "/unregister",
             {"instance_id": 301, "model_name": "conf-nope"}, 404),
            ("unregister under another group", "/unregister",
             {**unreg, "routing_group": "other"}, 404),
            ("query an unknown model", "/query",
             {"token_ids": list(range(32)), "model_name": "conf-nope"}, 404),
            ("query an unknown group", "/query",
             {"token_ids": list(range(32)), "model_name": model, "routing_group": "zz"}, 404),
            ("query_by_hash with a salt", "/query_by_hash",
             {"block_hashes": [1, 2], "model_name": model, "cache_salt": "s"}, 400),
            ("query no tokens", "/query", {"token_ids": [], "model_name": model}, 200),
            ("unregister (a dp_rank given: ignored)", "/unregister", {**unreg, "dp_rank": 1},
             200),
            ("query once the last instance is gone", "/query",
             {"token_ids": list(range(32)), "model_name": model}, 404),
            ("unregister it again", "/unregister", unreg, 404),
            ("register it again", "/register", reg(301, pubs[0]), 201),
            ("unregister", "/unregister", unreg, 200),
        ]
        diffs = []
        for what, path, body, want in cases:
            a = call(pair.sarp, "POST", path, body)
            b = call(pair.dynamo, "POST", path, body)
            assert b[0] == want, (what, body, b)
            if a != b:
                diffs.append(f"{what}: POST {path} {json.dumps(body)}\n    sarp:   {a}\n"
                             f"    dynamo: {b}")
        assert not diffs, "answers differ:\n" + "\n".join(diffs)
