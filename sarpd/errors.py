"""The one error root of sarp. Every error carries the wire `code` of docs/PROTOCOL.md.

Messages name the field, the value and the limit, e.g.
``f"tokens: {n} exceeds max_sequence_tokens ({limit})"``. Keep causes with
``raise ... from``.
"""

from __future__ import annotations

__all__ = ["EXTRAS", "BadRequest", "Busy", "ConfigError", "Conflict", "CorruptData",
           "Forbidden", "FormatVersionError", "FrameError", "Internal", "NotFound",
           "QuotaExceeded", "SarpError", "StorageError", "TooLarge", "Unavailable",
           "UnknownOp", "UnknownParent", "missing_extra"]


class SarpError(Exception):
    """Root of every error sarp raises on purpose. `code` is the wire error code."""

    code = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ConfigError(SarpError):
    """An operator's or configuration error: a TOML file, a setting, a backend name or
    tunable, a state file. Never a client's request (those are `BadRequest`): it stops
    sarpd (or a sarpctl command) at startup with a message naming the setting and its
    limit. It is no wire error: should one ever reach a client, it answers `internal`
    (a server-side fault), never `bad_request`."""

    code = "internal"


class BadRequest(SarpError):
    """A field is missing, of the wrong type, or out of range (the message names it)."""

    code = "bad_request"


class UnknownOp(SarpError):
    code = "unknown_op"


class NotFound(SarpError):
    """The indexer API: no such registered instance, or no indexer for a (model,
    routing group) pair (HTTP 404)."""

    code = "not_found"


class Conflict(SarpError):
    """The indexer API: a registration that contradicts one already made (a duplicate
    instance and rank, another block size for a pair, one instance under two models;
    HTTP 409)."""

    code = "conflict"


class UnknownParent(SarpError):
    """`insert` with a `parent` that is not indexed: resend the whole sequence."""

    code = "unknown_parent"


class TooLarge(SarpError):
    """A frame, sequence or list over its limit."""

    code = "too_large"


class FrameError(SarpError):
    """The byte stream itself is unusable: the connection closes after one error
    response. `code` is ``too_large`` (an oversized frame, string or container: the
    default) or ``bad_request`` (bytes that are not msgpack). Not a `TooLarge`: a
    stream error is not a per-request limit, and it may be either code."""

    code = "too_large"

    def __init__(self, message: str, code: str = "too_large") -> None:
        super().__init__(message)
        self.code = code


class Busy(SarpError):
    code = "busy"


class Forbidden(SarpError):
    """The peer's credentials do not allow this connection or this namespace."""

    code = "forbidden"


class QuotaExceeded(SarpError):
    """An insert into a namespace that already holds its quota of blocks (extension
    code, docs/PROTOCOL.md "Namespace quotas")."""

    code = "quota_exceeded"


class Unavailable(SarpError):
    """Starting up (recovering) or shutting down."""

    code = "unavailable"


class Internal(SarpError):
    code = "internal"


class Moved(SarpError):
    """Cluster mode, rule heads (issue 27): the request's `route` is older than the
    shard's own splits (the sequence's region moved): re-read the shard map, send it
    again. Nothing was written."""

    code = "moved"


class StorageError(SarpError):
    """The backend failed to read or persist: nothing from that batch was acknowledged."""

    code = "unavailable"


class CorruptData(SarpError):
    """A file or value failed its checksum or layout checks; it is never served as data."""

    code = "internal"


class FormatVersionError(SarpError):
    """On-disk data written by a format this build does not read."""

    code = "internal"


# optional packages: top-level module -> the extra of pyproject.toml that brings it
EXTRAS = {"nats": "cluster", "wiredtiger": "wiredtiger", "dynamo": "peers",
          "matplotlib": "dev", "redis": "dev"}


def missing_extra(module: str | None) -> str | None:
    """What to install when `module` (a missing module's dotted name) belongs to an
    optional package: "needs the cluster extra (nats is not installed): pip install
    'sarp[cluster]'"; None when it is no extra's."""
    top = (module or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return f"needs the {extra} extra ({top} is not installed): pip install 'sarp[{extra}]'"
