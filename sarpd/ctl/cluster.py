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

from sarpd.ctl.common import EXIT_PROBLEMS, connect, fmt
from sarpd.ctl.lab import CLUSTER_LOCAL, LabGroup


@click.group(cls=LabGroup, lab={"local": CLUSTER_LOCAL})
def cluster() -> None:
    """Inspect a sarp cluster (sarpd replicas of shards over NATS JetStream); start one
    on loopback from a source checkout (`local`)."""


STATUS_HELP = """Per shard: the log's sequence range and its NATS leader, the newest
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
             f"segments {fmt(doc['segments'])}"]
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
