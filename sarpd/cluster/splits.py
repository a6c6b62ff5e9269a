"""A split made by its owner (issue 27): what the shard holding a head's region reads
from its index when the split is applied in its log, and the writes that give every
other shard the head. Synchronous: it runs in the owner's worker, between batches.

`prepare_split(index, ns, head, owner)`:
1. The head must be wholly present (a match of it answers all its blocks); a head
   with a hole is not split now (None): blocks past the hole would stay on the owner
   alone, and a later refill would bring them back there only.
2. `kept`: every branch stored after the head (`sarpd.core.branches`): they stay on
   the owner, since the branches under them live there.
3. `seed`: writes that give another shard the head's blocks with exactly the owner's
   holders, read from a match with `spans` (each holder's maximal runs): per holder,
   an insert of the head up to the end of its last run with its meta as one more
   holder (protocol 2), then a removal of that holder from the blocks between its
   runs. Applied on a shard that holds none of the head's blocks past the heads it
   already has (no write reached them: before the split they lived on the owner
   only), they leave each block with the owner's holders. Ids are sent in their
   external form (`hashes`: the namespace's salt undone), so they name the same
   blocks whatever form the head was written in.

Every replica of the owner computes the same split from the same prefix of its log.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from sarpd.cluster.shardmap import Split, keys_of
from sarpd.core import SarpIndex, branches, salt_ids
from sarpd.model import IdArray, Insert, Match, MatchResult, Remove, SeqSpec

__all__ = ["Prepared", "prepare_split", "seed_writes"]


@dataclass(frozen=True, slots=True, eq=False)
class Prepared:
    split: Split
    seed: list[Insert | Remove]  # for every shard but the owner, in this order


def prepare_split(index: SarpIndex, ns: str, head: IdArray, owner: int) -> Prepared | None:
    """The split of `head` ((d, 2) internal ids) by shard `owner`, or None when the
    head is not wholly present on it."""
    ext = salt_ids(ns, head)
    [got] = index.match_many([Match(0, SeqSpec(ns, hashes=ext), spans=True)])
    if not isinstance(got, MatchResult) or got.blocks < len(head) or got.spans is None:
        return None
    kept = frozenset(keys_of(branches(index, head)))
    return Prepared(Split(tuple(keys_of(head)), owner, kept), seed_writes(ns, ext, got.spans))


def seed_writes(ns: str, ext: IdArray, spans: list[tuple[int, int, int]]
                ) -> list[Insert | Remove]:
    """Writes that give a shard holding none of these blocks the holders `spans`
    ((meta, start, blocks) maximal runs) over the blocks `ext` (external ids)."""
    runs: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for meta, start, n in spans:
        runs[meta].append((start, start + n))
    inserts: list[Insert | Remove] = []
    removes: list[Insert | Remove] = []
    for meta in sorted(runs):
        mine = sorted(runs[meta])
        end = mine[-1][1]
        inserts.append(Insert(0, SeqSpec(ns, hashes=ext[:end]), meta=meta, add_holder=True))
        held = np.zeros(end, dtype=bool)
        for a, b in mine:
            held[a:b] = True
        gaps = np.nonzero(~held)[0]
        if len(gaps):
            removes.append(Remove(0, ns=ns, ids=ext[gaps], meta=meta))
    return inserts + removes
