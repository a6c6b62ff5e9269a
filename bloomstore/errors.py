"""The errors of the BloomStore engine (it imports nothing of sarp).

Every message names the store directory, the value at fault and, where there is
one, the limit it broke. `backends/bloomstore.py` maps them to sarp's errors:
`CorruptionError` -> CorruptData, `ConfigError` -> BadRequest, the rest ->
StorageError.
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


class ConfigError(BloomStoreError, ValueError):
    """A tunable out of range, or a geometry that differs from the stored one."""
