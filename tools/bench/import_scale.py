"""`sarpctl import` at scale: import throughput, then recovery of sarpd on the result.

    python -m tools.bench.import_scale --blocks 10000000 --data-dir /work/bulk-10m

1. writes N blocks of a workload's shape (tools/bench/preload.py: its system prompts,
   sessions, branches; fresh 64-bit ids) as import JSON lines next to the data dir;
2. imports them with `sarpctl import FILE --data-dir D --json` (a subprocess, as a
   user runs it): blocks/s of the whole import, and the time of its two phases (read
   + write path into staging; the sorted ingest + snapshot);
3. recovery, in-process: a fresh process opens the backend, loads the snapshot,
   re-routes what changed after it and answers one match (time after its imports);
4. recovery, spawn: a real sarpd started on the directory, from the spawn to its
   first answered match (polled every 2 ms), and sarpd's own `recovered_in_s`.
Prints one JSON object. `--keep` keeps the JSON lines and the data directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import numpy as np

from sarpd.client import SarpConnectionError, SyncClient
from sarpd.config import load_config
from sarpd.ctl.common import progress_bars
from sarpd.errors import Unavailable
from tools.bench.preload import sequences, shape_of
from tools.bench.spawn import REPO, compile_bytecode
from tools.bench.workloads import get_workload

PROBE = [1, 2, 3, 4]  # hashes of the first answered match


def write_lines(path: Path, workload: str, blocks: int, seed: int, bar: bool) -> float:
    t0 = time.perf_counter()
    shape = shape_of(list(get_workload(workload, seed=seed).turns()))
    step = progress_bars(False)("generating", blocks) if bar else None
    with open(path, "w") as fh:
        for ns, seq, n in sequences(shape, blocks, seed):
            fh.write(json.dumps({"ns": ns, "hashes": seq.tolist(), "meta": 0}) + "\n")
            if step is not None:
                step(n)
    return time.perf_counter() - t0


def recover_in_process(data_dir: Path, backend: str) -> dict[str, float]:
    """Run in a fresh process: open, recover, answer one match (after imports)."""
    from sarpd.core import SarpIndex, data_paths, open_backend
    from sarpd.model import Match, SeqSpec

    t0 = time.perf_counter()
    backend_dir, snapshot_dir = data_paths(data_dir, backend)
    be = open_backend(backend, backend_dir, cache_bytes=64 << 20)
    ix = SarpIndex(be, load_config(None).index, snapshot_dir)
    rep = ix.recover()
    ids = np.zeros((len(PROBE), 2), np.uint64)
    ids[:, 0] = PROBE
    ix.match_many([Match(0, SeqSpec("", hashes=ids))])
    seconds = time.perf_counter() - t0
    ix.close()
    return {"in_process_s": seconds, "recover_s": rep.seconds,
            "rerouted": float(rep.segments_rerouted), "full_scan": float(rep.full_scan)}


def recover_spawned(data_dir: Path, backend: str) -> dict[str, float]:
    """A fresh `python -m tools.bench.import_scale --recover`: spawn to its answer."""
    cmd = [sys.executable, "-m", "tools.bench.import_scale", "--recover", "--data-dir",
           str(data_dir), "--backend", backend]
    compile_bytecode()
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    total = time.perf_counter() - t0
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return {**doc, "process_s": total}


def sarpd_first_match(data_dir: Path, backend: str, timeout_s: float = 600) -> dict[str, float]:
    """Start sarpd on `data_dir`; seconds from the spawn to the first answered match."""
    sock = Path(tempfile.mkdtemp(prefix="sarp-imp-", dir="/tmp")) / "sarpd.sock"
    argv = [sys.executable, "-m", "sarpd.daemon", "--data-dir", str(data_dir), "--socket",
            str(sock), "--backend", backend, "--sync", "none", "--log-level", "WARNING"]
    compile_bytecode()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while time.perf_counter() - t0 < timeout_s:
            if proc.poll() is not None:
                raise RuntimeError(f"sarpd exited with {proc.returncode}")
            try:
                with SyncClient(str(sock), timeout=5) as c:
                    c.match(hashes=PROBE)
                    first = time.perf_counter() - t0
                    stats = c.stats()
                    return {"spawn_to_first_match_s": first,
                            "sarpd_recovered_in_s": float(stats.get("recovered_in_s", -1)),
                            "sarpd_blocks": float(stats["blocks"])}
            except (SarpConnectionError, Unavailable, OSError):
                time.sleep(0.002)
        raise RuntimeError(f"sarpd gave no match in {timeout_s:.0f} s")
    finally:
        proc.terminate()
        proc.wait(120)
        shutil.rmtree(sock.parent, ignore_errors=True)


@click.command()
@click.option("--blocks", type=int, default=1_000_000, show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path), required=True,
              help="The data directory to build (removed first unless --recover).")
@click.option("--workload", default="codeact", show_default=True,
              help="Whose shape the blocks take (prompts, namespaces, sessions).")
@click.option("--backend", default="rocksdb", show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--keep", is_flag=True, help="Keep the JSON lines and the data directory.")
@click.option("--recover", "recover_only", is_flag=True,
              help="(internal) one in-process recovery of --data-dir, as JSON.")
def main(blocks: int, data_dir: Path, workload: str, backend: str, seed: int, keep: bool,
         recover_only: bool) -> None:
    """Import N blocks with `sarpctl import`, then time sarpd's recovery on them."""
    if recover_only:
        print(json.dumps(recover_in_process(data_dir, backend)), flush=True)
        return
    shutil.rmtree(data_dir, ignore_errors=True)
    lines = data_dir.with_name(data_dir.name + ".jsonl")
    out: dict[str, object] = {"blocks_requested": blocks, "workload": workload,
                              "backend": backend}
    out["generate_s"] = write_lines(lines, workload, blocks, seed, True)
    out["jsonl_bytes"] = lines.stat().st_size
    cmd = [sys.executable, "-m", "sarpd.ctl.main", "import", str(lines), "--data-dir",
           str(data_dir), "--backend", backend, "--json"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    out["import_process_s"] = time.perf_counter() - t0
    out["import"] = json.loads(res.stdout)
    out["disk_bytes"] = sum(p.stat().st_size for p in data_dir.rglob("*") if p.is_file())
    out["recovery_in_process"] = recover_spawned(data_dir, backend)
    out["recovery_sarpd"] = sarpd_first_match(data_dir, backend)
    if not keep:
        lines.unlink()
        shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
