"""The indexer API's registry: indexers, registered workers and their holder ids
(sans-I/O; the daemon persists it, `to_json` / `from_json`).

An *indexer* is a (model_name, routing_group) pair with the block size its first
registration gave; it is a namespace of sarp's index (`namespace`). A *worker* is an
(instance_id, dp_rank) of one indexer: instance ids are 64-bit, sarp's holders carry a
16-bit worker field (`sarpd.events.mapping`'s metadata layout), so each worker gets a
`slot` (0..65535) for life: its blocks are held by ``slot << 48 | tier << 40``. A
registration names the worker's ZMQ endpoint (and a replay endpoint); a batch that
carries a data-parallel rank never registered makes a worker without one
(`dynamic`, as Dynamo's indexer stores it under that rank). Unregistering frees the
worker's slots once the daemon has cleared their blocks (`release`).

The rules, Dynamo's standalone indexer's (docs/HTTP.md):
- a pair's block size is fixed by its first registration; sarp's index has one block
  size (`block_tokens`), so any other is refused too (`Conflict`, the reason named);
- an (instance, dp_rank) registers once (`Conflict`); an instance serves one pair
  (`Conflict` if registered under another model or routing group);
- unregistering takes every rank of an instance off its pair (`NotFound` if it has
  none there); a pair whose last worker went is no indexer any more (`NotFound` to
  its queries), and registering again starts it empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from sarpd.errors import ConfigError, Conflict, NotFound

__all__ = ["FORMAT", "MAX_SLOTS", "Registry", "Worker", "namespace"]

MAX_SLOTS = 1 << 16  # the worker field of a holder
FORMAT = 1  # of `to_json`


def namespace(model: str, group: str) -> str:
    """The sarp namespace of an indexer (NUL cannot occur in a JSON string's UTF-8 of
    either name without being sent as \\u0000, which `sarpd.indexer.api` refuses)."""
    return f"indexer\0{model}\0{group}"


@dataclass(frozen=True, slots=True)
class Worker:
    model: str
    group: str
    instance_id: int
    dp_rank: int
    slot: int
    endpoint: str | None = None  # None: a dynamic rank (no listener of its own)
    replay_endpoint: str | None = None

    @property
    def key(self) -> tuple[str, str, int, int]:
        return (self.model, self.group, self.instance_id, self.dp_rank)


@dataclass
class Registry:
    """Owned by the daemon's indexer API; `version` counts changes (persist on change)."""

    block_tokens: int
    pairs: dict[tuple[str, str], int] = field(default_factory=dict)  # -> block_size
    workers: dict[tuple[str, str, int, int], Worker] = field(default_factory=dict)
    releasing: set[int] = field(default_factory=set)  # slots whose blocks are being cleared
    peers: list[str] = field(default_factory=list)  # /register_peer's (kept, not needed:
    # sarpd recovers from its own disk)
    version: int = 0
    _used: set[int] | None = field(default=None, repr=False, compare=False)  # slots taken
    _hint: int = field(default=0, repr=False, compare=False)  # where to look for a free one

    # -- lookups -----------------------------------------------------------------
    def block_size(self, model: str, group: str) -> int | None:
        return self.pairs.get((model, group))

    def require(self, model: str, group: str) -> int:
        """The pair's block size; `NotFound` (Dynamo's words) if no indexer has it."""
        size = self.pairs.get((model, group))
        if size is None:
            raise NotFound(f"no indexer for model={model} routing_group={group}")
        return size

    def of_instance(self, model: str, group: str) -> dict[int, list[Worker]]:
        """The pair's workers by instance id."""
        out: dict[int, list[Worker]] = {}
        for w in self.workers.values():
            if w.model == model and w.group == group:
                out.setdefault(w.instance_id, []).append(w)
        return out

    def by_slot(self) -> dict[int, Worker]:
        return {w.slot: w for w in self.workers.values()}

    def listed(self, model: str | None, group: str | None) -> Iterator[Worker]:
        """Registered workers (not dynamic ranks), filtered, in registration order."""
        for w in self.workers.values():
            if w.endpoint is None:
                continue
            if (model is None or w.model == model) and (group is None or w.group == group):
                yield w

    # -- changes -----------------------------------------------------------------
    def register(self, model: str, group: str, instance_id: int, dp_rank: int,
                 block_size: int, endpoint: str, replay_endpoint: str | None) -> Worker:
        size = self.pairs.get((model, group))
        if size is not None and size != block_size:
            raise Conflict(f"block_size mismatch for model={model} routing_group={group}: "
                           f"existing={size}, requested={block_size}")
        if block_size != self.block_tokens:
            raise Conflict(f"block_size: {block_size} is not this index's block size "
                           f"({self.block_tokens} tokens a block, sarpd's block_tokens)")
        for w in self.workers.values():
            if w.instance_id == instance_id and (w.model, w.group) != (model, group):
                raise Conflict(f"instance {instance_id} is already registered for "
                               f"model={w.model} routing_group={w.group}")
        key = (model, group, instance_id, dp_rank)
        old = self.workers.get(key)
        if old is not None and old.endpoint is not None:
            raise Conflict(f"instance {instance_id} dp_rank {dp_rank} already registered")
        worker = Worker(model, group, instance_id, dp_rank,
                        old.slot if old is not None else self._free_slot(),
                        endpoint, replay_endpoint)
        self.pairs[(model, group)] = block_size
        self.workers[key] = worker
        self.version += 1
        return worker

    def dynamic(self, model: str, group: str, instance_id: int, dp_rank: int) -> Worker:
        """The worker of a rank an engine's batch names: registered, or made now."""
        key = (model, group, instance_id, dp_rank)
        w = self.workers.get(key)
        if w is None:
            w = self.workers[key] = Worker(model, group, instance_id, dp_rank, self._free_slot())
            self.version += 1
        return w

    def unregister(self, model: str, group: str, instance_id: int) -> list[Worker]:
        """Take every rank of the instance off the pair (Dynamo's indexer ignores a
        `dp_rank` here too); their slots are `releasing` until the daemon cleared their
        blocks (`release`). The pair's indexer goes with its last worker."""
        gone = [w for w in self.workers.values()
                if (w.model, w.group, w.instance_id) == (model, group, instance_id)]
        if not any(w.endpoint is not None for w in gone):
            elsewhere = next((w for w in self.workers.values()
                              if w.instance_id == instance_id and w.endpoint is not None), None)
            if elsewhere is not None:
                raise NotFound(f"instance {instance_id} is registered for "
                               f"model={elsewhere.model} routing_group={elsewhere.group}")
            raise NotFound(f"instance {instance_id} not found")
        for w in gone:
            del self.workers[w.key]
            self.releasing.add(w.slot)
        if not any((w.model, w.group) == (model, group) for w in self.workers.values()):
            del self.pairs[(model, group)]
        self.version += 1
        return gone

    def release(self, slots: Iterable[int]) -> None:
        slots = set(slots)
        self.releasing.difference_update(slots)
        self._used = None  # recounted at the next registration
        self.version += 1

    def add_peer(self, url: str) -> None:
        if url not in self.peers:
            self.peers.append(url)
            self.version += 1

    def remove_peer(self, url: str) -> None:
        if url not in self.peers:
            raise NotFound("peer not found")
        self.peers.remove(url)
        self.version += 1

    def _free_slot(self) -> int:
        """The next free slot (a registered worker's or a releasing slot is not free)."""
        used = {w.slot for w in self.workers.values()} | self.releasing \
            if self._used is None else self._used
        self._used = used
        if len(used) >= MAX_SLOTS:
            raise Conflict(f"workers: {len(used)} registered workers reach the limit "
                           f"({MAX_SLOTS}: the holder's worker field is 16 bits)")
        slot = self._hint
        while slot in used:
            slot = (slot + 1) % MAX_SLOTS
        self._hint = (slot + 1) % MAX_SLOTS
        used.add(slot)
        return slot

    # -- persistence -------------------------------------------------------------
    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "block_tokens": self.block_tokens,
            "pairs": [[m, g, s] for (m, g), s in self.pairs.items()],
            "workers": [asdict(w) for w in self.workers.values()],
            "releasing": sorted(self.releasing),
            "peers": self.peers,
        }
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, block_tokens: int, where: str) -> Registry:
        """A registry read back; a `ConfigError` naming `where` if it is not one."""
        try:
            doc = json.loads(raw)
            if doc.get("format") != FORMAT:
                raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT}")
            reg = cls(block_tokens)
            for m, g, s in doc["pairs"]:
                reg.pairs[(str(m), str(g))] = int(s)
            for d in doc["workers"]:
                w = Worker(**d)
                reg.workers[w.key] = w
            reg.releasing = {int(s) for s in doc["releasing"]}
            reg.peers = [str(u) for u in doc.get("peers", [])]
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{where}: not an indexer registry ({exc})") from exc
        if int(doc["block_tokens"]) != block_tokens:
            raise ConfigError(f"{where}: registered with block_tokens {doc['block_tokens']}, "
                              f"the index has {block_tokens}")
        return reg
