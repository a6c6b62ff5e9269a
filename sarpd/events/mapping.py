"""Engines' events (vLLM, SGLang) -> sarpd requests (sans-I/O): namespaces, metadata
bits, the ops.

Metadata (one uint64 per block, PROTOCOL.md `meta`)::

    bits 63..48  worker id (0..65535, `--worker`)
    bits 47..40  tier: 0 GPU (also: no medium given), 1 CPU (SGLang's CPU_PINNED),
                 2 storage (DISK, SSD, LOCALDISK, NVME, and vLLM's native offload
                 medium STORAGE, with its older names FS and OBJ), 255 any other
                 medium name
    bits 39..0   zero (reserved)

so ``clear`` with ``mask=WORKER_MASK, value=worker << 48`` drops one worker and
``mask=WORKER_MASK | TIER_MASK`` one tier of one worker (`worker_clear`).

Namespace of a block: the `--ns` template (``{worker}`` and ``{medium}`` expand;
default empty), then ``lora=NAME`` when the event names a LoRA adapter, then
``salt=SALT`` for a cache salt, joined by ``/`` (empty parts left out): for example
``llama3/lora=sql/salt=tenant7``. vLLM already mixes LoRA name, salt and multimodal
ids into its block hashes; the namespace keeps adapters and tenants apart in sarp
too and tells a router where to look. The cache salt is the string extra key of a
sequence's first block that is not the LoRA name, or its typed ``cache_salt`` key
(vLLM adds the salt to block 0 only), so continuations (events with a parent)
inherit their parent's namespace. SGLang sends its salt with the event (the decoder
makes it that typed key: `sarpd.events.schema`).

Tiers. vLLM's own prefix cache reports the GPU tier; KV connectors that offload
(vLLM's OffloadingConnector, LMCache, ...) report other media, often as bare stores
(no parent, no token ids) whose positions in their sequences are unknown. Those
are never indexed (positions are what sarp indexes). And since a block has one id
in every tier, a CPU eviction would remove the block a GPU still holds: so events
of tiers other than the GPU are indexed only when the template contains
``{medium}`` (one namespace per tier); otherwise they are ignored (counted). A
secondary tier names itself in ``ownership``: ``{medium}`` then expands to
``TIER:OWNERSHIP`` (``disk:fs0``), one namespace per tier instance, so that one
instance's evictions never remove another's blocks.

Skipped on purpose (counted as ``ignored``, by reason, `Translated.reason`):
``group`` (another KV-cache group), ``tier`` (a tier other than the GPU without
``{medium}``), ``remote`` (``locality`` other than LOCAL or unsaid: a block in a
store remote from this worker, e.g. a shared object store, is not this worker's
block; fail-closed, so an unknown locality is not local either; SGLang says no
locality and names its shared pool by the medium ``EXTERNAL``: remote too),
``partial`` (a partial-block store: `block_size` smaller than the engine's block
size, a prefix boundary inside a block, which is not a whole position),
``block_size`` (larger than a configured engine block size), ``unanchored`` (no
parent and no token ids), ``empty`` (no hashes), ``unknown_event``. Indexed as they
come: stores with ``lookahead_token_ids`` (their hashes also cover the tokens after
each block, so they chain among themselves; a router must hash the same way,
docs/BRIDGE.md) and stores with a ``session_id`` (which names the request, not an
owner).

The engine's block size (the partial-block test) is `block_size` when configured
(`--block-size`), else the largest `block_size` of the indexed group's GPU stores
seen so far: a partial store that comes before any full one is taken for a full
one until then, so configure it for exactness from the first event.

`BlockRemoved` names bare hashes without LoRA or salt, so the translator remembers
the namespace of every block it stored outside the plain namespace (``hash -> ns``,
bounded). After a restart of the bridge that map is empty: removals of hashes it
does not know go to every namespace it has used (`known`, persisted with the
position) until the map has seen a full cycle (`trust_map`).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from sarpd.errors import ConfigError
from sarpd.events.schema import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    ExtraKey,
    OtherEvent,
)

__all__ = ["CANARY_NS", "DEFAULT_NS_MAP", "LOCAL", "MAX_CANARIES", "MAX_WORKER",
           "SHARED_MEDIA", "TIERS", "TIER_MASK", "TIER_NAMES", "TIER_OTHER", "TIER_SHIFT",
           "WORKER_MASK", "WORKER_SHIFT", "CanaryOp", "ClearOp", "InsertOp", "Op",
           "RemoveOp", "Translated", "Translator", "block_meta", "cache_salt",
           "is_local", "join_ns", "tier_code", "worker_clear"]

WORKER_SHIFT = 48
WORKER_MASK = 0xFFFF << WORKER_SHIFT
TIER_SHIFT = 40
TIER_MASK = 0xFF << TIER_SHIFT
MAX_WORKER = 0xFFFF
TIER_OTHER = 255
TIERS = {
    "GPU": 0,
    "CPU": 1,
    "CPU_PINNED": 1,  # SGLang's host tier (HiCache L2)
    **dict.fromkeys(("DISK", "SSD", "LOCALDISK", "NVME", "STORAGE", "FS", "OBJ"), 2),
}
TIER_NAMES = {0: "gpu", 1: "cpu", 2: "disk", TIER_OTHER: "other"}
LOCAL = "LOCAL"
# media that name a pool shared by several engines, not this worker's own tier: SGLang's
# EXTERNAL (HiCache L4, e.g. Mooncake), whose events say no locality
SHARED_MEDIA = frozenset({"EXTERNAL"})
DEFAULT_NS_MAP = 1 << 20


def tier_code(medium: str | None) -> int:
    if medium is None:
        return 0
    code = _TIER_OF.get(medium)
    if code is None:
        code = TIERS.get(medium.upper(), TIER_OTHER)
        if len(_TIER_OF) < 1024:  # the names engines send: a handful
            _TIER_OF[medium] = code
    return code


_TIER_OF: dict[str, int] = {}  # medium name as sent -> tier (tier_code's memo)


def block_meta(worker: int, medium: str | None) -> int:
    return (worker << WORKER_SHIFT) | (tier_code(medium) << TIER_SHIFT)


def worker_clear(worker: int, medium: str | None = None) -> tuple[int, int]:
    """(mask, value) of `clear` for every block of `worker` (of one tier if given)."""
    if medium is None:
        return WORKER_MASK, worker << WORKER_SHIFT
    return WORKER_MASK | TIER_MASK, block_meta(worker, medium)


def is_local(locality: str | None, medium: str | None = None) -> bool:
    """Fail-closed: only LOCAL, or an unsaid locality on a medium that is not a shared
    pool (`SHARED_MEDIA`), is this worker's (module doc)."""
    if locality is None:
        return medium is None or medium.upper() not in SHARED_MEDIA
    return locality.upper() == LOCAL


