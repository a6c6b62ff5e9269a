"""What the `sarpctl` command modules share: the socket default, the exit codes, the
connection (errors become a message and exit 2), token input and output formatting.

Imported by tools/sarpctl.py (the group and the basic commands) and the command
modules it registers (tools/ctl_ops.py); it imports none of them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import click

from sarpd.client import SarpConnectionError, SyncClient
from sarpd.errors import SarpError

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
    """A SyncClient on the group's --socket, or over the whole cluster with --cluster;
    errors become a message and exit 2."""
    cluster: str | None = ctx.obj.get("cluster")
    path: str = cluster or ctx.obj["socket"]
    client: SyncClient | None = None
    try:
        client = _cluster_client(cluster) if cluster else SyncClient(path)
        yield client
    except SarpConnectionError as exc:
        fail(str(exc))
    except SarpError as exc:
        fail(f"sarpd at {path} answered {exc.code}: {exc.message}")
    finally:
        if client is not None:
            client.close()


def _cluster_client(urls: str) -> SyncClient:
    try:
        return SyncClient.cluster(urls, timeout=10)
    except SarpError:
        raise
    except Exception as exc:  # NATS unreachable, no shard map, nats-py missing
        raise SarpConnectionError(f"cannot use the cluster at {urls}: "
                                  f"{type(exc).__name__}: {exc}") from exc


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


def write_json(doc: Any, json_out: str | None) -> None:
    """A tool's `--json FILE|-`: the document to stdout with '-', to FILE otherwise,
    nowhere without the option."""
    if json_out == "-":
        click.echo(json.dumps(doc, indent=1))
    elif json_out:
        Path(json_out).write_text(json.dumps(doc, indent=1) + "\n")


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
