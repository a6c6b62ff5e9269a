"""The one place that picks native code.

Every hot path has a numpy/Python reference beside it; its C counterpart, when the
install built it, replaces the reference here and nowhere else. `SARPD_NO_EXTENSIONS=1`
forces every reference (tests run both ways); inside `with references():` every path
runs its reference whatever was built (the bench's `sarp-py`: both implementations in
one process, same build, same run), so callers ask `module(path)` at each call, not
once at import. `status()` says which paths run
natively (the bench's `native` field); `expected()` says which the install should have
built, for the test suite's guard (a compiler is here, and, for hashing, libxxhash's
header): an extension that should have loaded and did not is a broken install, not a
slower one.

    path      extension                          reference
    verify    sarpd.core.verify._cverify         sarpd.core.verify._numpy
    write     sarpd.core._cwrite                 sarpd.core.segment (codecs, locators)
"""

from __future__ import annotations

import importlib
import os
import shutil
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

ENABLED = os.environ.get("SARPD_NO_EXTENSIONS") != "1"

# path -> the extension module that runs it natively
EXTENSIONS: dict[str, str] = {
    "verify": "sarpd.core.verify._cverify",
    "write": "sarpd.core._cwrite",
}


def _load(name: str) -> ModuleType | None:
    if not ENABLED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


_loaded: dict[str, ModuleType | None] = {}  # filled on first use: an extension's package
# may itself ask this module for it while it is being imported


_forced = [False]  # inside references(): the one owner of this flag is this module


@contextmanager
def references() -> Iterator[None]:
    """Every path runs its reference inside (not thread-aware: for a benchmark's
    single-threaded replay, never for a serving process)."""
    before = _forced[0]
    _forced[0] = True
    try:
        yield
    finally:
        _forced[0] = before


def module(path: str) -> ModuleType | None:
    """The extension that runs `path` natively now, or None (the reference runs)."""
    if _forced[0]:
        return None
    if path not in _loaded:
        _loaded[path] = _load(EXTENSIONS[path])
    return _loaded[path]


def status() -> dict[str, bool]:
    """Per path: whether it runs natively in this process."""
    return {path: module(path) is not None for path in EXTENSIONS}


def compiler() -> str | None:
    """The C compiler the install would build with, if it is here."""
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(cc)


def expected() -> dict[str, bool]:
    """Per path: whether the install should have built (and this process loaded) it."""
    build = ENABLED and compiler() is not None
    return {path: build for path in EXTENSIONS}