def cache_salt(first_extra_keys: tuple[object, ...] | None, lora_name: str | None) -> str:
    """The cache salt in a first block's extra keys ('' when none): its typed
    ``cache_salt`` keys if it has any, else its strings other than the LoRA name."""
    if not first_extra_keys:
        return ""
    typed = [k for k in first_extra_keys if isinstance(k, ExtraKey)]
    if typed:
        return ",".join(str(k.value) for k in typed if k.kind == "cache_salt")
    strs = [k for k in first_extra_keys if isinstance(k, str)]
    if lora_name is not None and lora_name in strs:
        strs.remove(lora_name)
    return ",".join(strs)


def join_ns(base: str, lora_name: str | None, salt: str) -> str:
    parts = [base] if base else []
    if lora_name:
        parts.append(f"lora={lora_name}")
    if salt:
        parts.append(f"salt={salt}")
    return "/".join(parts)


# ------------------------------------------------------------------------------ ops


class InsertOp(msgspec.Struct, frozen=True):
    ns: str
    hashes: tuple[int, ...]
    parent: int | None
    meta: int


class RemoveOp(msgspec.Struct, frozen=True):
    ns: str
    ids: tuple[int, ...]
    meta: int | None = None  # holders: take only this holder off (None: every holder)


class CanaryOp(msgspec.Struct, frozen=True):
    """The hash-agreement check (module doc, "Holders"): the engine's hash of a first
    block, under sarp's own token hash of that block, in CANARY_NS."""

    ns: str
    tokens: tuple[int, ...]
    engine_hash: int


class ClearOp(msgspec.Struct, frozen=True):
    ns: str
    mask: int
    value: int


