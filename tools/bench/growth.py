"""Cost growth: throughput, match latency, merge pauses and recovery against index size.

    python -m tools.bench.growth --sizes 1000000,10000000,100000000 --json growth.json

Grows ONE index step by step (the fill of `--recovery-only`: 1,024-block sessions, a
quarter opening with a shared prompt; an existing `--data-dir` is resumed, and sizes it
already holds are only measured) and, at each size, measures on the index as it
stands:
- throughput: a probe workload (`--probe`, default ultrachat, fresh content at every
  step) replayed in batches of 16 turns (match the prompt, insert the sequence), as
  the benchmark does; turns per second and mean / p99 / max match latency;
- merge pauses: the directory folds its delta into the sorted base between batches;
  the longest merge while filling up to this size, and the worst latency a match
  queued behind a merging write batch would see (that batch's insert time + the
  next match batch's time);
- recovery: a cold restart in a fresh process to the first answered match, the
  directory's bytes per indexed block, and the disk footprint.
Every figure is a ratio or a curve taken in one run; nothing here asserts on speed.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import numpy as np

from sarpd.ctl.common import progress_bars
from tools.bench.api import BenchIndex, Turn
from tools.bench.runner import index_factories, replay
from tools.bench.scale import fill
from tools.bench.workloads import get_workload


@dataclass(frozen=True, slots=True)
class GrowthPoint:
    index: str
    blocks: int  # indexed blocks when the probe started
    fill_s: float  # time to grow from the previous size to this one
    settle_s: float  # then waiting for the engine's compactions to finish (capped)
    probe_turns: int
    throughput_rps: float
    match_us_mean: float
    match_us_p99: float
    match_us_max: float
    merges: int  # directory merges while filling to this size and probing it
    merge_ms_max: float  # the longest of them
    queued_behind_merge_ms: float  # worst match latency behind a merging write batch
    queued_behind_write_ms_p99: float  # the same behind any write batch (p99)
    recovery_s: float
    directory_bytes_per_block: float
    disk_bytes: int


def _stat(index: BenchIndex, key: str) -> float:
    stats = getattr(index, "stats", None)
    return float(stats().get(key, 0.0)) if callable(stats) else 0.0


def settle(index: BenchIndex, limit_s: float) -> float:
    """Wait (at most `limit_s`) until the engine has no compaction running or
    pending: a bulk fill leaves compaction debt that would stall the probe's writes.
    Returns the seconds waited."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        if (_stat(index, "backend_running_compactions") == 0
                and _stat(index, "backend_pending_compaction_bytes") == 0):
            break
        time.sleep(0.5)
    return time.perf_counter() - t0


def probe(index: BenchIndex, turns: Sequence[Turn]) -> dict[str, float]:
    """Replay `turns` as the benchmark does (batches of 16: match, then insert); note
    after each batch whether its insert merged the directory, and how long a match
    queued behind that insert would have waited."""
    behind: list[float] = []  # previous batch's insert + this batch's match
    behind_merge = 0.0
    last = {"insert_s": -1.0, "merged": 0.0, "merges": _stat(index, "directory_merges")}

    def on_batch(match_s: float, insert_s: float) -> None:
        nonlocal behind_merge
        if last["insert_s"] >= 0:
            behind.append(last["insert_s"] + match_s)
            if last["merged"]:
                behind_merge = max(behind_merge, behind[-1])
        merges = _stat(index, "directory_merges")
        last.update(insert_s=insert_s, merged=float(merges > last["merges"]), merges=merges)

    match_us, total, _, _, _ = replay(index, turns, 16, on_batch=on_batch)
    arr = np.array(match_us or [0.0])
    return {"throughput_rps": len(turns) / total if total else 0.0,
            "match_us_mean": float(arr.mean()), "match_us_p99": float(np.percentile(arr, 99)),
            "match_us_max": float(arr.max()), "queued_behind_merge_ms": behind_merge * 1e3,
            "queued_behind_write_ms_p99": float(np.percentile(behind or [0.0], 99)) * 1e3}


