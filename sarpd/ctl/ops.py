"""Operator commands of `sarpctl`: `top` (live view of the daemon's counters) and
`dump` (routing directory and segment inspection for one sequence).

Like the rest of sarpctl they only call `sarpd.client.SyncClient` (`stats`, `dump`)
and format what comes back, with the helpers of sarpd/ctl/common.py; sarpd/ctl/main.py
registers them.
"""

from __future__ import annotations

import time
from typing import IO, Any

import click

from sarpd.ctl.common import (
    HASHES_HELP,
    TOKENS_HELP,
    connect,
    emit_json,
    fmt,
    human_bytes,
    read_sequence,
)

# (stats key, label) of the counters shown as rates per second
RATES = (
    ("requests", "req/s"),
    ("matches", "match/s"),
    ("inserts", "insert/s"),
    ("errors", "err/s"),
    ("batches", "batch/s"),
)


def rates(prev: dict[str, Any], cur: dict[str, Any], dt: float) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, _ in RATES:
        a, b = prev.get(key), cur.get(key)
        if isinstance(a, int | float) and isinstance(b, int | float) and dt > 0:
            out[key] = (b - a) / dt
    return out


def render_top(cur: dict[str, Any], rate: dict[str, float], path: str) -> list[str]:
    """The lines of one `top` screen."""
    directory = cur.get("directory_bytes")
    dbytes = human_bytes(directory) if isinstance(directory, int | float) else "-"
    errors = sorted((k[7:], v) for k, v in cur.items() if k.startswith("errors_") and v)
    lines = [
        f"sarpd at {path}  up {fmt(cur.get('uptime_s'))} s  backend {fmt(cur.get('backend'))}"
        f"  sync {fmt(cur.get('sync'))}",
        "  ".join(f"{label} {rate.get(key, 0.0):9.1f}" for key, label in RATES),
        f"connections {fmt(cur.get('connections'))}  queue depth {fmt(cur.get('queue_depth'))}"
        f"  mean batch {fmt(cur.get('mean_batch_size'))}",
        f"hit ratio {fmt(cur.get('hit_ratio'))}  matched blocks {fmt(cur.get('matched_blocks'))}"
        f"  segment reads {fmt(cur.get('segment_reads'))}",
        f"blocks {fmt(cur.get('blocks'))}  segments {fmt(cur.get('segments'))}  routing points "
        f"{fmt(cur.get('routing_points'))}  directory {dbytes}",
        "errors " + (", ".join(f"{code} {n}" for code, n in errors) if errors else "none"),
    ]
    return lines


@click.command()
@click.option(
    "--interval", type=click.FloatRange(0.1), default=1.0, show_default=True,
    help="Seconds between refreshes.",
)
@click.option(
    "--count", type=click.IntRange(0), default=0, show_default=True,
    help="Stop after this many refreshes (0: until Ctrl-C).",
)
@click.option("--no-clear", is_flag=True, help="Append screens instead of redrawing (logs).")
@click.pass_context
def top(ctx: click.Context, interval: float, count: int, no_clear: bool) -> None:
    """Live view of the daemon: request rates, queue depth, hit ratio, index size.

    Polls the `stats` op every --interval seconds; rates are over the last interval."""
    path = ctx.obj["socket"]
    shown = 0
    with connect(ctx) as c:
        prev, prev_t = c.stats(), time.monotonic()
        try:
            while count == 0 or shown < count:
                time.sleep(interval)
                cur, now = c.stats(), time.monotonic()
                lines = render_top(cur, rates(prev, cur, now - prev_t), path)
                if not no_clear:
                    click.clear()
                click.echo("\n".join(lines))
                prev, prev_t = cur, now
                shown += 1
        except KeyboardInterrupt:
            return


def presence_bits(presence: int, n: int) -> str:
    """'1' for an indexed block, '.' for an absent one, block 0 first."""
    return "".join("1" if (presence >> i) & 1 else "." for i in range(n))


def render_dump(result: dict[str, Any], show_ids: bool) -> list[str]:
    lines = [
        f"ns {result['ns']!r}: {result['blocks']} blocks, {result['matched_blocks']} match"
        + (" (more windows not shown)" if result.get("truncated") else "")
    ]
    for w in result["windows"]:
        lines.append(f"window {w['window']} ({w['blocks']} blocks, run {w['run']}):")
        for p in w["probes"]:
            if p["postings"]:
                segs = ", ".join(f"seg {s} filter {f:016x}" for s, f in p["entries"])
                lines.append(f"  offset {p['offset']:2d} key {p['key']:016x}: "
                             f"{p['postings']} entries: {segs}")
        lines.append(f"  candidates: {', '.join(map(str, w['candidates'])) or 'none'}")
        for seg in w["segments"]:
            lines.extend(_render_segment(seg, show_ids))
    return lines


def _render_segment(seg: dict[str, Any], show_ids: bool) -> list[str]:
    if "error" in seg:
        return [f"  segment {seg['id']}: {seg['error']}"]
    n = seg["nblocks"]
    meta = [int.from_bytes(seg["meta"][i : i + 8], "little") for i in range(0, 8 * n, 8)]
    out = [
        f"  segment {seg['id']}: window {seg['window']}, {n} blocks, run {seg['run']}, "
        f"ns tag {seg['ns_tag']:016x}",
        f"    present {presence_bits(seg['presence'], n)}",
        f"    meta    {' '.join(map(str, meta))}",
    ]
    if show_ids:
        out += [f"    id[{i}] {seg['ids'][16 * i : 16 * i + 16].hex()}" for i in range(n)]
    return out


@click.command(help=f"""Routing directory entries and segments of one sequence.

For each 64-block window, from window 0: the routing keys at every lattice offset and
their directory entries, the candidate segments a match reads, and each segment's
presence bits, metadata and verified run. Read-only.

{TOKENS_HELP}""")
@click.argument("file", type=click.File("r"), required=False)
@click.option("--ns", default="", show_default=True, help="Namespace of the sequence.")
@click.option("--hashes", "hashes_src", metavar="SRC", help=HASHES_HELP)
@click.option("--ids", "show_ids", is_flag=True, help="Also list every block id of each segment.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw result as JSON.")
@click.pass_context
def dump(ctx: click.Context, file: IO[str] | None, ns: str, hashes_src: str | None,
         show_ids: bool, as_json: bool) -> None:
    tokens, hashes = read_sequence(file, hashes_src)
    with connect(ctx) as c:
        result = c.dump(tokens=tokens, hashes=hashes, ns=ns)
    if as_json:
        emit_json(result)
        return
    click.echo("\n".join(render_dump(result, show_ids)))
