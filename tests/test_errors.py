"""sarpd/errors.py: one root, every error with its wire code (docs/PROTOCOL.md
"Error codes"), messages kept; ConfigError is an operator's error, no wire error."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from sarpd import errors
from sarpd.errors import BadRequest, ConfigError, FrameError, SarpError, TooLarge

PROTOCOL = Path(__file__).resolve().parents[1] / "docs" / "PROTOCOL.md"
CODES = {
    "SarpError": "internal",
    "ConfigError": "internal",
    "BadRequest": "bad_request",
    "UnknownOp": "unknown_op",
    "UnknownParent": "unknown_parent",
    "TooLarge": "too_large",
    "FrameError": "too_large",
    "Busy": "busy",
    "Forbidden": "forbidden",
    "QuotaExceeded": "quota_exceeded",
    "Unavailable": "unavailable",
    "Moved": "moved",
    "Internal": "internal",
    "StorageError": "unavailable",
    "CorruptData": "internal",
    "FormatVersionError": "internal",
    "NotFound": "not_found",
    "Conflict": "conflict",
}
HTTP_ONLY = {"not_found", "conflict"}  # the indexer API's (docs/HTTP.md), never on the socket
HTTP = PROTOCOL.with_name("HTTP.md")


def _classes() -> dict[str, type[SarpError]]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, SarpError)}


def test_every_error_has_the_one_root_and_its_wire_code() -> None:
    classes = _classes()
    assert set(classes) == set(CODES)  # a new error gets its line here
    for name, cls in classes.items():
        err = cls("field: 3 exceeds the limit (2)")
        assert isinstance(err, SarpError) and isinstance(err, Exception)
        assert err.code == CODES[name], name
        assert err.message == str(err) == "field: 3 exceeds the limit (2)"


def test_every_code_is_documented_in_the_protocol() -> None:
    text = PROTOCOL.read_text()
    section = text[text.index("Error codes:"):]
    documented = set(re.findall(r"`([a-z_]+)`", section[:section.index("\n\n")]))
    assert set(CODES.values()) - HTTP_ONLY <= documented, set(CODES.values()) - documented


def test_every_http_only_code_is_documented_with_the_api() -> None:
    text = HTTP.read_text()
    for code in HTTP_ONLY:
        assert f"`{code}`" in text, code


def test_config_error_is_not_a_wire_error() -> None:
    """An operator's error stops sarpd at startup; it is never a client's `bad_request`,
    and the wire decodes no code into it."""
    from sarpd.protocol.wire import error_from_code

    err = ConfigError("segment_blocks 65 not in 1..64")
    assert not isinstance(err, BadRequest) and err.code != "bad_request"
    assert not issubclass(BadRequest, ConfigError)
    for code in set(CODES.values()):
        assert not isinstance(error_from_code(code, "m"), ConfigError), code


@pytest.mark.parametrize("code", ["too_large", "bad_request"])
def test_frame_error_carries_the_code_of_its_cause(code: str) -> None:
    err = FrameError("frame of 9 bytes exceeds max_frame_size (8)", code)
    assert err.code == code and FrameError("m").code == "too_large"
    assert not isinstance(err, (TooLarge, BadRequest))  # the stream's, no request's error