Op = InsertOp | RemoveOp | ClearOp | CanaryOp
CANARY_NS = "sarp-hashcheck"
MAX_CANARIES = 4096  # distinct first blocks checked per bridge run


class Translated(msgspec.Struct, frozen=True):
    """The ops of one event; `kind` is the event's counter name."""

    kind: str  # "stored", "removed", "cleared", "ignored"
    ops: tuple[Op, ...]
    # an insert whose namespace was guessed (its parent unknown to a restarted
    # translator): the other namespaces its parent may be in, to try in order
    alternatives: tuple[str, ...] = ()
    reason: str = ""  # why an event is ignored (module doc), "" otherwise
    lookahead: bool = False  # a store whose hashes cover tokens past its blocks


def _ignored(reason: str) -> Translated:
    return Translated("ignored", (), reason=reason)


class Translator:
    """Stateful (hash -> namespace map, namespaces used, the engine's block size)
    but pure: no I/O."""

    def __init__(
        self,
        worker: int,
        ns_template: str = "",
        group: int = 0,
        known: Iterable[str] = (),
        max_map: int = DEFAULT_NS_MAP,
        ns_of: dict[int, str] | None = None,
        block_size: int = 0,
        holders: bool = True,
    ) -> None:
        if not 0 <= worker <= MAX_WORKER:
            raise ConfigError(f"worker: {worker} is outside 0..{MAX_WORKER}")
        if block_size < 0:
            raise ConfigError(f"block_size: {block_size} is negative (0: learn it)")
        try:
            ns_template.format(worker=worker, medium="gpu")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(
                f"ns: {ns_template!r} is not a valid template ({exc!r}); only {{worker}} "
                "and {medium} expand, write {{ and }} for literal braces"
            ) from exc
        self.worker = worker
        self.ns_template = ns_template
        self.group = group
        self.known: set[str] = set(known)
        self.ns_of: dict[int, str] = dict(ns_of or {})
        self.max_map = max_map
        # complete: a fresh bridge has seen every store; a map saved at a clean stop
        self.trust_map = not self.known or ns_of is not None
        self.per_tier = "{medium}" in ns_template
        # holders (protocol 2): (worker, tier) is a block's holder, so every tier can
        # share a namespace and a removal takes off this worker's holding only
        self.holders = holders
        self._canaries: set[tuple[int, ...]] = set()
        self.block_size = block_size  # the engine's (configured); 0: learn
        self.seen_block_size = 0  # the largest of the group's GPU stores so far

    def base_ns(self, medium: str | None, ownership: str | None = None) -> str:
        tier = TIER_NAMES.get(tier_code(medium), "other")
        if ownership and self.per_tier:
            tier = f"{tier}:{ownership}"
        return self.ns_template.format(worker=self.worker, medium=tier)

    def translate(self, batch: EventBatch) -> list[Translated]:
        return [self.event(e) for e in batch.events]

    def unwanted(self, group_idx: int | None, medium: str | None,
                 locality: str | None) -> str:  # fmt: skip
        """Why an event of this group, tier and locality is not indexed ('' if it is):
        another KV-cache group; unless the template has a namespace per tier, a tier
        other than the GPU; a locality other than this worker's (module doc)."""
        if (group_idx or 0) != self.group:
            return "group"
        if not self.per_tier and not self.holders and tier_code(medium) != 0:
            return "tier"
        return "" if is_local(locality, medium) else "remote"

    def event(self, ev: Event) -> Translated:
        if isinstance(ev, BlockStored):
            return self._stored_event(ev)
        if isinstance(ev, BlockRemoved):
            reason = self.unwanted(ev.group_idx, ev.medium, ev.locality)
            return _ignored(reason) if reason else Translated("removed", self._remove(ev))
        if isinstance(ev, AllBlocksCleared):
            return Translated("cleared", self.clear_all())
        assert isinstance(ev, OtherEvent)
        return _ignored("unknown_event")

    def _stored_event(self, ev: BlockStored) -> Translated:
        reason = self.unwanted(ev.group_idx, ev.medium, ev.locality)
        if not reason and not ev.block_hashes:
            reason = "empty"
        if not reason and ev.parent is None and ev.num_tokens == 0:
            reason = "unanchored"  # positions unknown: see module doc
        if not reason:
            reason = self._block_size_check(ev)
        if reason:
            return _ignored(reason)
        guessed = ev.parent is not None and ev.parent not in self.ns_of and not self.trust_map
        op = self._store(ev)
        alts = tuple(sorted(self.known - {op.ns})) if guessed else ()
        ops: tuple[Op, ...] = (op, *self._canary(ev, op.ns))
        return Translated("stored", ops, alts, lookahead=ev.lookahead > 0)

    def _canary(self, ev: BlockStored, ns: str) -> tuple[CanaryOp, ...]:
        """One check per distinct first block (bounded), in a shared namespace only:
        engines that hash alike give one engine hash to the same tokens."""
        tokens = ev.first_tokens
        if (not self.holders or not tokens or ev.lookahead or ev.first_extra_keys
                or tokens in self._canaries
                or len(self._canaries) >= MAX_CANARIES or "{worker}" in self.ns_template):
            return ()
        self._canaries.add(tokens)
        return (CanaryOp(f"{CANARY_NS}/{ns}" if ns else CANARY_NS, tokens,
                         ev.block_hashes[0]),)

    def _block_size_check(self, ev: BlockStored) -> str:
        """'partial' for a partial-block store (a GPU store of fewer tokens per hash
        than the engine's block size), 'block_size' for more than a configured one."""
        if tier_code(ev.medium) != 0:
            return ""
        if self.block_size:
            if ev.block_size < self.block_size:
                return "partial"
            return "block_size" if ev.block_size > self.block_size else ""
        self.seen_block_size = max(self.seen_block_size, ev.block_size)
        return "partial" if ev.block_size < self.seen_block_size else ""

    def _store(self, ev: BlockStored) -> InsertOp:
        base = self.base_ns(ev.medium, ev.ownership)
        if ev.parent is not None and ev.parent in self.ns_of:
            ns = self.ns_of[ev.parent]
        elif ev.parent is not None:
            ns = join_ns(base, ev.lora_name, "")
        else:
            ns = join_ns(base, ev.lora_name, cache_salt(ev.first_extra_keys, ev.lora_name))
        self._use(ns)
        if ns != base:
            for h in ev.block_hashes:
                self.ns_of.pop(h, None)
                self.ns_of[h] = ns
            while len(self.ns_of) > self.max_map:  # oldest first (dict order)
                self.ns_of.pop(next(iter(self.ns_of)))
                self.trust_map = False
        elif self.ns_of:  # a block stored again in the plain namespace
            for h in ev.block_hashes:
                self.ns_of.pop(h, None)
        return InsertOp(ns, ev.block_hashes, ev.parent, block_meta(self.worker, ev.medium))

    def learn(self, ns: str, hashes: tuple[int, ...]) -> None:
        """`hashes` turned out to live in `ns` (an insert re-routed after a restart)."""
        for h in hashes:
            self.ns_of[h] = ns

    def _remove(self, ev: BlockRemoved) -> tuple[Op, ...]:
        base = self.base_ns(ev.medium, ev.ownership)
        by_ns: dict[str, list[int]] = {}
        unknown: list[int] = []
        if not self.ns_of:  # nothing stored outside the plain namespace
            unknown = list(ev.block_hashes)
        for h in ev.block_hashes if self.ns_of else ():
            ns = self.ns_of.pop(h, None)
            if ns is not None:
                by_ns.setdefault(ns, []).append(h)
            else:
                unknown.append(h)
        if unknown:
            targets = [base] if self.trust_map else sorted(self.known | {base})
            for ns in targets:
                by_ns.setdefault(ns, []).extend(unknown)
        holder = block_meta(self.worker, ev.medium) if self.holders else None
        return tuple(RemoveOp(ns, tuple(ids), holder) for ns, ids in by_ns.items())

    def clear_all(self) -> tuple[Op, ...]:
        """`clear` of this worker's blocks in every namespace it has used."""
        mask, value = worker_clear(self.worker)
        self.ns_of.clear()
        self.trust_map = True
        self._use(self.base_ns(None))
        return tuple(ClearOp(ns, mask, value) for ns in sorted(self.known))

    def _use(self, ns: str) -> None:
        self.known.add(ns)
