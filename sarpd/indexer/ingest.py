"""An engine's KV events -> sarp requests, keyed as Dynamo's standalone indexer keys
them (sans-I/O; the daemon's listeners feed it decoded batches, in order).

A store's blocks are keyed by their tokens (`sarpd.indexer.hashing`: per-block hashes
chained into sarp ids from the indexer's namespace root), never by the engine's own
block hashes: a gateway can compute the same keys from a prompt. The engine's hashes
only link a store to its parent and name the blocks a removal drops, so each worker
keeps a map engine hash -> (sarp id, tiers holding it) (`EngineMap`).

    BlockStored   medium (`TIERS`, Dynamo's names, case-sensitive) none, GPU or
                  DEVICE: the device tier; CPU, CPU_PINNED: the host-pinned tier;
                  DISK, STORAGE, NVME...: the disk tier; any other: skipped. Needs its
                  token ids (min(hashes, tokens // block size) blocks). A parent is
                  looked up in the worker's map (a device store's parent must be on
                  the device): unknown, the store is skipped (Dynamo drops a device
                  store too; it keeps a lower tier's, reachable once the parent is).
                  Skipped as Dynamo skips them: another block size than the pair's,
                  a `group_idx` other than 0, a REMOTE `locality`, an `ownership`.
                  -> insert of the new ids after the parent's id, held by
                  ``slot << 48 | tier << 40`` (`sarpd.events.mapping.block_meta`)
    BlockRemoved  -> remove of the known ids, only that tier's holder taken off
    AllBlocksCleared -> clear of every tier of the worker, its map emptied

The batch's data-parallel rank, when it carries one, names the worker (a rank never
registered becomes a worker of its own: `Registry.dynamic`). The salt of a store
is ``"dynamo-cache-salt:<salt>"`` among its block 0's extra keys (or SGLang's salt,
sent by name: a typed ``cache_salt`` key once decoded); engines put a salt
on a sequence's first block only, so a continuation without one is hashed with its
parent's (as Dynamo hashes it; a disk-tier store takes no salt from its parent, as
in Dynamo). A LoRA adapter is each store's own `lora_name`.
What was skipped is counted by reason (`Ingest.skipped`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from sarpd import model
from sarpd.events.mapping import TIER_SHIFT, WORKER_MASK, WORKER_SHIFT
from sarpd.events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExtraKey,
)
from sarpd.indexer import hashing
from sarpd.indexer.workers import Registry, Worker, namespace

__all__ = ["DEVICE", "DISK", "HOST", "SALT_PREFIX", "TIERS", "Change", "EngineMap",
           "Entry", "Ingest", "Logged", "holder"]

DEVICE, HOST, DISK = 0, 1, 2
TIERS: dict[str | None, int] = {  # medium -> tier, exactly as Dynamo's indexer names them
    None: DEVICE, "": DEVICE, "GPU": DEVICE, "DEVICE": DEVICE,
    "CPU": HOST, "CPU_PINNED": HOST, "CPU_TIER1": HOST,
    **dict.fromkeys(("DISK", "STORAGE", "NVME", "REMOTE", "CPU_TIER2"), DISK),
}
SALT_PREFIX = "dynamo-cache-salt:"
Op = model.Insert | model.Remove | model.Clear


def holder(slot: int, tier: int) -> int:
    """A worker's holder word on a tier (the bridge's metadata layout)."""
    return (slot << WORKER_SHIFT) | (tier << TIER_SHIFT)


def _skip(ev: BlockStored, block_size: int) -> str | None:
    """Why Dynamo's indexer would not store `ev` (None: it would)."""
    if ev.medium not in TIERS:
        return "medium"
    if ev.token_bytes is None:
        return "no_tokens"
    if ev.block_size != block_size:
        return "block_size"
    if ev.group_idx not in (None, 0):
        return "group"
    if ev.locality == "REMOTE":
        return "remote"
    if ev.ownership is not None:
        return "ownership"
    return None


def salt_of(stored: BlockStored) -> str | None:
    """The cache salt of a store: Dynamo's marker among its block 0's extra keys, else
    a typed ``cache_salt`` key (SGLang's salt, which Dynamo reads by name, decodes to
    one; vLLM's typed salt too), its marker taken off; else None."""
    typed = None
    for key in stored.first_extra_keys or ():
        if isinstance(key, str) and key.startswith(SALT_PREFIX):
            return key[len(SALT_PREFIX):]
        if typed is None and isinstance(key, ExtraKey) and key.kind == "cache_salt":
            typed = str(key.value).removeprefix(SALT_PREFIX)
    return typed


