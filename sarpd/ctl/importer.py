"""`sarpctl import`: build a new data directory in bulk from a file of JSON lines.

Each line is one insert, `{"ns": str, "hashes": [uint, ...] | "tokens": [uint, ...],
"meta": uint | [uint, ...]}` (`ns` optional), validated by the protocol's own rules
(docs/PROTOCOL.md: hashes are uints below 2**64, a 64-bit engine hash each; tokens
uint32; one meta for all blocks or one per block). The lines are applied in file
order exactly as that sequence of inserts would be (sarpd/core/bulk.py): no order or
grouping is required. Nothing is written to the data directory until every line
has been read and applied; a bad line stops the import with its line number and
leaves the directory as it was.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

import click

from sarpd.config import ServerConfig, load_config
from sarpd.core.bulk import BulkBuilder, BulkReport
from sarpd.core.store import data_paths, open_backend
from sarpd.ctl.common import StepFn, emit_json, fail, human_bytes, progress_bars
from sarpd.daemon.cli import lock_data_dir
from sarpd.errors import ConfigError, SarpError
from sarpd.model import Insert
from sarpd.protocol.requests import BadMessage, Limits, parse_message

FIELDS = frozenset({"ns", "hashes", "tokens", "meta"})
BATCH_OPS = 256  # inserts per write batch (sarpd's default batch_max)
BATCH_BLOCKS = 65_536  # ... or fewer, once they hold this many blocks


@dataclass(frozen=True, slots=True)
class ImportResult:
    inserts: int  # lines applied (blank lines skipped)
    blocks: int
    segments: int
    records: int
    routing_points: int
    directory_bytes: int
    build_s: float  # reading the lines and running the write path into staging
    write_s: float  # the sorted ingest and the snapshot
    blocks_per_s: float


def parse_line(line: str, lineno: int, limits: Limits) -> Insert:
    """One JSON line -> an Insert (ConfigError naming the line and what is wrong)."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise ConfigError(f"line {lineno}: not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ConfigError(f"line {lineno}: expected a JSON object, got {type(obj).__name__}")
    extra = sorted(set(obj) - FIELDS)
    if extra:
        raise ConfigError(f"line {lineno}: unknown field(s) {', '.join(extra)} "
                          f"(an import line has {', '.join(sorted(FIELDS))})")
    req = parse_message({**obj, "op": "insert", "id": lineno}, limits)
    if isinstance(req, BadMessage):
        raise ConfigError(f"line {lineno}: {req.error.message}")
    assert isinstance(req, Insert)
    return req


def check_empty(data_dir: Path) -> None:
    """The import builds a NEW data set: refuse a directory that holds anything."""
    if data_dir.exists() and not data_dir.is_dir():
        raise ConfigError(f"data dir {data_dir}: not a directory")
    if data_dir.exists() and any(data_dir.iterdir()):
        held = sorted(p.name for p in data_dir.iterdir())[:5]
        raise ConfigError(f"data dir {data_dir}: not empty ({', '.join(held)}...); "
                          "sarpctl import builds a new data set in an empty or new directory")


def _ops(fh: IO[bytes], limits: Limits, step: StepFn | None) -> Iterator[list[Insert]]:
    batch: list[Insert] = []
    blocks = 0
    for lineno, raw in enumerate(fh, 1):
        if step is not None:
            step(len(raw))
        if not raw.strip():
            continue
        op = parse_line(raw.decode(), lineno, limits)
        batch.append(op)
        seq = op.seq
        blocks += (len(seq.tokens) // limits.block_tokens if seq.tokens is not None
                   else len(seq.hashes) if seq.hashes is not None else 0)
        if len(batch) >= BATCH_OPS or blocks >= BATCH_BLOCKS:
            yield batch
            batch, blocks = [], 0
    if batch:
        yield batch


