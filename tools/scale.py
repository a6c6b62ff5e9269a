"""Recovery time and directory memory at scale (a quick measurement, not the harness).

    python -m tools.scale --blocks 1000000 --data-dir /tmp/sarp-scale

Builds an index of about N blocks on RocksDB from synthetic multi-turn sessions
(shared system prompts, turns of 100-1,500 tokens), snapshots it, then measures in
fresh processes: recovery from the snapshot (to the first answered match), recovery
by full scan (snapshot removed), and the directory's bytes per indexed block.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import click
import numpy as np

from sarpd.config import IndexConfig
from sarpd.core import SarpIndex, open_backend
from sarpd.model import Insert, Match, SeqSpec

BT = 16


def _open(data: Path, backend: str) -> SarpIndex:
    return SarpIndex(open_backend(backend, data / backend, cache_bytes=64 << 20), IndexConfig(),
                     data / "snapshots")


def build(data: Path, backend: str, blocks: int, seed: int, batch: int = 256) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 32000, BT * int(rng.integers(20, 120))).astype(np.uint32)
               for _ in range(16)]
    ix = _open(data, backend)
    ix.recover()
    t0, done, rid = time.perf_counter(), 0, 0
    sessions: list[np.ndarray] = []
    with click.progressbar(length=blocks, label="inserting") as bar:
        while done < blocks:
            ops = []
            for _ in range(batch):
                if not sessions or rng.random() < 0.2 or len(sessions) < 64:
                    sessions.append(prompts[int(rng.integers(0, len(prompts)))])
                i = int(rng.integers(0, len(sessions)))
                turn = rng.integers(0, 32000, int(rng.integers(100, 1500))).astype(np.uint32)
                seq = np.concatenate([sessions[i][: len(sessions[i]) // BT * BT], turn])
                if len(seq) > 64 * 1024:
                    seq = turn
                sessions[i] = seq
                ops.append(Insert(rid, SeqSpec("", tokens=seq), meta=rid))
                rid += 1
            before = ix.counters.blocks
            ix.write_many(ops)
            bar.update(ix.counters.blocks - before)
            done = ix.counters.blocks
    build_s = time.perf_counter() - t0
    stats = ix.stats()
    ix.snapshot()
    ix.close()
    return {"build_s": build_s, "blocks": float(stats["blocks"]),
            "segments": float(stats["segments"]),
            "directory_bytes": float(stats["directory_bytes"]),
            "directory_bytes_per_block": float(stats["directory_bytes_per_block"])}


def recover_once(data: Path, backend: str) -> dict[str, float]:
    """Run in a fresh process: open, recover, answer one match."""
    t0 = time.perf_counter()
    ix = _open(data, backend)
    rep = ix.recover()
    ix.match_many([Match(0, SeqSpec("", tokens=np.zeros(BT * 4, np.uint32)))])
    total = time.perf_counter() - t0
    ix.close()
    return {"recover_s": rep.seconds, "to_first_match_s": total,
            "full_scan": float(rep.full_scan), "rerouted": float(rep.segments_rerouted)}


@click.command()
@click.option("--blocks", default=1_000_000, show_default=True, help="Blocks to index.")
@click.option("--data-dir", type=click.Path(path_type=Path), default=Path("/tmp/sarp-scale"),
              show_default=True, help="Scratch directory (wiped first).")
@click.option("--backend", default="rocksdb", show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--recover-only", is_flag=True, help="(internal) measure one recovery and exit.")
def main(blocks: int, data_dir: Path, backend: str, seed: int, recover_only: bool) -> None:
    """Measure recovery time and directory bytes per block at N indexed blocks."""
    if recover_only:
        print(json.dumps(recover_once(data_dir, backend)))
        return
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    out: dict[str, object] = {"build": build(data_dir, backend, blocks, seed)}

    def measure() -> dict[str, float]:
        cmd = [sys.executable, "-m", "tools.scale", "--recover-only", "--data-dir",
               str(data_dir), "--backend", backend]
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        return dict(json.loads(res.stdout.strip().splitlines()[-1]))

    out["from_snapshot"] = measure()
    shutil.rmtree(data_dir / "snapshots")
    out["full_scan"] = measure()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
