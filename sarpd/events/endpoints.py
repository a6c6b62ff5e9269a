"""An engine's ZMQ endpoints, checked before anything connects (sans-I/O): a subscriber
(the bridge, the daemon's listeners) connects to ``tcp://HOST:PORT`` or ``ipc://PATH``;
a typo is an error that names the option and the value, not a ZMQ traceback or a
silent retry loop (a ZMQ ``connect`` never fails: it retries in the background)."""

from __future__ import annotations

from sarpd.errors import ConfigError, SarpError

__all__ = ["SCHEMES", "check_endpoint"]

SCHEMES = ("tcp", "ipc")


def check_endpoint(value: str, option: str,
                   error: type[SarpError] = ConfigError) -> str:
    """`value` if it is an endpoint a subscriber can connect to, else `error` (an
    operator's `ConfigError`; a request's `BadRequest` for the indexer API) naming
    `option`, the value and the expected form."""
    shown = value if len(value) <= 80 else value[:77] + "..."
    expected = "expected tcp://HOST:PORT (the engine's host, not *) or ipc://PATH"
    scheme, sep, rest = value.partition("://")
    if not sep or scheme not in SCHEMES:
        raise error(f"{option} {shown!r}: {expected}")
    if scheme == "ipc":
        if not rest:
            raise error(f"{option} {shown!r}: no path; {expected}")
        return value
    host, colon, port = rest.rpartition(":")
    if not colon or not host:
        raise error(f"{option} {shown!r}: no host; {expected}")
    if host == "*":
        raise error(f"{option} {shown!r}: * is a bind address; {expected}")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise error(f"{option} {shown!r}: port {port[:20]!r} is not 1..65535; "
                    f"{expected}")  # fmt: skip
    return value
