"""`python -m tools.bench.cold_start --data-dir D`: sarp's recovery from a cold page cache.

For each run: every file of D is evicted from the OS page cache
(`posix_fadvise(DONTNEED)`: the next read comes from the disk; the interpreter and
its libraries stay cached, as on a machine that restarts only sarpd), then a fresh
Python process opens D, recovers (snapshot + change log) and answers one match. It
reports the time from the spawn to that answer (`spawn_s`) and, measured inside the
process after its imports, the open, the recovery and the first match. D is sarpd's
data directory (`D/<backend>/` and `D/snapshots/<backend>/`: what `sarpctl import`
and `python -m tools.bench.import_scale` leave) or the bench's (`D/snapshots/`: what
`sarpctl bench --recovery-only --data-dir` leaves); the
index settings (geometry, locators) are read from the data's manifest. One JSON
object on stdout: the runs and their medians.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[2]


def evict(root: Path) -> int:
    """Drop every file under `root` from the page cache; the bytes it covered."""
    total = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                total += os.fstat(fd).st_size
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return total


def recover_here(data_dir: Path, backend: str) -> dict[str, float]:
    """In this process: open, recover, one match; seconds of each (after imports)."""
    import numpy as np

    from sarpd.config import IndexConfig
    from sarpd.core import MANIFEST_KEY, SarpIndex, open_backend
    from sarpd.model import Match, SeqSpec

    t0 = time.perf_counter()
    be = open_backend(backend, data_dir / backend, cache_bytes=128 << 20)
    t1 = time.perf_counter()
    manifest = json.loads(be.get_many([MANIFEST_KEY])[0] or b"{}")
    cfg = dataclasses.replace(
        IndexConfig(), block_locators=bool(manifest.get("block_locators", True)),
        block_tokens=int(manifest.get("block_tokens", 16)),
        segment_blocks=int(manifest.get("segment_blocks", 64)))
    snaps = data_dir / "snapshots"
    ix = SarpIndex(be, cfg, snaps / backend if (snaps / backend).is_dir() else snaps)
    report = ix.recover()
    t2 = time.perf_counter()
    probe = np.zeros((64, 2), np.uint64)
    probe[:, 0] = np.arange(1, 65, dtype=np.uint64)
    ix.match_many([Match(0, SeqSpec("", hashes=probe))])
    t3 = time.perf_counter()
    blocks = ix.counters.blocks
    ix.close()
    return {"open_s": t1 - t0, "recover_s": t2 - t1, "first_match_s": t3 - t2,
            "in_process_s": t3 - t0, "blocks": float(blocks),
            "full_scan": float(report.full_scan)}


def one_run(data_dir: Path, backend: str) -> dict[str, float]:
    from tools.bench.spawn import compile_bytecode  # not in the child: it imports this module

    evicted = evict(data_dir)
    cmd = [sys.executable, "-m", "tools.bench.cold_start", "--data-dir", str(data_dir),
           "--backend", backend, "--here"]
    compile_bytecode()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    spawn = time.perf_counter() - t0
    return {**json.loads(out.stdout.strip().splitlines()[-1]), "spawn_s": spawn,
            "evicted_bytes": float(evicted)}


@click.command()
@click.option("--data-dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              required=True, help="A sarp data directory in the bench's layout.")
@click.option("--backend", default="rocksdb", show_default=True)
@click.option("--runs", type=click.IntRange(1), default=3, show_default=True,
              help="Cold starts to measure (each after evicting D's files).")
@click.option("--here", is_flag=True, hidden=True, help="(internal) one in-process start.")
def main(data_dir: Path, backend: str, runs: int, here: bool) -> None:
    """Time sarp's cold start on DATA_DIR: evict its files from the page cache, spawn a
    process, open, recover, answer the first match (module docstring)."""
    if here:
        click.echo(json.dumps(recover_here(data_dir, backend)))
        return
    results = []
    for i in range(runs):
        r = one_run(data_dir, backend)
        if r["full_scan"]:
            raise click.ClickException(f"{data_dir}: no usable snapshot, the start was a "
                                       "full scan (not a cold start's figure)")
        click.echo(f"run {i + 1}: spawn to first match {r['spawn_s']:.3f} s (open "
                   f"{r['open_s']:.3f}, recover {r['recover_s']:.3f}, match "
                   f"{r['first_match_s']:.4f}; {r['evicted_bytes'] / 1e9:.1f} GB evicted)",
                   err=True)
        results.append(r)
    med = {k: statistics.median(r[k] for r in results)
           for k in ("spawn_s", "in_process_s", "open_s", "recover_s", "first_match_s")}
    click.echo(json.dumps({"data_dir": str(data_dir), "backend": backend,
                           "blocks": results[0]["blocks"], "runs": results, "median": med}))


if __name__ == "__main__":
    main()
