"""`sarpctl bridge`: feed sarpd from a serving engine's KV-event stream.

Only parses options and calls `sarpd.bridge.vllm.serve`; see docs/BRIDGE.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tomllib
from pathlib import Path

import click

from sarpd.bridge.stats import BridgeStats
from sarpd.bridge.vllm import BridgeConfig, serve
from sarpd.ctl.common import EXIT_ERROR
from sarpd.errors import ConfigError, SarpError
from sarpd.events.endpoints import check_endpoint
from sarpd.events.mapping import MAX_WORKER


def _load_config(ctx: click.Context, _param: click.Parameter, path: str | None) -> str | None:
    """--config FILE: a TOML table of option defaults (keys as the long option names,
    dashes or underscores); options given on the command line win."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise click.BadParameter(f"{path}: {exc}", param_hint="--config") from exc
    ctx.default_map = {k.replace("-", "_"): v for k, v in doc.items()}
    return path


def _endpoint(_ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--endpoint / --replay: a ZMQ endpoint to connect to, checked before anything
    starts (a typo is a usage error naming the option, not a retry loop)."""
    if value is None:
        return None
    try:
        return check_endpoint(value, f"--{param.name}")
    except ConfigError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"--{param.name} ")) from exc


class BridgeFailed(click.ClickException):
    exit_code = EXIT_ERROR


@click.group()
def bridge() -> None:
    """Feed sarpd from a serving engine's KV-cache events (see docs/BRIDGE.md)."""


@bridge.command()
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    callback=_load_config,
    is_eager=True,
    expose_value=False,
    help='TOML file of option defaults (endpoint = "tcp://...", worker = 3, ...).',
)
@click.option(
    "--endpoint",
    required=True,
    callback=_endpoint,
    help="vLLM's KV-event PUB endpoint (kv_events_config.endpoint), e.g. tcp://10.0.0.5:5557.",
)
@click.option(
    "--replay",
    default=None,
    callback=_endpoint,
    help="vLLM's replay ROUTER endpoint (kv_events_config.replay_endpoint), e.g. "
    "tcp://10.0.0.5:5558: fills sequence gaps and catches up after a restart.",
)
@click.option(
    "--topic",
    default="",
    show_default=True,
    help="ZMQ topic to subscribe to (kv_events_config.topic).",
)
@click.option(
    "--ns",
    default="",
    show_default=True,
    help="Namespace (template: {worker} and {medium} expand); LoRA and cache "
    "salt are appended as /lora=NAME and /salt=SALT. Default: one namespace shared by "
    "every worker of the model (with holders). Without holders, tiers other than the "
    "GPU are indexed only when it contains {medium}.",
)
@click.option(
    "--holders/--no-holders",
    default=True,
    show_default=True,
    help="Protocol 2: (worker, tier) holds each block, so a namespace is shared by the "
    "fleet, a removal takes off this worker's holding only, and every tier shares it. "
    "--no-holders: protocol 1 (first insert wins; give each worker its own namespace).",
)
@click.option(
    "--worker",
    type=click.IntRange(0, MAX_WORKER),
    default=0,
    show_default=True,
    help="This engine's worker id, kept in bits 63..48 of every block's meta.",
)
@click.option(
    "--group",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="KV-cache group whose events are indexed (hybrid models have several).",
)
@click.option(
    "--block-size",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="The engine's KV-cache block size (vllm --block-size) of that group: GPU "
    "stores of fewer tokens per block (partial-block entries) are skipped. 0: take the "
    "largest block size seen.",
)
@click.option(
    "--state",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Position file (survives restarts) [default: var/bridge-w<WORKER>.json].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Export the bridge's counters for Prometheus on this port (/metrics).",
)
@click.option(
    "--report-interval",
    type=click.FloatRange(0.1),
    default=10.0,
    show_default=True,
    help="Seconds between status lines, and between reports of the counters to sarpd "
    "(shown in its `stats` under `reports` and in its metrics as sarpd_reported).",
)
@click.option(
    "--silence-warn",
    type=click.FloatRange(0),
    default=60.0,
    show_default=True,
    help="Warn once when the publisher is connected but sends nothing for this many "
    "seconds (an idle engine, or a wrong --topic); 0: never. An unreachable publisher "
    "(no ZMQ connection for 3 s) or sarpd is always warned about: at once, then every "
    "30 s while it lasts, and once more when it is back.",
)
@click.option("--json", "as_json", is_flag=True, help="Print status lines as JSON objects.")
@click.option(
    "--log-level",
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]),
    default="WARNING",
    show_default=True,
    help="Log level (to stderr).",
)
@click.pass_context
def vllm(ctx: click.Context, endpoint: str, replay: str | None, topic: str, ns: str,
         holders: bool, worker: int, group: int, block_size: int, state: Path | None,
         metrics_port: int | None, report_interval: float, silence_warn: float,
         as_json: bool, log_level: str) -> None:  # fmt: skip
    """Subscribe to a vLLM engine's KV events and apply them to sarpd.

    \b
    BlockStored -> insert (hashes + parent) with (worker, tier) as the holder,
    BlockRemoved -> remove of this worker's holding of those ids, AllBlocksCleared ->
    clear of this worker's holdings; REMOTE stores, partial-block stores and other
    groups are skipped and counted. Every engine sharing a namespace must hash alike
    (vLLM: the same prefix_caching_hash_algo and PYTHONHASHSEED): the bridge checks
    the first block of each new prompt against the other engines' and logs a
    disagreement (hash_disagreements).
    Runs until SIGTERM/SIGINT; prints a status line every --report-interval seconds.

    \b
    Example (vLLM: --kv-events-config '{"enable_kv_cache_events": true,
      "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'):
      sarpctl bridge vllm --endpoint tcp://gpu3:5557 --replay tcp://gpu3:5558 --worker 3
    """
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = BridgeConfig(
        endpoint=endpoint, socket=ctx.obj["socket"], worker=worker, replay=replay,
        topic=topic, ns=ns, group=group, block_size=block_size,
        state=state if state is not None else Path(f"var/bridge-w{worker}.json"),
        report_interval_s=report_interval, holders=holders, silence_warn_s=silence_warn,
    )  # fmt: skip

    def report(stats: BridgeStats) -> None:
        click.echo(json.dumps(stats.as_dict()) if as_json else stats.line())

    try:
        asyncio.run(serve(cfg, report, report_interval, metrics_port))
    except SarpError as exc:
        raise BridgeFailed(str(exc)) from exc
