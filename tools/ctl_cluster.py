"""`sarpctl cluster`: run and inspect a sarp cluster (issue 15).

Only parses options and calls tools.cluster.local; see docs/DECISIONS.md "Replicas".
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from tools.cluster.local import LocalCluster, LocalClusterError
from tools.cluster.nats_local import NatsClusterError
from tools.ctl_common import EXIT_ERROR, connect


@click.group()
def cluster() -> None:
    """Run and inspect a sarp cluster: sarpd replicas of shards over NATS JetStream."""


@cluster.command()
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Where the NATS nodes and the replicas keep their data "
              "and logs.")
@click.option("--nats", "nats_nodes", type=click.IntRange(1, 9), default=3, show_default=True,
              help="nats-server nodes (a shard's stream keeps min(3, NATS) copies).")
@click.option("--replicas", type=click.IntRange(1, 16), default=3, show_default=True,
              help="sarpd replicas per shard.")
@click.option("--shards", type=click.IntRange(1, 64), default=2, show_default=True,
              help="Shards (s0, s1, ...).")
@click.option("--backend", default="rocksdb", show_default=True,
              help="Every replica's storage engine.")
def local(directory: Path, nats_nodes: int, replicas: int, shards: int, backend: str) -> None:
    """Start a whole cluster on loopback and stay in the foreground until SIGTERM or
    Ctrl-C, then stop everything cleanly. Once every replica serves, prints ONE JSON
    line: {"nats": [URL, ...], "nats_pids": [...], "replicas": [{"shard", "replica",
    "socket", "pid"}, ...]}. Logs: DIR/nats/*.log and DIR/<shard>-<replica>.log.

    \b
    Example:
      sarpctl cluster local --dir /tmp/sarp-cluster --nats 3 --replicas 3 --shards 2
    """
    lc = LocalCluster(directory, nats_nodes, replicas, shards, backend)
    # SIGTERM as Ctrl-C: the finally below stops everything, also mid-start
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        click.echo(f"starting {nats_nodes} NATS nodes and {replicas * shards} replicas "
                   f"in {directory}", err=True)
        lc.start()
        click.echo(json.dumps(lc.describe()))
        sys.stdout.flush()
        signal.pause()
    except (LocalClusterError, NatsClusterError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    except KeyboardInterrupt:
        pass
    finally:
        click.echo("stopping", err=True)
        lc.stop()


@cluster.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_context
def status(ctx: click.Context, as_json: bool) -> None:
    """Per shard: the log's sequence range and its NATS leader, the newest published
    checkpoint (its sequence and age), and each replica's applied sequence, lag
    (entries behind the log) and the age of its last progress report (replicas
    report every second). Needs the group's --cluster URL."""
    if not (ctx.obj or {}).get("cluster"):
        raise click.UsageError("cluster status needs --cluster URL (sarpctl --cluster URL "
                               "cluster status)")
    with connect(ctx) as client:
        doc = client.cluster_status()
    if as_json:
        click.echo(json.dumps(doc))
        return
    for sh in doc["shards"]:
        click.echo(f"shard {sh['shard']}: log {sh['first_seq']}..{sh['last_seq']}, "
                   f"leader {sh['leader']}, {_checkpoint(sh['checkpoint'])}")
        for r in sh["replicas"] or [{"replica": "(no replica reported)"}]:
            if "applied_seq" not in r:
                click.echo(f"  {r['replica']}")
                continue
            click.echo(f"  {r['replica']}: applied {r['applied_seq']}, lag {r['lag']}, "
                       f"report {r['report_age_s']:.1f} s ago")


def _checkpoint(ckpt: dict[str, float] | None) -> str:
    if ckpt is None:
        return "no checkpoint"
    age = ckpt["age_s"]
    return f"checkpoint at {ckpt['seq']}" + ("" if age is None else f" ({age:.0f} s old)")
