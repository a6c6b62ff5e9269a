"""bloomstore/errors.py: one root; the version message names both versions and which
side is newer; ConfigError is also a ValueError."""

from __future__ import annotations

from bloomstore.errors import (
    BloomStoreError,
    ConfigError,
    CorruptionError,
    FormatError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
    version_message,
)


def test_every_error_has_the_one_root_and_keeps_its_message() -> None:
    for cls in (StoreIOError, StoreClosedError, StoreLockedError, CorruptionError,
                FormatError, ConfigError):
        err = cls("/d: bad")
        assert isinstance(err, BloomStoreError) and err.message == str(err) == "/d: bad"
    assert issubclass(ConfigError, ValueError)
    assert not issubclass(CorruptionError, FormatError)


def test_version_message_names_both_versions_and_the_newer_side() -> None:
    newer = version_message("/d/MANIFEST", "manifest", 3, 1)
    assert newer == ("/d/MANIFEST: manifest format version 3 (a newer format); this build "
                     "reads version 1 only, and refuses to open it")
    assert "version 0 (an older format)" in version_message("/d/wal", "log", 0, 1)