def run_import(source: Path, cfg: ServerConfig, read_step: StepFn | None = None,
               write_bar: Callable[[int], StepFn] | None = None) -> ImportResult:
    """Import `source` into `cfg.data_dir` (empty or new) for `cfg.backend`."""
    data_dir = cfg.data_dir
    check_empty(data_dir)
    limits = Limits.from_config(cfg)
    lock = lock_data_dir(data_dir)  # a sarpd started meanwhile refuses the directory
    ok = False
    try:
        t0 = time.perf_counter()
        builder = BulkBuilder(cfg.index, data_dir / "import.tmp")
        inserts = 0
        try:
            with open(source, "rb") as fh:
                for batch in _ops(fh, limits, read_step):
                    for op, res in zip(batch, builder.insert_many(batch), strict=True):
                        if isinstance(res, SarpError):
                            raise ConfigError(f"line {op.id}: {res.code}: {res.message}")
                    inserts += len(batch)
            t1 = time.perf_counter()
            backend_dir, snapshot_dir = data_paths(data_dir, cfg.backend)
            backend = open_backend(cfg.backend, backend_dir, cache_bytes=cfg.cache_bytes)
            try:
                step = write_bar(builder.staging.items_total) if write_bar else None
                report = builder.finish(backend, snapshot_dir, step)
            finally:
                backend.close()
        finally:
            builder.close()
        ok = True
    finally:
        lock.close()
        if not ok:
            _undo(data_dir)
    t2 = time.perf_counter()
    return _result(inserts, report, t1 - t0, t2 - t1)


def _undo(data_dir: Path) -> None:
    """After a failed import: leave the directory empty again (it was empty before)."""
    import shutil

    for p in data_dir.iterdir() if data_dir.exists() else ():
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _result(inserts: int, r: BulkReport, build_s: float, write_s: float) -> ImportResult:
    total = build_s + write_s
    return ImportResult(inserts, r.blocks, r.segments, r.items, r.routing_points,
                        r.directory_bytes, build_s, write_s,
                        r.blocks / total if total else 0.0)


@click.command("import")
@click.argument("source", metavar="FILE", type=click.Path(exists=True, dir_okay=False,
                                                           path_type=Path))
@click.option("--data-dir", type=click.Path(path_type=Path), required=True,
              help="The new data directory (empty or absent); sarpd must not be running on it.")
@click.option("--backend", default=None, help="Storage engine [default: rocksdb, or the config's].")
@click.option("--config", "config_path", type=click.Path(exists=True, path_type=Path),
              default=None, help="sarpd's TOML: its [index] settings and cache_bytes are used.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def import_(source: Path, data_dir: Path, backend: str | None, config_path: Path | None,
            as_json: bool) -> None:
    """Build a new data directory from FILE (JSON lines) in bulk, with sarpd stopped.

    \b
    Each line is one insert, applied in file order (no sorting or grouping needed):
      {"ns": "tenant/a", "tokens": [1, 2, ...], "meta": 7}
      {"hashes": [1234567, 89101112, ...], "meta": [5, 5, 6]}
    hashes are uints below 2**64 (64-bit engine hashes), as in the protocol; meta is
    one uint for every block or one per block. Segments, block locators, counters,
    namespace counts and the manifest are written as sorted table files that RocksDB
    ingests (write batches on other engines), and the routing directory as a
    snapshot, so sarpd started on DATA_DIR afterwards serves exactly what these
    inserts would have produced and re-routes nothing. Scratch space: ~55 B per block
    of disk in DATA_DIR/import.tmp (staged segments and the locators' sort runs, given
    back as the table files are written). A bad line stops the import and leaves
    DATA_DIR empty.
    """
    try:
        cfg = load_config(config_path, data_dir=data_dir, backend=backend)
        bar = progress_bars(as_json)  # on stderr
        res = run_import(source, cfg, bar("reading", source.stat().st_size),
                         lambda total: bar("writing", total))
    except (ConfigError, SarpError) as exc:
        fail(f"import: {exc}")
        return
    if as_json:
        emit_json(asdict(res))
        return
    click.echo(f"imported {res.inserts:,} lines into {data_dir} ({cfg.backend}): "
               f"{res.blocks:,} blocks in {res.segments:,} segments, {res.records:,} "
               f"records; directory {res.routing_points:,} routing points "
               f"({human_bytes(res.directory_bytes)}); {res.build_s + res.write_s:.1f} s, "
               f"{res.blocks_per_s:,.0f} blocks/s")

