"""The first-mismatch verifier alone: the numpy reference against the C/AVX2 extension.

    python -m tools.bench.verifier --pairs 256 --blocks 64

Times `first_mismatch_many` on the same random candidate/query pairs (each query
equal to its candidate up to a random first mismatch, as on the match path) with
both implementations in one run, checks they agree, and prints microseconds per call
and the ratio. The C extension is optional: without it only numpy is timed.
"""

from __future__ import annotations

import timeit

import click
import numpy as np

from sarpd.core.verify import implementations
from sarpd.model import IdArray


def pairs(n: int, blocks: int, seed: int) -> tuple[list[IdArray], list[IdArray]]:
    rng = np.random.default_rng(seed)
    cands, queries = [], []
    for _ in range(n):
        c = rng.integers(0, 2**63, (blocks, 2), dtype=np.uint64)
        q = c.copy()
        cut = int(rng.integers(0, blocks + 1))
        if cut < blocks:
            q[cut, int(rng.integers(0, 2))] ^= np.uint64(1)
        cands.append(c)
        queries.append(q)
    return cands, queries


@click.command()
@click.option("--pairs", "n", default=256, show_default=True, help="Pairs per call.")
@click.option("--blocks", default=64, show_default=True, help="Ids per pair.")
@click.option("--repeat", default=200, show_default=True, help="Calls timed per implementation.")
def main(n: int, blocks: int, repeat: int) -> None:
    """Microseconds per `first_mismatch_many` call: numpy reference vs C extension."""
    cands, queries = pairs(n, blocks, 0)
    impls = implementations()
    if "c" not in impls:
        click.echo("C extension not built (or SARPD_NO_EXTENSIONS=1): timing numpy only",
                   err=True)
    want = impls["numpy"](cands, queries)
    us = {}
    for name, fn in impls.items():
        if list(fn(cands, queries)) != list(want):
            raise click.ClickException(f"{name} disagrees with the numpy reference")
        calls = max(1, repeat // 10)
        best = min(timeit.repeat(lambda: fn(cands, queries), number=calls, repeat=10))  # noqa: B023
        us[name] = best / calls * 1e6
        click.echo(f"{name:>6}: {us[name]:9.1f} us per call ({n} pairs x {blocks} ids)")
    if "c" in us:
        click.echo(f"C is {us['numpy'] / us['c']:.1f}x faster than numpy")


if __name__ == "__main__":
    main()
