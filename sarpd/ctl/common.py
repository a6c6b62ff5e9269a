"""What the `sarpctl` command modules share: the socket default, the exit codes, the
connection (errors become a message and exit 2), token input, output formatting,
progress bars, and the extra an optional package comes with.

Imported by sarpd/ctl/main.py (the group and the basic commands) and the command
modules it registers (sarpd/ctl/ops.py, ...); it imports none of them. The lab in
tools/ uses its output helpers (`write_json`, `human_bytes`, `progress_bars`).
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import click

from sarpd.client import REQUEST_TIMEOUT_S, RequestTimeout, SarpConnectionError, SyncClient
from sarpd.errors import SarpError, missing_extra
from sarpd.events.schema import engine_hash
from sarpd.protocol.requests import show, uint_array

__all__ = ["CLUSTER_TIMEOUT_S", "EXIT_ERROR", "EXIT_PROBLEMS", "HASHES_HELP", "LOCAL_SOCKET",
           "NO_LIMIT_CLUSTER_S", "SYSTEM_SOCKET", "TIMEOUT_HELP", "TOKENS_HELP", "StepFn",
           "admin_timeout", "aligned", "connect", "default_socket", "emit_json", "fail", "flatten",
           "fmt", "hashes_source", "human_bytes", "jsonable", "progress_bars", "read_hashes",
           "read_sequence", "read_tokens", "says_bytes", "write_json"]

LOCAL_SOCKET = Path("var/sarpd.sock")
SYSTEM_SOCKET = Path("/run/sarpd/sarpd.sock")
EXIT_PROBLEMS = 1
EXIT_ERROR = 2
CLUSTER_TIMEOUT_S = 10.0
NO_LIMIT_CLUSTER_S = 24 * 3600.0  # a cluster client needs a deadline: --timeout 0 = a day
TIMEOUT_HELP = (
    "Seconds each request may go unanswered before sarpctl gives up (exit 2) "
    f"[env SARPCTL_TIMEOUT; default {REQUEST_TIMEOUT_S:g}; 0: no limit]. `check` and "
    "`snapshot` read or write the whole index: they wait without a limit unless this "
    "is given (after the daemon has answered a ping in time)."
)


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
    given: float | None = ctx.obj.get("timeout")  # --timeout / SARPCTL_TIMEOUT
    request_timeout = REQUEST_TIMEOUT_S if given is None else given or None
    client: SyncClient | None = None
    try:
        if cluster:
            client = _cluster_client(cluster, CLUSTER_TIMEOUT_S if given is None
                                     else given or NO_LIMIT_CLUSTER_S)
        else:
            client = SyncClient(path, timeout=request_timeout or REQUEST_TIMEOUT_S,
                                request_timeout=request_timeout)
        yield client
    except RequestTimeout as exc:
        fail(f"{exc} (wait longer with --timeout SECONDS or SARPCTL_TIMEOUT; 0: no limit)")
    except SarpConnectionError as exc:
        fail(str(exc))
    except SarpError as exc:
        fail(f"sarpd at {path} answered {exc.code}: {exc.message}")
    finally:
        if client is not None:
            client.close()


def admin_timeout(ctx: click.Context) -> float | None:
    """The limit of a long admin op (`check`, `snapshot`): --timeout when given (0: no
    limit), else none (`SyncClient.check` pings first, within the request timeout)."""
    given: float | None = (ctx.obj or {}).get("timeout")
    return given or None


def _cluster_client(urls: str, timeout: float) -> SyncClient:
    try:
        return SyncClient.cluster(urls, timeout=timeout)
    except SarpError:
        raise
    except ModuleNotFoundError as exc:  # nats-py missing: say which extra brings it
        extra = missing_extra(exc.name)
        if extra is None:
            raise
        raise SarpConnectionError(f"--cluster {extra}") from exc
    except Exception as exc:  # NATS unreachable, no shard map
        raise SarpConnectionError(f"cannot use the cluster at {urls}: "
                                  f"{type(exc).__name__}: {exc}") from exc


U32_LIMIT, U64_LIMIT = 2**32, 2**64
_INT_WORD = re.compile(r"[+-]?[0-9]{1,4000}")  # longer: shown as the text it is
_HEX_WORD = re.compile(r"(0[xX])?([0-9a-fA-F]+)")


def _read_text(source: IO[str], param: str) -> tuple[str, str]:
    """(name, text) of an input; no text, or text that is not UTF-8, is a BadParameter."""
    name = getattr(source, "name", "input")
    try:
        text = source.read().strip()
    except UnicodeDecodeError as exc:
        raise click.BadParameter(f"{name}: byte {exc.start} is not UTF-8 text ({exc.reason})",
                                 param_hint=param) from exc
    return name, text


def _json_int(text: str) -> int | str:
    return int(text) if len(text) <= 4000 else text  # past int()'s limit: kept as text


def _parse_list(name: str, text: str, field: str, param: str) -> list[Any]:
    """A JSON list, or words split by whitespace (and commas): words that are ints
    become ints, the others stay strings (the caller's rule names them)."""
    if text.startswith(("[", "{", '"')):
        try:
            value = json.loads(text, parse_int=_json_int)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{name}: {field}: not valid JSON ({exc.msg}, line "
                                     f"{exc.lineno} column {exc.colno})",
                                     param_hint=param) from exc
        if not isinstance(value, list):
            raise click.BadParameter(f"{name}: {field}: {show(value)} is not a JSON list",
                                     param_hint=param)
        return value
    return [int(w) if _INT_WORD.fullmatch(w) else w for w in re.split(r"[\s,]+", text) if w]


def read_tokens(source: IO[str]) -> list[int]:
    """Token ids (each a uint32) from a JSON list or whitespace-separated ints; a bad one
    is named: ``tokens[2]: 99999999999999999999999 is not a uint32``."""
    name, text = _read_text(source, "FILE")
    if not text:
        raise click.BadParameter(f"{name}: tokens: none given (no token ids)",
                                 param_hint="FILE")
    items = _parse_list(name, text, "tokens", "FILE")
    try:
        uint_array(items, "tokens", U32_LIMIT, "uint32")
    except SarpError as exc:
        raise click.BadParameter(f"{name}: {exc.message} (FILE holds a JSON list or "
                                 "whitespace-separated ints)", param_hint="FILE") from exc
    return items


def hashes_source(src: str) -> IO[str]:
    """--hashes SRC: `-` (standard input), a file, or the list itself (`[1, 2]`, `1,2`)."""
    if src == "-":
        return sys.stdin
    path = Path(src)
    if path.is_file():
        return path.open(encoding="utf-8")
    if not src.lstrip().startswith("[") and not re.fullmatch(r"[\s,+\-0-9a-fA-FxX]+", src):
        raise click.BadParameter(f"{src}: no such file, and not a list of hashes",
                                 param_hint="--hashes")
    inline = io.StringIO(src)
    inline.name = src if len(src) <= 40 else f"{src[:37]}..."
    return inline


def read_hashes(source: IO[str]) -> list[int]:
    """Block hashes as the vLLM bridge stores them (uint64, sarpd.events.schema): ints
    below 2**64, or hex strings of an engine's bytes hash (a sha256 digest), which map
    as the bridge maps bytes: their last 8 bytes, big-endian."""
    name, text = _read_text(source, "--hashes")
    if not text:
        raise click.BadParameter(f"{name}: hashes: none given", param_hint="--hashes")
    items = [_hash_of(v) for v in _parse_list(name, text, "hashes", "--hashes")]
    try:
        uint_array(items, "hashes", U64_LIMIT, "uint64 (or the hex of a bytes hash)")
    except SarpError as exc:
        hint = "; an engine's negative int hash h is stored as h + 2**64" if any(
            type(v) is int and v < 0 for v in items) else ""
        raise click.BadParameter(f"{name}: {exc.message}{hint}", param_hint="--hashes") from exc
    return items


def read_sequence(file: IO[str] | None, hashes_src: str | None,
                  ) -> tuple[list[int] | None, list[int] | None]:
    """(tokens, hashes) of a command: token ids from FILE (standard input without one),
    or block hashes from --hashes SRC; both is a usage error."""
    if hashes_src is None:
        return read_tokens(file if file is not None else sys.stdin), None
    if file is not None:
        raise click.UsageError("give token ids (FILE) or --hashes SRC, not both")
    return None, read_hashes(hashes_source(hashes_src))


def _hash_of(v: Any) -> Any:
    """A hex string -> the bridge's uint64 of those bytes; anything else as it is."""
    if isinstance(v, str) and (m := _HEX_WORD.fullmatch(v)):
        digits = m.group(2)
        return engine_hash(bytes.fromhex(digits.rjust(len(digits) + len(digits) % 2, "0")))
    return v


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


StepFn = Callable[[int], None]


def progress_bars(quiet: bool) -> Callable[[str, int], StepFn]:
    """`make(name, total)` -> `step(n)`: a click progress bar on stderr that closes
    itself once `total` is reached (sarpctl import, the bench's builds)."""
    def make(name: str, total: int) -> StepFn:
        bar = click.progressbar(length=total, label=f"{name:>18}", file=sys.stderr)
        bar.__enter__()
        done = [0]

        def step(n: int) -> None:
            bar.update(n)
            done[0] += n
            if done[0] >= total:
                bar.__exit__(None, None, None)

        return step

    return make


def fmt(value: Any) -> str:
    """A value for a human: ints as they are, floats to 4 significant digits (whole ones
    without decimals, large ones without an exponent), None as '-'."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        text = f"{value:.4g}"
        return f"{value:.1f}" if "e+" in text else text
    if value is None:
        return "-"
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested maps as dotted keys: ``{"cluster": {"applied_seq": 5}}`` ->
    ``{"cluster.applied_seq": 5}``."""
    out: dict[str, Any] = {}
    for key, v in value.items():
        name = f"{prefix}{key}"
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{name}."))
        else:
            out[name] = v
    return out


def says_bytes(key: str) -> bool:
    """Whether a stats key counts bytes (`directory_bytes`, `backend_cache_bytes_configured`)."""
    return "bytes" in key.rsplit(".", 1)[-1].split("_")


def aligned(rows: dict[str, Any]) -> list[str]:
    """`key  value` lines, keys sorted and padded; bytes human-readable where the key says
    bytes; lists joined by commas."""
    def one(key: str, v: Any) -> str:
        if isinstance(v, int | float) and not isinstance(v, bool) and says_bytes(key):
            return human_bytes(v)
        if isinstance(v, list | tuple):
            return ", ".join(fmt(x) for x in v) or "-"
        return "-" if v == {} else fmt(v)

    width = max((len(k) for k in rows), default=0)
    return [f"{key:<{width}}  {one(key, rows[key])}" for key in sorted(rows)]


TOKENS_HELP = """FILE holds token ids (each a uint32): a JSON list (`[1, 2, 3]`) or ints
separated by whitespace or commas; `-` or no FILE reads standard input. Only whole
16-token blocks count."""
HASHES_HELP = (
    "Block hashes instead of token ids (not with FILE): SRC is the list itself ('[1, 2]' "
    "or '1,2'), a file holding one, or '-' (standard input). A hash is a uint below "
    "2**64, as the vLLM bridge stores an engine's block hash, or the hex of an "
    "engine's bytes hash (e.g. a sha256 digest), which maps as the bridge maps it: its "
    "last 8 bytes, big-endian. Give --ns the bridge's namespace (its --ns; default '')."
)
