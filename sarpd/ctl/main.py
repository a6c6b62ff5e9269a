"""`sarpctl`: talk to a running sarpd from the shell (the console script's entry point).

Only calls `sarpd.client.SyncClient` and formats what comes back: no index logic.
Exit codes: 0 success; 1 `check` found problems, or `status` found the daemon not
ready; 2 an error (cannot connect, the daemon refused the request, bad input).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import IO

import click

from sarpd.ctl.bridge import bridge
from sarpd.ctl.cluster import cluster, show_status
from sarpd.ctl.common import (
    EXIT_PROBLEMS,
    HASHES_HELP,
    TIMEOUT_HELP,
    TOKENS_HELP,
    admin_timeout,
    aligned,
    connect,
    default_socket,
    emit_json,
    flatten,
    fmt,
    human_bytes,
    read_sequence,
)
from sarpd.ctl.importer import import_
from sarpd.ctl.lab import BENCH, LabGroup
from sarpd.ctl.ops import dump, top
from sarpd.errors import Unavailable

SOCKET_HELP = (
    "sarpd socket [env SARPD_SOCKET; default ./var/sarpd.sock if it exists, "
    "else /run/sarpd/sarpd.sock]"
)


@click.group(cls=LabGroup, lab={"bench": BENCH},
             context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", envvar="SARPD_SOCKET", help=SOCKET_HELP)
@click.option("--cluster", "cluster_urls", envvar="SARP_CLUSTER", metavar="URL[,URL...]",
              help="Talk to a whole cluster (its NATS URLs) instead of one sarpd's socket: "
              "requests go to the replicas of the shard that holds their sequence. "
              "[env SARP_CLUSTER]")
@click.option("--timeout", type=click.FloatRange(min=0), envvar="SARPCTL_TIMEOUT",
              metavar="SECONDS", help=TIMEOUT_HELP)
@click.pass_context
def main(ctx: click.Context, socket_path: str | None, cluster_urls: str | None,
         timeout: float | None) -> None:
    """Administer a running sarpd (the SARP prefix index of KV-cache blocks).

    \b
    Examples:
      sarpctl status
      echo '[1, 2, 3, ...]' | sarpctl insert --meta 7
      sarpctl match prompt.json --json
      sarpctl check
      sarpctl match --ns llama3 --hashes '[1311, 4242]'
      sarpctl --timeout 30 stats
      sarpctl --cluster nats://10.0.0.1:4222 match prompt.json
    """
    ctx.ensure_object(dict)
    ctx.obj["socket"] = socket_path or default_socket()
    ctx.obj["cluster"] = cluster_urls
    ctx.obj["timeout"] = timeout


@main.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Whether sarpd is up and ready, what it runs, and its key numbers.

    Exits 1 while the daemon is still recovering (or shutting down).

    With --cluster: the whole cluster, as `cluster status` prints it (per shard its
    log, checkpoint, blocks and segments; per replica its progress and the writes it
    applied); exits 1 when a shard has no live replica."""
    if ctx.obj.get("cluster"):
        show_status(ctx)  # the one cluster status
        return
    path = ctx.obj["socket"]
    with connect(ctx) as c:
        try:
            hello = c.hello()
        except Unavailable as exc:
            click.echo(f"sarpd at {path}: not ready ({exc.message})")
            sys.exit(EXIT_PROBLEMS)
        stats = c.stats()
    click.echo(f"{hello['server']} {hello['version']} at {path}: ready")
    click.echo(
        f"backend {hello['backend']}, sync {fmt(stats.get('sync'))}, hash {hello['hash']}, "
        f"protocol {hello['protocol']}, {hello['block_tokens']} tokens/block, "
        f"{hello['segment_blocks']} blocks/segment"
    )
    directory = stats.get("directory_bytes")
    click.echo(
        f"blocks {fmt(stats.get('blocks'))}, segments {fmt(stats.get('segments'))}, "
        f"routing points {fmt(stats.get('routing_points'))}, directory "
        f"{human_bytes(directory) if isinstance(directory, int | float) else '-'}"
    )
    click.echo(
        f"uptime {fmt(stats.get('uptime_s'))} s, recovered in "
        f"{fmt(stats.get('recovered_in_s'))} s, requests {fmt(stats.get('requests'))}, "
        f"matches {fmt(stats.get('matches'))}, inserts {fmt(stats.get('inserts'))}"
    )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (exact values).")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Every counter and gauge of the daemon and its index, one per line.

    Nested groups (a cluster replica's `cluster`, each reporting client's `reports`)
    print as dotted keys (`reports.bridge.events`); byte counts human-readable."""
    with connect(ctx) as c:
        result = c.stats()
    if as_json:
        emit_json(result)
        return
    click.echo("\n".join(aligned(flatten(result))))


def _tokens_command(fn: Callable[..., None]) -> Callable[..., None]:
    """Common arguments of match / insert / remove."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)
    fn = click.option("--ns", default="", show_default=True, help="Namespace of the sequence.")(
        fn
    )
    return click.argument("file", type=click.File("r"), required=False)(fn)


def _hashes_option(fn: Callable[..., None]) -> Callable[..., None]:
    return click.option("--hashes", "hashes_src", metavar="SRC", help=HASHES_HELP)(fn)


