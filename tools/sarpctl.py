"""`sarpctl`: talk to a running sarpd from the shell.

Only calls `sarpd.client.SyncClient` and formats what comes back: no index logic.
Exit codes: 0 success; 1 `check` found problems, or `status` found the daemon not
ready; 2 an error (cannot connect, the daemon refused the request, bad input).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import click

from sarpd.client import SarpConnectionError, SyncClient
from sarpd.errors import SarpError, Unavailable

LOCAL_SOCKET = Path("var/sarpd.sock")
SYSTEM_SOCKET = Path("/run/sarpd/sarpd.sock")
EXIT_PROBLEMS = 1
EXIT_ERROR = 2


def default_socket() -> str:
    return str(LOCAL_SOCKET if LOCAL_SOCKET.exists() else SYSTEM_SOCKET)


def fail(message: str) -> None:
    click.echo(f"sarpctl: {message}", err=True)
    sys.exit(EXIT_ERROR)


@contextmanager
def connect(ctx: click.Context) -> Iterator[SyncClient]:
    """A SyncClient on the group's --socket; errors become a message and exit 2."""
    path: str = ctx.obj["socket"]
    client: SyncClient | None = None
    try:
        client = SyncClient(path)
        yield client
    except SarpConnectionError as exc:
        fail(str(exc))
    except SarpError as exc:
        fail(f"sarpd at {path} answered {exc.code}: {exc.message}")
    finally:
        if client is not None:
            client.close()


def read_tokens(source: IO[str]) -> list[int]:
    """Token ids from a JSON list or whitespace-separated ints."""
    text = source.read().strip()
    name = getattr(source, "name", "input")
    if not text:
        raise click.BadParameter(f"{name}: no token ids", param_hint="FILE")
    try:
        value = json.loads(text) if text.startswith("[") else [int(t) for t in text.split()]
    except ValueError as exc:
        raise click.BadParameter(
            f"{name}: expected a JSON list or whitespace-separated ints ({exc})",
            param_hint="FILE",
        ) from exc
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise click.BadParameter(f"{name}: expected a list of ints", param_hint="FILE")
    return value


def jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    return value


def emit_json(value: Any) -> None:
    click.echo(json.dumps(jsonable(value), indent=2, sort_keys=True))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "-"
    return str(value)


TOKENS_HELP = """FILE holds token ids: a JSON list (`[1, 2, 3]`) or whitespace-separated ints;
`-` or no FILE reads standard input. Only whole 16-token blocks count."""

SOCKET_HELP = (
    "sarpd socket [env SARPD_SOCKET; default ./var/sarpd.sock if it exists, "
    "else /run/sarpd/sarpd.sock]"
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", envvar="SARPD_SOCKET", help=SOCKET_HELP)
@click.pass_context
def main(ctx: click.Context, socket_path: str | None) -> None:
    """Administer a running sarpd (the SARP prefix index of KV-cache blocks).

    \b
    Examples:
      sarpctl status
      echo '[1, 2, 3, ...]' | sarpctl insert --meta 7
      sarpctl match prompt.json --json
      sarpctl check
    """
    ctx.ensure_object(dict)
    ctx.obj["socket"] = socket_path or default_socket()


@main.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """Whether sarpd is up and ready, what it runs, and its key numbers.

    Exits 1 while the daemon is still recovering (or shutting down)."""
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
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Every counter and gauge of the daemon and its index."""
    with connect(ctx) as c:
        result = c.stats()
    if as_json:
        emit_json(result)
        return
    width = max((len(k) for k in result), default=0)
    for key in sorted(result):
        click.echo(f"{key:<{width}}  {fmt(result[key])}")


def _tokens_command(fn: Callable[..., None]) -> Callable[..., None]:
    """Common arguments of match / insert / remove."""
    fn = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(fn)
    fn = click.option("--ns", default="", show_default=True, help="Namespace of the sequence.")(
        fn
    )
    return click.argument("file", type=click.File("r"), default="-")(fn)


@main.command(help=f"Longest indexed prefix of a token sequence.\n\n{TOKENS_HELP}")
@_tokens_command
@click.option("--with-ids", is_flag=True, help="Also return the matched block ids.")
@click.pass_context
def match(ctx: click.Context, file: IO[str], ns: str, as_json: bool, with_ids: bool) -> None:
    tokens = read_tokens(file)
    with connect(ctx) as c:
        result = c.match(tokens=tokens, ns=ns, with_ids=with_ids)
    if as_json:
        emit_json(result)
        return
    click.echo(f"matched {result['blocks']} blocks ({result['tokens']} tokens)")
    if result["meta"]:
        click.echo("meta: " + " ".join(str(m) for m in result["meta"]))
    for i, block_id in enumerate(result.get("ids") or []):
        click.echo(f"id[{i}]: {block_id.hex()}")


@main.command(help=f"Index the blocks of a token sequence.\n\n{TOKENS_HELP}")
@_tokens_command
@click.option(
    "--meta",
    type=click.IntRange(0, 2**64 - 1),
    default=0,
    show_default=True,
    help="Metadata (uint64) stored with every new block.",
)
@click.pass_context
def insert(ctx: click.Context, file: IO[str], ns: str, as_json: bool, meta: int) -> None:
    tokens = read_tokens(file)
    with connect(ctx) as c:
        result = c.insert(tokens=tokens, ns=ns, meta=meta)
    if as_json:
        emit_json(result)
        return
    click.echo(
        f"inserted {result['blocks']} blocks: {result['new_blocks']} new, "
        f"{result['matched_blocks']} already indexed"
    )


@main.command(help=f"Remove the blocks of a token sequence from block FROM on.\n\n{TOKENS_HELP}")
@_tokens_command
@click.option(
    "--from",
    "start",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="First block index to remove.",
)
@click.pass_context
def remove(ctx: click.Context, file: IO[str], ns: str, as_json: bool, start: int) -> None:
    tokens = read_tokens(file)
    with connect(ctx) as c:
        result = c.remove(tokens=tokens, ns=ns, start=start)
    if as_json:
        emit_json(result)
        return
    click.echo(f"removed {result['removed']} blocks")


@main.command()
@click.pass_context
def snapshot(ctx: click.Context) -> None:
    """Write a snapshot of the routing directory now (faster next start)."""
    with connect(ctx) as c:
        result = c.snapshot()
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
    --fix is given. Reads every segment: an admin operation, not a health probe."""
    with connect(ctx) as c:
        report = c.check(fix=fix)
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


def _add_bench() -> None:
    """`sarpctl bench` (the evaluation harness) lives in tools.bench."""
    from tools.bench.cli import bench

    main.add_command(bench)


_add_bench()

def _add_bridge() -> None:
    """`sarpctl bridge vllm` (the KV-events bridge) lives in tools.ctl_bridge."""
    from tools.ctl_bridge import bridge

    main.add_command(bridge)


_add_bridge()


def _add_ops() -> None:
    """`sarpctl top` and `sarpctl dump` live in tools.ctl_ops."""
    from tools.ctl_ops import register

    register(main)


_add_ops()


if __name__ == "__main__":
    main(prog_name=os.path.basename(sys.argv[0]) or "sarpctl")
