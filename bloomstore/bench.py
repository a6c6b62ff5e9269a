"""Quick measurements of a BloomStore: FP rate, RAM per key, lookups/s, reopen time.

    python -m bloomstore.bench [--keys N] [--bits-per-key B] [--dir DIR]

Writes N sarp-shaped keys in batches of 66 (one b"S" segment of 1.6 KB, 64 b"B"
block locators of 12 B, one b"L" change-log record of 8 B: the key mix of one sarp
insert), then times batched lookups of present and absent keys, a reopen, a b"L"
range scan of the newest 1 % and a compaction. Numbers depend on the machine and its
page cache (warm here: the files were just written).
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path

from bloomstore.config import Geometry, Tuning, optimal_hashes
from bloomstore.store import BloomStore


def sarp_batches(count: int, seed: int) -> list[dict[bytes, bytes]]:
    rng = random.Random(seed)
    batches = []
    seg = 0
    keys = 0
    while keys < count:
        batch = {b"S" + seg.to_bytes(8, "big"): rng.randbytes(1600),
                 b"L" + seg.to_bytes(8, "big"): seg.to_bytes(8, "little")}
        for _ in range(64):
            batch[b"B" + rng.randbytes(16)] = rng.randbytes(12)
        batches.append(batch)
        keys += len(batch)
        seg += 1
    return batches


def _rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}/s"


def run(root: Path, keys: int, bits_per_key: int) -> dict[str, str]:
    geometry = Geometry(bits_per_key=bits_per_key, hashes=optimal_hashes(bits_per_key))
    tuning = Tuning(cache_bytes=8 << 20, fsync=False)
    path = root / f"bench-{bits_per_key}"
    batches = sarp_batches(keys, 1)
    store = BloomStore(path, geometry, tuning)
    t0 = time.perf_counter()
    for batch in batches:
        store.write(batch, (), sync=False)
    write_s = time.perf_counter() - t0
    present = [k for b in batches[:: max(1, len(batches) // 200)] for k in b][:10_000]
    rng = random.Random(2)
    absent = [b"B" + rng.randbytes(16) for _ in range(10_000)]
    t0 = time.perf_counter()
    for i in range(0, len(present), 100):
        store.get_many(present[i : i + 100])
    hit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(0, len(absent), 100):
        assert store.get_many(absent[i : i + 100]) == [None] * 100
    miss_s = time.perf_counter() - t0
    stats = store.stats()
    store.close()
    t0 = time.perf_counter()
    store = BloomStore(path, None, tuning)
    open_s = time.perf_counter() - t0
    segs = len(batches)
    t0 = time.perf_counter()
    tail = list(store.scan(b"L" + (segs - segs // 100).to_bytes(8, "big"), b"M"))
    scan_s = time.perf_counter() - t0
    reads = store.stats()["page_reads"]
    t0 = time.perf_counter()
    store.compact()
    compact_s = time.perf_counter() - t0
    store.close()
    return {
        "keys": f"{int(stats['entries_on_pages']) + int(stats['buffered_entries']):,}",
        "bits/key, hashes": f"{bits_per_key}, {geometry.hashes}",
        "pages, max chain": f"{stats['pages']}, {stats['chain_length_max']}",
        "target FP / measured FP": f"{float(stats['target_fp_rate']):.4%} / "
                                   f"{float(stats['false_positive_rate']):.4%}",
        "extra page reads / lookup": f"{float(stats['extra_page_reads_per_lookup']):.3f}",
        "RAM B/key (index, +buffers)": f"{float(stats['index_ram_bytes_per_key']):.3f}, "
                                       f"{float(stats['ram_bytes_per_key']):.2f}",
        "disk bytes/key": f"{int(stats['disk_bytes']) / keys:.0f}",
        "writes (keys/s)": _rate(keys, write_s),
        "lookups present (batches of 100)": _rate(len(present), hit_s),
        "lookups absent (batches of 100)": _rate(len(absent), miss_s),
        "reopen": f"{open_s * 1000:.0f} ms",
        "L scan newest 1 %": f"{len(tail)} keys, {reads} pages read, {scan_s * 1000:.0f} ms",
        "compaction": f"{compact_s:.2f} s",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--bits-per-key", type=int, nargs="+", default=[10, 16])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bloomstore-bench-", dir=args.dir))
    try:
        rows = [run(root, args.keys, b) for b in args.bits_per_key]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(k) for k in rows[0])
    for key in rows[0]:
        print(f"{key:<{width}}  " + "  |  ".join(r[key] for r in rows))


if __name__ == "__main__":
    main()
