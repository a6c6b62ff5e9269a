"""The errors of the BloomStore engine (it imports nothing of sarp).

Every message names the store directory, the value at fault and, where there is
one, the limit it broke. `backends/bloomstore.py` maps them to the backend errors
(backends/errors.py): `CorruptionError` -> BackendCorrupt, `FormatError` ->
BackendFormatError, `ConfigError` -> BackendConfigError, the rest -> BackendIOError.
"""

from __future__ import annotations


class BloomStoreError(Exception):
    """Root of every error the engine raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class StoreIOError(BloomStoreError):
    """A read or write of a store file failed; a failed `write` leaves nothing of its
    batch visible."""


class StoreClosedError(BloomStoreError):
    """A call on a closed store (or a scan whose store was closed under it)."""


class StoreLockedError(BloomStoreError):
    """The directory is already open (in this process or in another one)."""


class CorruptionError(BloomStoreError):
    """A file failed its checksum or layout checks; its contents are never served."""


class FormatError(BloomStoreError):
    """A store file written in a format version this build does not read (a newer
    one, or an older one without a migration). Nothing is read from it."""


def version_message(where: str, what: str, found: int, supported: int) -> str:
    """Names both versions and which side is newer."""
    side = "a newer" if found > supported else "an older"
    return (f"{where}: {what} format version {found} ({side} format); this build reads "
            f"version {supported} only, and refuses to open it")


class ConfigError(BloomStoreError, ValueError):
    """A tunable out of range, or a geometry that differs from the stored one."""
