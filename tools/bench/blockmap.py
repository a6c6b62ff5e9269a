"""The block map's throughput in C (sarpd.core._cmap) against its reference
(sarpd.core.blockmap): add, lookup and discard of the same blocks in the same batches.

    python -m tools.bench.blockmap
    python -m tools.bench.blockmap --blocks 200000 --batch 32 --runs 3 --json -

For each budget and batch size, a fresh map of each implementation gets `--blocks`
random ids (heads uint64, positions int64, as the writer passes them), in three timed
phases of batches:

    add      every block once, in order (the writer's commit: a batch's new blocks)
    lookup   every block once, shuffled (hits young and frozen: a frozen hit moves)
    discard  every block once, shuffled again

Budgets (generation `block_map_generation(budget)`: 65,536 for `fits` from ~260k
blocks): `fits` holds every block, nothing evicted, lookups hit (young or frozen);
`evicts` is a quarter of the blocks' frozen bytes: adds evict generations and spill
them, lookups miss three quarters. Figures: blocks/s of each phase (the fastest of `--runs`
fresh maps) and native/reference. Both maps' stats are compared after every phase:
a difference is an error, not a figure. Needs the extension built (`make setup`).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import click
import numpy as np
import numpy.typing as npt

from sarpd.core import native
from sarpd.core.blockmap import YOUNG_ENTRY_BYTES, BlockMap, block_map_generation
from sarpd.core.native import BlockMapLike
from sarpd.model import IdArray, U64Array

FROZEN_ENTRY_BYTES = 33  # blockmap.FROZEN_ENTRY_BYTES (not in its __all__)
PHASES = ("add", "lookup", "discard")


class Map(Protocol):
    def add(self, ids: IdArray, heads: U64Array, pos: npt.NDArray[np.int64]) -> object: ...
    def lookup(self, ids: IdArray) -> object: ...
    def discard(self, ids: IdArray) -> None: ...
    def stats(self) -> dict[str, int]: ...


def native_map() -> Callable[[int, int], BlockMapLike]:
    """The block map of the native kernels (sarpd.core.native's slot `map`:
    sarpd.core._cmap.BlockMap)."""
    kernel = native.pick().map
    if kernel is None:
        raise click.ClickException("sarpd.core._cmap is not loaded (not built, or "
                                   "SARPD_NO_EXTENSIONS=1): make setup")
    return kernel.BlockMap


def phases(make: Callable[[int, int], Map], budget: int, batch: int, ids: IdArray,
           heads: U64Array, pos: npt.NDArray[np.int64], orders: tuple[npt.NDArray[np.int64], ...]
           ) -> tuple[dict[str, float], list[dict[str, int]]]:
    """Seconds of each phase on a fresh map, and its stats after each."""
    m = make(budget, block_map_generation(budget))
    n = len(ids)
    secs: dict[str, float] = {}
    stats: list[dict[str, int]] = []
    t = time.perf_counter()
    for i in range(0, n, batch):
        m.add(ids[i : i + batch], heads[i : i + batch], pos[i : i + batch])
    secs["add"] = time.perf_counter() - t
    stats.append(m.stats())
    batches = [ids[o[i : i + batch]] for o in orders for i in range(0, n, batch)]
    half = len(batches) // 2
    t = time.perf_counter()
    for b in batches[:half]:
        m.lookup(b)
    secs["lookup"] = time.perf_counter() - t
    stats.append(m.stats())
    t = time.perf_counter()
    for b in batches[half:]:
        m.discard(b)
    secs["discard"] = time.perf_counter() - t
    stats.append(m.stats())
    return secs, stats


def run(blocks: int, batches: list[int], runs: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 2**64, (blocks, 2), dtype=np.uint64)
    heads = rng.integers(0, 2**64, blocks, dtype=np.uint64)
    pos = np.arange(blocks, dtype=np.int64) % (1 << 32)
    orders = (rng.permutation(blocks), rng.permutation(blocks))
    budgets = {"fits": blocks * YOUNG_ENTRY_BYTES + (1 << 20),
               "evicts": blocks * FROZEN_ENTRY_BYTES // 4}
    impls: dict[str, Callable[[int, int], Map]] = {"reference": BlockMap, "native": native_map()}
    rows: list[dict[str, Any]] = []
    for name, budget in budgets.items():
        for batch in batches:
            best: dict[str, dict[str, float]] = {}
            seen: dict[str, list[dict[str, int]]] = {}
            for impl, make in impls.items():
                for _ in range(runs):
                    secs, stats = phases(make, budget, batch, ids, heads, pos, orders)
                    mine = best.setdefault(impl, secs)
                    for p in PHASES:
                        mine[p] = min(mine[p], secs[p])
                    seen[impl] = stats
            if seen["native"] != seen["reference"]:
                raise click.ClickException(f"{name}, batch {batch}: the maps differ: "
                                           f"{seen['reference']} vs {seen['native']}")
            for p in PHASES:
                ref_rate = blocks / best["reference"][p]
                nat_rate = blocks / best["native"][p]
                rows.append({"budget": name, "budget_bytes": budget,
                             "generation": block_map_generation(budget), "batch": batch,
                             "phase": p, "reference_blocks_per_s": ref_rate,
                             "native_blocks_per_s": nat_rate, "ratio": nat_rate / ref_rate,
                             "spilled": seen["native"][0]["spilled"],
                             "hits": seen["native"][1]["hits"]})
    return rows


@click.command()
@click.option("--blocks", type=click.IntRange(1), default=1_000_000, show_default=True)
@click.option("--batch", "batches", type=click.IntRange(1), multiple=True, default=(32, 256),
              show_default=True, help="Blocks a call (repeat for several).")
@click.option("--runs", type=click.IntRange(1), default=1, show_default=True,
              help="Fresh maps per figure; the fastest is reported.")
@click.option("--seed", default=1, show_default=True)
@click.option("--json", "json_out", type=click.File("w"), default=None,
              help="Write the rows as JSON here (- for stdout).")
def main(blocks: int, batches: tuple[int, ...], runs: int, seed: int, json_out: Any) -> None:
    """Block map add/lookup/discard throughput, C vs the Python/numpy reference."""
    rows = run(blocks, list(batches), runs, seed)
    if json_out is not None:
        json.dump(rows, json_out)
        json_out.write("\n")
        return
    click.echo(f"{blocks:,} blocks; best of {runs} run(s); blocks/s")
    click.echo(f"{'budget':<8}{'gen':>7}{'batch':>7}  {'phase':<8}{'reference':>14}"
               f"{'native':>14}{'native/ref':>12}")
    for r in rows:
        click.echo(f"{r['budget']:<8}{r['generation']:>7}{r['batch']:>7}  {r['phase']:<8}"
                   f"{r['reference_blocks_per_s']:>14,.0f}{r['native_blocks_per_s']:>14,.0f}"
                   f"{r['ratio']:>11.1f}x", file=sys.stdout)


if __name__ == "__main__":
    main()