# one block of a worker: (sarp id as 16 bytes, bitmask of tiers, Dynamo's per-block
# hash, the engine hash of its parent or None, its position, its salt's term in the
# seed): what /dump tells a peer, and what a continuation inherits
Entry = tuple[bytes, int, int, int | None, int, int]
Change = tuple[int, int, bytes, int, int, int | None, int, int]  # (slot, engine hash, *Entry)
# what the journal holds: a map operation as called, replayed by `Ingest.load` (one
# record an event, not one a block: the journal and its saving cost a tenth of a
# block's translation), or a block's state (`Change`: a snapshot's rows)
#   ("add", slot, hashes, ids as bytes, tier, local hashes, parent, pos, salt)
#   ("drop", slot, hashes, tier)     ("clear", slot)
Logged = tuple[Any, ...]


@dataclass
class EngineMap:
    """One worker's engine hashes: hash -> `Entry`. Every operation is also appended to
    `journal` (`Logged`; the daemon persists and empties it)."""

    slot: int
    journal: list[Logged]
    blocks: dict[int, Entry] = field(default_factory=dict)
    lower: int = 0  # blocks held on a tier below the device (a query must walk them)

    def add(self, hashes: tuple[int, ...], raw: bytes, tier: int, local: list[int],
            parent: int | None, pos: int, salt: int) -> None:
        """Blocks `hashes` (their sarp ids `raw`, 16 bytes each, per-block hashes
        `local`, hashed with salt term `salt`) after `parent` (an engine hash; None:
        from position 0, `pos`)."""
        self.journal.append(("add", self.slot, hashes, raw, tier, local, parent, pos, salt))
        n, bit, blocks = len(hashes), 1 << tier, self.blocks
        raws = [raw[i:i + 16] for i in range(0, 16 * n, 16)]
        if blocks.keys().isdisjoint(hashes) and len(set(hashes)) == n:  # all new
            entries = zip(raws, repeat(bit, n), local, (parent, *hashes[:-1]),
                          range(pos, pos + n), repeat(salt, n), strict=True)
            blocks.update(zip(hashes, entries, strict=True))
            self.lower += n if bit > 1 else 0
            return
        get = blocks.get
        for i, h in enumerate(hashes):
            old = get(h)
            was = old[1] if old else 0
            blocks[h] = (raws[i], bit | was, local[i], parent, pos + i, salt)
            self.lower += was <= 1 < bit  # the first lower tier of the block
            parent = h

    def drop(self, hashes: tuple[int, ...], tier: int) -> list[bytes]:
        """The ids of the hashes held on `tier` (that tier forgotten for them)."""
        self.journal.append(("drop", self.slot, hashes, tier))
        bit, blocks = 1 << tier, self.blocks
        popped = list(map(blocks.pop, hashes, repeat(None, len(hashes))))
        if all(e is None or e[1] == bit for e in popped):  # each on this tier alone
            out = [e[0] for e in popped if e is not None]
            self.lower -= len(out) if bit > 1 else 0
            return out
        for h, e in zip(hashes, popped, strict=True):  # put back; block by block below
            if e is not None:
                blocks[h] = e
        out = []
        for h in hashes:
            e = blocks.get(h)
            if e is None or not e[1] & bit:
                continue
            out.append(e[0])
            left = e[1] & ~bit
            self.lower -= left <= 1 < e[1]  # its last lower tier gone
            if left:
                blocks[h] = (e[0], left, *e[2:])
            else:
                del blocks[h]
        return out

    def clear(self) -> None:
        self.journal.append(("clear", self.slot))
        self.blocks.clear()
        self.lower = 0


