"""tools/first_contact.py: the script that times issue 22's targets. Its timed checks
run by hand (`python -m tools.first_contact`); here, the one without a time limit runs
against the real `sarpd`, and the leak pattern is checked on both sides."""

from __future__ import annotations

from pathlib import Path

from tools.first_contact import LEAKS, missing_parent


def test_missing_parent_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    outcome = missing_parent(tmp_path)
    assert outcome.ok, outcome.detail
    assert "does not exist" in outcome.detail


def test_the_leak_pattern_catches_internals_and_spares_sarp_messages() -> None:
    for leak in ("got <U1 (2,)", "got object (3,)", "OverflowError: int too big",
                 "invalid literal for int() with base 10", "msgpack.exceptions.ExtraData",
                 "dtype('int64')"):
        assert LEAKS.search(leak), leak
    for clean in ("tokens[2]: 99999999999999999999999 is not a uint32",
                  "meta: 18446744073709551616 is not a uint64", "tokens: {'a': 1} is not a "
                  "JSON list"):
        assert not LEAKS.search(clean), clean
