"""`sarpctl bench`: run sarp and the baselines on one workload, side by side, in one run."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import click

from sarpd.ctl.common import progress_bars
from tools.bench.preload import left_out
from tools.bench.report import floor_note, text_table, write_report
from tools.bench.runner import RECOVERY_RUNS, SCHEMA, index_factories, run_bench

INDEX_HELP = "Comma-separated indexes to run (default: every one the harness knows)."


@click.command("bench")
@click.option("--workload", "-w", default="codeact", show_default=True,
              help="codeact, agent, sharegpt-long, ultrachat; branchy, mixed, retries, "
                   "tree-search, edits (branches from inside sessions, many siblings); or "
                   "trace:PATH[@BLOCKSIZE] (Mooncake JSON Lines with hash_ids; BLOCKSIZE "
                   "tokens per id, default 16).")
@click.option("--index", "indexes", default=None, help=INDEX_HELP)
@click.option("--backend", default="rocksdb", show_default=True,
              help="Storage engine for every SSD-resident index.")
@click.option("--scale", default=1, show_default=True, type=click.IntRange(1),
              help="Workload size multiplier (scale 1 replays in seconds).")
@click.option("--seed", default=0, show_default=True, help="Workload seed (deterministic).")
@click.option("--recovery-only", is_flag=True,
              help="Only measure recovery at scale: fill each index with --blocks blocks, "
                   "then time a cold restart (default indexes: sarp, dram-blockhash, redis).")
@click.option("--blocks", default=1_000_000, show_default=True, type=click.IntRange(1),
              help="Indexed blocks for --recovery-only.")
@click.option("--sync", type=click.Choice(["none", "always"]), default="none", show_default=True,
              help="Durability of every index's inserts: 'always' fsyncs each insert call.")
@click.option("--page-cache", is_flag=True,
              help="Let the SSD indexes read through the OS page cache (default: direct "
                   "I/O, so each index's memory budget is its only cache).")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(1),
              help="Turns per match/insert call (the daemon batches the same way).")
@click.option("--preload", default=0, show_default=True, type=click.IntRange(0),
              metavar="BLOCKS", help="Fill every index with BLOCKS blocks of the workload's "
              "shape (its namespaces, system prompts, sessions, branches) before the replay.")
@click.option("--preload-cache", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Keep each filled index (per index and size) in DIR and reuse it.")
@click.option("--recovery-runs", default=RECOVERY_RUNS, show_default=True,
              type=click.IntRange(1), help="Cold recoveries timed per index; the fastest "
              "is reported (interference on a shared machine only adds time).")
@click.option("--data-dir", type=click.Path(path_type=Path), default=None,
              help="Where the indexes are built (default: a temporary directory, removed).")
@click.option("--json", "json_out", default=None, metavar="FILE|-",
              help="Write the results as one JSON object to FILE, or to stdout with '-'.")
@click.option("--report", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Write a Markdown table and PNG plots (throughput, recovery, latency "
                   "CDF, reuse loss) into DIR.")
def bench(workload: str, indexes: str | None, backend: str, scale: int, seed: int,
          recovery_only: bool, blocks: int, sync: str, page_cache: bool, batch: int,
          preload: int, preload_cache: Path | None, recovery_runs: int,
          data_dir: Path | None, json_out: str | None, report: Path | None) -> None:
    """Replay a workload through sarp and the baselines in ONE run and compare them.

    Each turn first matches its accumulated history, then inserts the extended sequence;
    sessions advance round-robin. Every SSD design gets the same memory budget (10 % of
    the uncompressed SSD-BlockHash store) for its engine (cache and write buffers) and
    its own caches (wiredtiger keeps 32 MiB at least: the table says when), and
    reads with direct I/O unless --page-cache. Recovery (recovery_s) is the in-process
    time to open, load and answer the first match, in a fresh process after its
    imports; recovery_spawn_s is from the spawn; each is the fastest of --recovery-runs
    restarts. An index that fails is reported with
    its error, the others still run, and the exit status is then 1.
    """
    from tools.bench.workloads import get_workload

    direct_io = not page_cache
    if recovery_only:
        _recovery_only(indexes, blocks, backend, data_dir, json_out, direct_io)
        return
    names = indexes.split(",") if indexes else list(index_factories())
    names, note = left_out(names, preload)
    if note:
        click.echo(note, err=True)
    try:
        wl = get_workload(workload, scale=scale, seed=seed)
    except (ValueError, FileNotFoundError) as exc:
        raise click.BadParameter(str(exc), param_hint="--workload") from exc
    quiet = json_out == "-"
    tmp = None
    if data_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="sarp-bench-"))
    root = data_dir or tmp
    assert root is not None
    try:
        res = run_bench(wl, names, backend, root, batch=batch, progress=progress_bars(quiet),
                        sync=sync == "always", preload=preload, preload_cache=preload_cache,
                        seed=seed, direct_io=direct_io, recovery_runs=recovery_runs)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--index") from exc
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if json_out == "-":
        click.echo(json.dumps(res.to_json()))
    else:
        click.echo(text_table(res))
        if json_out:
            Path(json_out).write_text(json.dumps(res.to_json(), indent=2))
    if report is not None:
        for p in write_report(res, report):
            click.echo(f"wrote {p}", err=quiet)
    _exit_if_failed([f.index for f in res.failed()])


def _exit_if_failed(failed: list[str]) -> None:
    if failed:
        click.echo(f"failed: {', '.join(failed)} (the others' results are above)", err=True)
        sys.exit(1)


def _recovery_only(indexes: str | None, blocks: int, backend: str, data_dir: Path | None,
                   json_out: str | None, direct_io: bool) -> None:
    from tools.bench.scale import ScaleResult, recovery_at_scale, scale_budget

    names, note = left_out(indexes.split(",") if indexes else
                           ["sarp", "dram-blockhash", "redis"], blocks)
    if note:
        click.echo(note, err=True)
    root = data_dir or Path(tempfile.mkdtemp(prefix="sarp-scale-"))
    try:
        res = recovery_at_scale(names, blocks, backend, root,
                                progress=progress_bars(json_out == "-"), direct_io=direct_io)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--index") from exc
    finally:
        if data_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    done = [r for r in res if isinstance(r, ScaleResult)]
    failed = [r for r in res if not isinstance(r, ScaleResult)]
    doc = {"schema": SCHEMA, "blocks": blocks, "backend": backend, "direct_io": direct_io,
           "results": [r.public() if not isinstance(r, ScaleResult) else
                       {"index": r.index, "blocks": r.blocks, "build_s": r.build_s,
                        "recovery_s": r.recovery_s, "recovery_spawn_s": r.recovery_spawn_s,
                        "memory_bytes": r.memory_bytes, "routing_bytes": r.routing_bytes,
                        "disk_bytes": r.disk_bytes, "detail": r.detail} for r in res]}
    if json_out == "-":
        click.echo(json.dumps(doc))
    else:
        sarp = next((r for r in done if r.index == "sarp"), None)
        note = floor_note(backend, scale_budget(blocks))
        click.echo(f"recovery at {blocks:,} blocks ({backend}, "
                   f"{'direct I/O' if direct_io else 'page cache on'}"
                   f"{'; ' + note if note else ''}):")
        for r in done:
            ratio = f"{r.recovery_s / sarp.recovery_s:8.2f}x sarp" if sarp else ""
            click.echo(f"{r.index:>16}  build {r.build_s:9.2f} s  recovery {r.recovery_s:9.4f} s"
                       f"  (spawn {r.recovery_spawn_s:8.4f} s) {ratio}  memory "
                       f"{r.memory_bytes:>12,} B  disk {r.disk_bytes:>13,} B")
        for f in failed:
            click.echo(f"FAILED {f.index}: {f.error}")
        if json_out:
            Path(json_out).write_text(json.dumps(doc, indent=2))
    _exit_if_failed([f.index for f in failed])
