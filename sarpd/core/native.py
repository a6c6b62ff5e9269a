"""The one place that picks native code.

Every hot path has a numpy/Python reference beside it; its C counterpart, when the
install built it, replaces the reference here and nowhere else. `SARPD_NO_EXTENSIONS=1`
forces every reference (tests run both ways). `status()` says which paths run
natively (the bench's `native` field); `expected()` says which the install should have
built, for the test suite's guard (a compiler is here, and, for hashing, libxxhash's
header): an extension that should have loaded and did not is a broken install, not a
slower one.

    path      extension                          reference
    verify    sarpd.core.verify._cverify         sarpd.core.verify._numpy
"""

from __future__ import annotations

import importlib
import os
import shutil
import sysconfig
from types import ModuleType

ENABLED = os.environ.get("SARPD_NO_EXTENSIONS") != "1"

# path -> the extension module that runs it natively
EXTENSIONS: dict[str, str] = {
    "verify": "sarpd.core.verify._cverify",
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


def module(path: str) -> ModuleType | None:
    """The extension that runs `path` natively, or None (the reference runs)."""
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