@dataclass
class Ingest:
    """Translates the batches of every listener of one daemon (the maps are its own)."""

    registry: Registry
    maps: dict[int, EngineMap] = field(default_factory=dict)  # by worker slot
    skipped: Counter[str] = field(default_factory=Counter)
    journal: list[Logged] = field(default_factory=list)  # the maps' operations, unsaved

    def engine_map(self, slot: int) -> EngineMap:
        m = self.maps.get(slot)
        if m is None:
            m = self.maps[slot] = EngineMap(slot, self.journal)
        return m

    def load(self, rows: Iterable[Logged]) -> None:
        """The maps as saved: blocks' states (`Change`) and operations replayed in
        order (not journaled again)."""
        for row in rows:
            kind = row[0]
            if kind == "add":
                _, slot, hashes, raw, tier, local, parent, pos, salt = row
                self.engine_map(slot).add(tuple(hashes), raw, tier, local, parent, pos, salt)
            elif kind == "drop":
                self.engine_map(row[1]).drop(tuple(row[2]), row[3])
            elif kind == "clear":
                self.engine_map(row[1]).clear()
            else:
                slot, h, raw, tiers, local, parent, pos, salt = row
                blocks = self.engine_map(slot).blocks
                if tiers:
                    blocks[h] = (raw, tiers, local, parent, pos, salt)
                else:
                    blocks.pop(h, None)
        self.journal.clear()
        for m in self.maps.values():
            m.lower = sum(e[1] > 1 for e in m.blocks.values())

    def clear(self, w: Worker, next_id: Callable[[], int]) -> model.Clear:
        """Every tier of worker `w` cleared (AllBlocksCleared, an engine restart, an
        unregistration); its map emptied."""
        self.engine_map(w.slot).clear()
        return model.Clear(next_id(), ns=namespace(w.model, w.group), mask=WORKER_MASK,
                           value=w.slot << WORKER_SHIFT)

    def batch(self, w: Worker, batch: EventBatch, next_id: Callable[[], int]) -> list[Op]:
        """The requests of one batch of worker `w`'s listener, in order."""
        if batch.data_parallel_rank is not None and batch.data_parallel_rank != w.dp_rank:
            w = self.registry.dynamic(w.model, w.group, w.instance_id, batch.data_parallel_rank)
        ns = namespace(w.model, w.group)
        emap = self.engine_map(w.slot)
        out: list[Op] = []
        for ev in batch.events:
            op: Op | None
            if isinstance(ev, BlockStored):
                op = self._stored(w, ns, emap, ev, next_id)
            elif isinstance(ev, BlockRemoved):
                op = self._removed(w, ns, emap, ev, next_id)
            elif isinstance(ev, AllBlocksCleared):
                op = self.clear(w, next_id)
            else:
                self.skipped["unknown_event"] += 1
                op = None
            if op is not None:
                out.append(op)
        return out

    def _stored(self, w: Worker, ns: str, emap: EngineMap, ev: BlockStored,
                next_id: Callable[[], int]) -> model.Insert | None:
        size = self.registry.require(w.model, w.group)
        why = _skip(ev, size)
        if why:
            self.skipped[why] += 1
            return None
        assert ev.token_bytes is not None
        tier = TIERS[ev.medium]
        own = salt_of(ev)
        salt = hashing.salt_term(own)
        if ev.parent is None:
            parent_id, parent, pos = hashing.root(ns), None, 0
        else:
            known = emap.blocks.get(ev.parent)
            if known is None or (tier == DEVICE and not known[1] & 1 << DEVICE):
                self.skipped["unknown_parent"] += 1
                return None
            parent_id, pos = known[0], known[4] + 1
            parent = np.frombuffer(parent_id, dtype="<u8").reshape(1, 2)
            if own is None and tier != DISK:
                salt = known[5]  # the sequence's salt, from its first block on (Dynamo's)
        tokens = np.frombuffer(ev.token_bytes, dtype="<u4")
        local = hashing.local_hashes(tokens, size, hashing.seed_of(ev.lora_name, None, salt))
        n = min(len(local), len(ev.block_hashes))
        if n == 0:
            self.skipped["empty"] += 1
            return None
        ids = hashing.chain(parent_id, local[:n])
        emap.add(ev.block_hashes[:n], ids.tobytes(), tier, local[:n].tolist(), ev.parent,
                 pos, salt)
        return model.Insert(next_id(), seq=model.SeqSpec(ns=ns, hashes=ids),
                            meta=holder(w.slot, tier), parent=parent, add_holder=True)

    def _removed(self, w: Worker, ns: str, emap: EngineMap, ev: BlockRemoved,
                 next_id: Callable[[], int]) -> model.Remove | None:
        tier = TIERS.get(ev.medium, -1)
        if tier < 0:
            self.skipped["medium"] += 1
            return None
        known = emap.drop(ev.block_hashes, tier)
        if not known:
            self.skipped["unknown_block"] += 1
            return None
        ids = np.frombuffer(b"".join(known), dtype="<u8").reshape(-1, 2)
        return model.Remove(next_id(), ns=ns, ids=ids, meta=holder(w.slot, tier))
