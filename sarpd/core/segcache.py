"""The decoded-segment cache: the store's segments kept between batches, least
recently used out first.

This is the reference (an OrderedDict); its native twin is `_cmatch.SegmentCache`
(sarpd/core/csrc/segcache.c), which the match kernel also reads directly: a batch's
candidates that the cache holds are found, and moved to the recent end, inside the
kernel's one call, without a call back into the store. `sarpd.core.native.Kernels.
segment_cache` picks one. Both keep the same order: `hits` moves each hit to the
recent end in the order asked; `put_many` puts each segment there in its order, then
drops the oldest while more than `capacity` are held (a smaller capacity takes effect
at the next `put_many`). `trace`, when a list, gets the id of every hit (`hits`' and
the kernel's): the bench's record of what a match read. Each method is one step for
the callers' threads: the reference's under the store's lock, the native one's under
the GIL (it calls no Python code while it changes its order).

`put_values` takes a multi-get's stored values: each that passes every check of
`decode_segment` for its id is held like a `put_many`'d segment. The native cache holds
it as the match kernel's view of the value (checked, not decoded: no Python object per
segment on the match path) and makes it a Segment with `decoder` only when Python code
asks for it (`get`, `hits`, `items`); the reference decodes it at once with `decoder`.
Either way Python code only ever sees Segments, the same ones.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from sarpd.errors import CorruptData, FormatVersionError

Segment = TypeVar("Segment")  # what is cached (sarpd.core.segment.Segment: not imported,
# that module imports sarpd.core.native, which builds this cache)


class SegmentCache(Generic[Segment]):
    """Segment id -> decoded segment, in least-recently-used order."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"segment cache capacity must be >= 0, got {capacity}")
        self._d: OrderedDict[int, Segment] = OrderedDict()
        self._capacity = capacity
        # a list the id of every hit is appended to (the bench's record of what a
        # match read: tools/bench/sarp_index.py), or None
        self.trace: list[int] | None = None
        # decoder(sid, value) -> Segment: what `put_values` makes of a stored value
        self.decoder: Callable[[int, bytes], Segment] | None = None

    @property
    def capacity(self) -> int:
        return self._capacity

    @capacity.setter
    def capacity(self, value: int) -> None:
        if value < 0:
            raise ValueError(f"segment cache capacity must be >= 0, got {value}")
        self._capacity = value

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, sid: object) -> bool:
        return sid in self._d

    def get(self, sid: int) -> Segment | None:
        """The segment, its place in the order unchanged (None: not held)."""
        return self._d.get(sid)

    def hits(self, sids: Iterable[int]) -> tuple[dict[int, Segment], list[int]]:
        """(the held ones among `sids`, each moved to the recent end in the order
        asked; the others, in order)."""
        got: dict[int, Segment] = {}
        missing: list[int] = []
        d = self._d
        get, recent = d.get, d.move_to_end
        for sid in sids:
            seg = get(sid)
            if seg is None:
                missing.append(sid)
            else:
                recent(sid)
                got[sid] = seg
                if self.trace is not None:
                    self.trace.append(sid)
        return got, missing

    def put_many(self, segs: Mapping[int, Segment]) -> None:
        """Each segment at the recent end, in order (replacing what its id held); then
        the oldest dropped while more than `capacity` are held."""
        d = self._d
        for sid, seg in segs.items():
            if seg is None:
                raise ValueError(f"put_many: segment {sid} is None (only decoded segments "
                                 "are cached)")
            d[sid] = seg
            d.move_to_end(sid)
        while len(d) > self._capacity:
            d.popitem(last=False)

    def put_values(self, sids: Sequence[int], values: Sequence[bytes | None]
                   ) -> dict[int, Segment]:
        """Each value (bytes; a stored segment) that passes `decoder`'s checks held at the
        recent end in order, then the trim (`put_many`); returns the held ones. The others
        (None, not bytes, refused: CorruptData, FormatVersionError) are the caller's."""
        decode = self.decoder
        if decode is None:
            raise RuntimeError("put_values: the segment cache has no decoder")
        if len(sids) != len(values):
            raise ValueError(f"put_values: {len(sids)} segment ids and {len(values)} values")
        got: dict[int, Segment] = {}
        d = self._d
        for sid, value in zip(sids, values, strict=True):
            if type(value) is not bytes:
                continue
            try:
                seg = decode(sid, value)
            except (CorruptData, FormatVersionError):
                continue
            got[sid] = d[sid] = seg
            d.move_to_end(sid)
        while len(d) > self._capacity:
            d.popitem(last=False)
        return got

    def items(self) -> list[tuple[int, Segment]]:
        """Every held segment, least recently used first."""
        return list(self._d.items())

    def clear(self) -> None:
        self._d.clear()
