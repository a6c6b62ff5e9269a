"""The errors a storage backend raises: the engines' own, importing nothing of sarp.

Every message names the engine and its directory. The index core turns them into
sarp's errors (and wire codes) in one place (`sarpd.core.store`), as
`backends/bloomstore.py` turns BloomStore's into these:

    BackendIOError      -> StorageError        (unavailable)
    BackendCorrupt      -> CorruptData         (internal)
    BackendFormatError  -> FormatVersionError  (internal)
    BackendConfigError  -> ConfigError         (an operator's error: sarpd stops)

A caller's bug (a key that is not `bytes`, an empty key) stays a TypeError or a
ValueError: it is no backend failure.
"""

from __future__ import annotations


class BackendError(Exception):
    """Root of every error a backend raises on purpose (`message` names the engine)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BackendIOError(BackendError):
    """The engine could not read or persist (or was closed): nothing of the failed batch
    is visible."""


class BackendCorrupt(BackendError):
    """A page, file or value failed the engine's checksum or layout checks."""


class BackendFormatError(BackendError):
    """Engine files written in a format this build does not read."""


class BackendConfigError(BackendError):
    """An unknown backend, or a tunable out of range (an operator's error)."""
