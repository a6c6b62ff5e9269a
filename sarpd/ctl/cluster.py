"""`sarpctl cluster`: inspect a sarp cluster (issue 15), and start one on loopback.

Renders the cluster status (`show_status`, which `sarpctl --cluster URL status` calls
too); see docs/DECISIONS.md "Replicas". `cluster local` is the lab's launcher
(tools/cluster/local.py, from a source checkout: sarpd/ctl/lab.py).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from sarpd.ctl.common import EXIT_PROBLEMS, connect, fail, fmt
from sarpd.ctl.lab import CLUSTER_LOCAL, LabGroup
from sarpd.errors import ConfigError


@click.group(cls=LabGroup, lab={"local": CLUSTER_LOCAL})
def cluster() -> None:
    """Inspect a sarp cluster (sarpd replicas of shards over NATS JetStream); start one
    on loopback from a source checkout (`local`)."""


STATUS_HELP = """The shard map's rule (block0, or heads with its splits and placed
buckets). Per shard: the log's sequence range and its NATS leader, the newest
published checkpoint (its sequence and age), the shard's blocks and segments, and for
each replica its applied sequence, lag (entries behind the log), the age of its last
progress report (replicas report every second), its blocks and segments, and the
writes it applied from the log since its start (inserts, removes, clears). All of it
is one read of the cluster's KV bucket, where the replicas report.

Exits 1 when a shard has no live replica (none reported in the last 10 s)."""


@cluster.command(help=STATUS_HELP + "\n\nNeeds the group's --cluster URL.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    if not (ctx.obj or {}).get("cluster"):
        raise click.UsageError("cluster status needs --cluster URL (sarpctl --cluster URL "
                               "cluster status)")
    show_status(ctx, as_json)


RESHARD_HELP = """Move the cluster from rule block0 (a sequence lives on the shard of
its first block: a shared system prompt puts every request on one shard) to rule heads
(shared heads split, their branches spread), offline, from the shards' checkpoints.

\b
Before: stop every client's writes, and wait until each shard has published a
checkpoint of its whole log ([cluster] checkpoint_interval_s); the command refuses
otherwise, and refuses data whose window starts lack branch links (written by replicas
older than the heads rule). Nothing moves: every bucket that holds a stored
sequence's first block is placed on the shard that holds it.
After: restart every replica and every client (they read the shard map at start).

Prints what each shard holds and how many buckets were placed (--json: one object).
Step by step: docs/CLUSTER.md "Moving a cluster to the heads rule"."""


@cluster.command(help=RESHARD_HELP + "\n\nNeeds the group's --cluster URL.")
@click.option("--rule", type=click.Choice(["heads"]), required=True,
              help="The rule to move to (heads: the only move there is).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
@click.pass_context
def reshard(ctx: click.Context, rule: str, as_json: bool) -> None:
    if not (ctx.obj or {}).get("cluster"):
        raise click.UsageError("cluster reshard needs --cluster URL (sarpctl --cluster URL "
                               "cluster reshard --rule heads)")

    def progress(shard: str, segments: int) -> None:
        click.echo(f"shard {shard}: {segments:,} segments read", err=True)

    with connect(ctx) as client:
        try:
            doc = client.reshard(progress)
        except ConfigError as exc:  # the cluster is not ready for it: say why
            fail(str(exc))
    if as_json:
        click.echo(json.dumps(doc))
        return
    for sh in doc["shards"]:
        click.echo(f"shard {sh['shard']}: checkpoint at seq {sh['seq']}, {sh['chains']} "
                   f"chains, {sh['window_starts']} window starts (all linked)")
    click.echo(f"rule heads: {doc['placed']} of {doc['buckets']} buckets placed where their "
               "data is; restart every replica and client now")


def show_status(ctx: click.Context, as_json: bool = False) -> None:
    """THE cluster status: what `sarpctl --cluster URL cluster status` and `sarpctl
    --cluster URL status` print (`sarpd.cluster.node.read_status`); exits 1 when a
    shard has no live replica."""
    with connect(ctx) as client:
        doc = client.cluster_status()
    if as_json:
        click.echo(json.dumps(doc))
    else:
        for line in status_lines(ctx.obj["cluster"], doc):
            click.echo(line)
    if any(not any(r["live"] for r in sh["replicas"]) for sh in doc["shards"]):
        sys.exit(EXIT_PROBLEMS)


def status_lines(urls: str, doc: dict[str, Any]) -> list[str]:
    """The text form of a `read_status` document."""
    names = ", ".join(sh["shard"] for sh in doc["shards"]) or "none"
    lines = [f"cluster {urls}: shards {names}; blocks {fmt(doc['blocks'])}, "
             f"segments {fmt(doc['segments'])}", _rule(doc)]
    for sh in doc["shards"]:
        size = "blocks unknown (no replica reported them)" if sh["blocks"] is None else (
            f"blocks {sh['blocks']}, segments {sh['segments']} "
            f"({sh['size_of']} at seq {sh['size_seq']})")
        lines.append(f"shard {sh['shard']}: log {sh['first_seq']}..{sh['last_seq']}, "
                     f"leader {sh['leader']}, {_checkpoint(sh['checkpoint'])}; {size}")
        if not sh["replicas"]:
            lines.append("  (no replica reported)")
        lines += [f"  {_replica(r)}" for r in sh["replicas"]]
    return lines


def _rule(doc: dict[str, Any]) -> str:
    """The shard map's rule (docs/CLUSTER.md "Shards")."""
    rule = doc.get("rule")
    if rule is None:
        return "rule: unknown (no shard map in the cluster's bucket)"
    if rule == "block0":
        return "rule: block0 (shard map version 1: a sequence lives on its block 0's shard)"
    return (f"rule: {rule} (shard map version 2: shared heads split, their branches "
            f"spread): {doc.get('splits', 0)} splits, {doc.get('placements', 0)} buckets "
            "placed")


def _replica(r: dict[str, Any]) -> str:
    silent = "" if r["live"] else " (silent: not live)"
    line = (f"{r['replica']}: applied {r['applied_seq']}, lag {r['lag']}, "
            f"report {r['report_age_s']:.1f} s ago{silent}")
    if r["blocks"] is not None:
        line += f"; blocks {r['blocks']}, segments {r['segments']}"
    applied = r["applied"]
    if applied is not None:
        line += (f"; writes applied: {applied['inserts']} inserts, {applied['removes']} "
                 f"removes, {applied['clears']} clears")
    return line


def _checkpoint(ckpt: dict[str, float] | None) -> str:
    if ckpt is None:
        return "no checkpoint"
    age = ckpt["age_s"]
    return f"checkpoint at {ckpt['seq']}" + ("" if age is None else f" ({age:.0f} s old)")