def grow(name: str, sizes: Sequence[int], data_dir: Path, backend: str, probe_spec: str,
         settle_limit_s: float = 300.0, seed: int = 0, probe_scale: int = 1,
         ) -> list[GrowthPoint]:
    index = index_factories()[name]()
    cache = max(1 << 20, max(sizes) * 16 // 10)
    index.open(data_dir / name, backend, cache)
    out: list[GrowthPoint] = []
    have = int(_stat(index, "blocks"))  # an existing --data-dir resumes where it stands
    try:
        for step, size in enumerate(sorted(sizes)):
            merges0 = _stat(index, "directory_merges")
            t0 = time.perf_counter()
            if size > have:
                bar = progress_bars(False)(f"{name}: fill to {size:,}", size - have)
                fill(index, size - have, bar, seed=1000 + 10 * seed + step)
            fill_s = time.perf_counter() - t0
            settle_s = settle(index, settle_limit_s)
            have = max(have, size)
            blocks = int(_stat(index, "blocks"))
            turns = list(get_workload(probe_spec, scale=probe_scale,
                                      seed=100 + 10 * seed + step).turns())
            res = probe(index, turns)
            merges = int(_stat(index, "directory_merges") - merges0)
            merge_ms = _stat(index, "directory_merge_s_max") * 1e3
            index.flush()
            dbpb = _stat(index, "directory_bytes_per_block")
            rec = index.recover()  # a fresh process; this one reopens (counters restart)
            out.append(GrowthPoint(
                index=name, blocks=blocks, fill_s=fill_s, settle_s=settle_s,
                probe_turns=len(turns),
                merges=merges, merge_ms_max=merge_ms, recovery_s=rec.seconds,
                directory_bytes_per_block=dbpb, disk_bytes=index.disk_bytes(), **res))
            click.echo(_row(out[-1]), err=True)
    finally:
        index.close()
    return out


HEADER = ("index", "blocks", "settle s", "req/s", "match us", "p99 us", "max us", "merges",
          "merge ms max", "behind write ms p99", "behind merge ms max", "recover s",
          "dir B/block", "disk")


def _row(p: GrowthPoint) -> str:
    cells = (p.index, f"{p.blocks:,}", f"{p.settle_s:.1f}", f"{p.throughput_rps:,.0f}",
             f"{p.match_us_mean:,.1f}",
             f"{p.match_us_p99:,.1f}", f"{p.match_us_max:,.1f}", str(p.merges),
             f"{p.merge_ms_max:.2f}", f"{p.queued_behind_write_ms_p99:.2f}",
             f"{p.queued_behind_merge_ms:.2f}",
             f"{p.recovery_s:.3f}", f"{p.directory_bytes_per_block:.3f}",
             f"{p.disk_bytes / 2**20:,.0f} MiB")
    return " | ".join(cells)


def table(points: Sequence[GrowthPoint]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + _row(p) + " |" for p in points]
    return "\n".join(lines)


def plot(points: Sequence[GrowthPoint], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name in dict.fromkeys(p.index for p in points):
        mine = [p for p in points if p.index == name]
        x = [p.blocks for p in mine]
        axes[0].plot(x, [p.throughput_rps for p in mine], "o-", label=name)
        axes[1].plot(x, [p.match_us_mean for p in mine], "o-", label=f"{name} mean")
        axes[1].plot(x, [p.match_us_p99 for p in mine], "s--", label=f"{name} p99")
        axes[2].plot(x, [p.recovery_s for p in mine], "o-", label=name)
    for ax, title in zip(axes, ("throughput (turns/s)", "match latency (us)",
                                "cold recovery (s)"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("indexed blocks")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge_pause_ms(base_entries: int, delta_entries: int = 8193, repeat: int = 5) -> float:
    """Best of `repeat` merges of a full delta into a base of `base_entries` random
    keys: the pause one merge costs at that directory size (100M blocks ~ 1.6M), on
    the directory an index gets (`native.pick().directory`: the C one when built)."""
    from sarpd.core import DirectoryArrays, native

    rng = np.random.default_rng(0)
    keys = np.sort(rng.integers(1, 2**63, base_entries, dtype=np.uint64))
    segs, filts = np.full(keys.size, 3, np.uint64), np.zeros(keys.size, np.uint64)
    best = float("inf")
    for _ in range(repeat):
        d = native.pick().directory(delta_entries)
        d.load_arrays(DirectoryArrays(keys.copy(), segs.copy(), filts.copy()))
        for k in rng.integers(1, 2**63, delta_entries, dtype=np.uint64).tolist():
            d.add(k, 9, 1)
        d.merge()
        best = min(best, d.merge_s_max)
    return best * 1e3


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(float(s)) for s in text.split(",") if s.strip()})
    except ValueError as exc:
        raise click.BadParameter(f"{text!r}: comma-separated block counts") from exc
    if not sizes or sizes[0] < 1:
        raise click.BadParameter(f"{text!r}: need at least one size >= 1")
    return sizes


@click.command()
@click.option("--sizes", default="1000000,10000000", show_default=True,
              help="Index sizes (indexed blocks) to measure at, comma-separated; 1e8 works.")
@click.option("--index", "names", default="sarp", show_default=True,
              help="Comma-separated indexes to grow (any the benchmark knows).")
@click.option("--probe", "probe_spec", default="ultrachat", show_default=True,
              help="Workload replayed at each size to measure throughput and latency.")
@click.option("--probe-scale", default=1, show_default=True, type=click.IntRange(1),
              help="Scale of the probe workload (more turns: more directory merges seen).")
@click.option("--seed", default=0, show_default=True,
              help="Content seed: give a new one to probe a resumed --data-dir afresh.")
@click.option("--backend", default="rocksdb", show_default=True)
@click.option("--settle-s", default=300.0, show_default=True,
              help="After each fill, wait up to this long for the engine's compactions "
                   "to finish before probing (0: probe at once, compaction debt included).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Where to build (default: a temporary directory, removed).")
@click.option("--merge-base", type=click.IntRange(1), default=None,
              help="Only time one directory merge into a base of this many entries "
                   "(best of 5) and exit.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Write every point as JSON here.")
@click.option("--plot", "plot_out", type=click.Path(path_type=Path), default=None,
              help="Write a PNG (throughput, latency, recovery against size) here.")
def main(sizes: str, names: str, probe_spec: str, probe_scale: int, seed: int, backend: str,
         settle_s: float, data_dir: Path | None, merge_base: int | None,
         json_out: Path | None, plot_out: Path | None) -> None:
    """Measure how throughput, match latency, merge pauses and recovery grow with the
    number of indexed blocks (one index grown step by step, each size measured)."""
    if merge_base is not None:
        click.echo(f"one merge of 8,193 delta entries into {merge_base:,}: "
                   f"{merge_pause_ms(merge_base):.1f} ms (best of 5)")
        return
    wanted = _sizes(sizes)
    root = data_dir or Path(tempfile.mkdtemp(prefix="sarp-growth-"))
    points: list[GrowthPoint] = []
    try:
        for name in (n.strip() for n in names.split(",") if n.strip()):
            points += grow(name, wanted, root, backend, probe_spec, settle_s, seed, probe_scale)
    finally:
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    click.echo(table(points))
    if json_out is not None:
        json_out.write_text(json.dumps([asdict(p) for p in points], indent=2) + "\n")
    if plot_out is not None:
        plot(points, plot_out)


if __name__ == "__main__":
    main()
