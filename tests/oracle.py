"""A brute-force model of PROTOCOL.md's semantics: longest whole-block prefix
matching over a dict of present blocks keyed by (namespace, token prefix)."""

from __future__ import annotations

from dataclasses import dataclass, field

BT = 16


def _key(ns: str, tokens: tuple[int, ...], i: int) -> tuple[str, tuple[int, ...]]:
    return ns, tokens[: BT * (i + 1)]


@dataclass
class Oracle:
    blocks: dict[tuple[str, tuple[int, ...]], int] = field(default_factory=dict)

    def match(self, ns: str, tokens: tuple[int, ...]) -> list[int]:
        metas = []
        for i in range(len(tokens) // BT):
            m = self.blocks.get(_key(ns, tokens, i))
            if m is None:
                break
            metas.append(m)
        return metas

    def insert(self, ns: str, tokens: tuple[int, ...], meta: list[int],
               first: int = 0) -> tuple[int, int, int]:
        """Blocks [first, n) of `tokens` (those before `first` are the parent's prefix)."""
        n = len(tokens) // BT
        matched, new, matching = 0, 0, True
        for i in range(first, n):
            k = _key(ns, tokens, i)
            if k in self.blocks:
                matched += matching
            else:
                matching = False
                self.blocks[k] = meta[i - first]
                new += 1
        return n - first, new, matched

    def present(self, ns: str, tokens: tuple[int, ...], i: int) -> bool:
        return _key(ns, tokens, i) in self.blocks

    def remove(self, ns: str, tokens: tuple[int, ...], start: int,
               only: list[int] | None = None) -> int:
        removed = 0
        positions = only if only is not None else range(start, len(tokens) // BT)
        for i in positions:
            if self.blocks.pop(_key(ns, tokens, i), None) is not None:
                removed += 1
        return removed

    def clear(self, ns: str, mask: int, value: int) -> int:
        gone = [k for k, m in self.blocks.items() if k[0] == ns and (m & mask) == value]
        for k in gone:
            del self.blocks[k]
        return len(gone)


@dataclass
class HolderOracle:
    """PROTOCOL.md "Holders": each present block has a set of holders (meta words)."""

    blocks: dict[tuple[str, tuple[int, ...]], set[int]] = field(default_factory=dict)

    def insert(self, ns: str, tokens: tuple[int, ...], holder: int,
               add: bool) -> tuple[int, int, int]:
        n = len(tokens) // BT
        matched, new, matching = 0, 0, True
        for i in range(n):
            held = self.blocks.get(_key(ns, tokens, i))
            if held:
                matched += matching
                if add:
                    held.add(holder)
            else:
                matching = False
                self.blocks[_key(ns, tokens, i)] = {holder}
                new += 1
        return n, new, matched

    def remove(self, ns: str, tokens: tuple[int, ...], start: int, holder: int | None) -> int:
        removed = 0
        for i in range(start, len(tokens) // BT):
            held = self.blocks.get(_key(ns, tokens, i))
            if not held or (holder is not None and holder not in held):
                continue
            held.difference_update(held if holder is None else {holder})
            if not held:
                del self.blocks[_key(ns, tokens, i)]
                removed += 1
        return removed

    def clear(self, ns: str, mask: int, value: int) -> int:
        removed = 0
        for k in [k for k in self.blocks if k[0] == ns]:
            self.blocks[k] = {h for h in self.blocks[k] if h & mask != value}
            if not self.blocks[k]:
                del self.blocks[k]
                removed += 1
        return removed

    def matched(self, ns: str, tokens: tuple[int, ...]) -> list[set[int]]:
        """The holders of each block of the matched prefix."""
        run: list[set[int]] = []
        for i in range(len(tokens) // BT):
            held = self.blocks.get(_key(ns, tokens, i))
            if not held:
                break
            run.append(held)
        return run

    def match(self, ns: str, tokens: tuple[int, ...],
              k: int) -> tuple[list[int], list[tuple[int, int]]]:
        """(each matched block's answer, the top k holders)."""
        run = self.matched(ns, tokens)
        length = {}
        for h in set().union(*run) if run else set():
            r = 0
            while r < len(run) and h in run[r]:
                r += 1
            length[h] = r
        meta = [min(b, key=lambda h: (-length[h], h)) for b in run]
        top = sorted(((h, r) for h, r in length.items() if r), key=lambda x: (-x[1], x[0]))
        return meta, top[:k]

    def spans(self, ns: str, tokens: tuple[int, ...]) -> list[tuple[int, int, int]]:
        """(holder, start, blocks) of each holder's maximal runs in the matched prefix."""
        return spans_of(self.matched(ns, tokens))

    @property
    def holdings(self) -> int:
        return sum(len(v) for v in self.blocks.values())


def spans_of(blocks: list[set[int]]) -> list[tuple[int, int, int]]:
    """Brute force: per holder (ascending), its runs over `blocks` (a set per block)."""
    out = []
    for h in sorted(set().union(*blocks) if blocks else set()):
        start = None
        for i, held in enumerate([*blocks, set()]):
            if h in held and start is None:
                start = i
            elif h not in held and start is not None:
                out.append((h, start, i - start))
                start = None
    return out