@main.command(help=f"Longest indexed prefix of a token sequence (or of block hashes).\n\n"
              f"{TOKENS_HELP}")
@_tokens_command
@_hashes_option
@click.option("--with-ids", is_flag=True, help="Also return the matched block ids.")
@click.option("--holders", type=click.IntRange(0, 1024), default=0,
              help="Also list the K holders with the longest runs from block 0 "
              "(protocol 2, docs/PROTOCOL.md \"Holders\"). 0: none.")
@click.pass_context
def match(ctx: click.Context, file: IO[str] | None, ns: str, as_json: bool,
          hashes_src: str | None, with_ids: bool, holders: int) -> None:
    tokens, hashes = read_sequence(file, hashes_src)
    with connect(ctx) as c:
        result = c.match(tokens=tokens, hashes=hashes, ns=ns, with_ids=with_ids,
                         holders=holders)
    if as_json:
        emit_json(result)
        return
    click.echo(f"matched {result['blocks']} blocks ({result['tokens']} tokens)")
    if result["meta"]:
        click.echo("meta: " + " ".join(str(m) for m in result["meta"]))
    for meta, run in result.get("holders") or []:
        click.echo(f"holder {meta:#018x}: {run} blocks")
    for i, block_id in enumerate(result.get("ids") or []):
        click.echo(f"id[{i}]: {block_id.hex()}")


@main.command(help=f"Index the blocks of a token sequence.\n\n{TOKENS_HELP}")
@_tokens_command
@click.option(
    "--meta",
    type=click.IntRange(0, 2**64 - 1),
    default=0,
    show_default=True,
    help="Metadata (uint64) stored with every new block (with --holder: the holder).",
)
@click.option("--holder", is_flag=True,
              help="Protocol 2: blocks already indexed get META as one more holder "
              "(default: the first insert wins).")
@click.pass_context
def insert(ctx: click.Context, file: IO[str] | None, ns: str, as_json: bool, meta: int,
           holder: bool) -> None:
    tokens, _ = read_sequence(file, None)
    with connect(ctx) as c:
        if holder:
            c.hello(protocol=2)
        result = c.insert(tokens=tokens, ns=ns, meta=meta)
    if as_json:
        emit_json(result)
        return
    click.echo(
        f"inserted {result['blocks']} blocks: {result['new_blocks']} new, "
        f"{result['matched_blocks']} already indexed"
    )


@main.command(help=f"Remove the blocks of a token sequence (or of block hashes) from block "
              f"FROM on.\n\n{TOKENS_HELP}")
@_tokens_command
@_hashes_option
@click.option(
    "--from",
    "start",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="First block index to remove.",
)
@click.option("--meta", type=click.IntRange(0, 2**64 - 1), default=None,
              help="Take only this holder off the blocks (default: every holder).")
@click.pass_context
def remove(ctx: click.Context, file: IO[str] | None, ns: str, as_json: bool,
           hashes_src: str | None, start: int, meta: int | None) -> None:
    tokens, hashes = read_sequence(file, hashes_src)
    with connect(ctx) as c:
        result = c.remove(tokens=tokens, hashes=hashes, ns=ns, start=start, meta=meta)
    if as_json:
        emit_json(result)
        return
    click.echo(f"removed {result['removed']} blocks (left with no holder)")


@main.command()
@click.pass_context
def snapshot(ctx: click.Context) -> None:
    """Write a snapshot of the routing directory now (faster next start).

    Waits as long as it takes unless --timeout is given."""
    with connect(ctx) as c:
        result = c.snapshot(timeout=admin_timeout(ctx))
    click.echo(
        f"snapshot up to segment {result['segment_id']} in {fmt(result['seconds'])} s"
    )


@main.command()
@click.option("--fix", is_flag=True, help="Repair what can be repaired (default: report only).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.pass_context
def check(ctx: click.Context, fix: bool, as_json: bool) -> None:
    """Verify the stored segments against the routing directory.

    Reports every problem found and exits 1 if there were any. Changes nothing unless
    --fix is given. Reads every segment: an admin operation, not a health probe; it
    waits as long as it takes unless --timeout is given."""
    with connect(ctx) as c:
        report = c.check(fix=fix, timeout=admin_timeout(ctx))
    problems = list(report.get("problems") or [])
    if as_json:
        emit_json(report)
    else:
        for line in problems:
            click.echo(f"problem: {line}")
        verdict = "clean" if not problems else f"{len(problems)} problems"
        fixed = f", {report.get('fixed', 0)} fixed" if fix else ""
        click.echo(
            f"checked {report.get('segments', 0)} segments, "
            f"{report.get('routing_points', 0)} routing points: {verdict}{fixed}"
        )
    if problems:
        sys.exit(EXIT_PROBLEMS)


# `sarpctl bridge vllm` (the KV-events bridge), `sarpctl top` and `sarpctl dump`
# (operator views), `sarpctl import` (a bulk build), `sarpctl cluster` (replicas over
# NATS JetStream) live in their own modules; `sarpctl bench` (the evaluation harness)
# in the repository's lab, loaded when it runs (sarpd/ctl/lab.py).
for _command in (bridge, top, dump, import_, cluster):
    main.add_command(_command)


if __name__ == "__main__":
    main(prog_name=os.path.basename(sys.argv[0]) or "sarpctl")
