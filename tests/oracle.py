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
