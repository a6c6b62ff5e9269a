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
    match     sarpd.core._cmatch                 sarpd.core.router (deepest, plan_at),
                                                 sarpd.core.index (_verify_round)
    hash      sarpd.core._chash (libxxhash)      sarpd.core.ids (Python + xxhash)
    write     sarpd.core._cwrite                 sarpd.core.segment (codecs, locators)

Standard library only: setup.py loads this file to decide what to build (`xxhash_found`).
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

__all__ = ["ENABLED", "EXTENSIONS", "XXHASH_PROBE", "compiler", "expected", "module",
           "references", "status", "summary", "xxhash_found"]

ENABLED = os.environ.get("SARPD_NO_EXTENSIONS") != "1"

# path -> the extension module that runs it natively
EXTENSIONS: dict[str, str] = {
    "verify": "sarpd.core.verify._cverify",
    "hash": "sarpd.core._chash",
    "match": "sarpd.core._cmatch",
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


def _cc() -> list[str]:
    """The C compiler command the install builds with ($CC, as setuptools honours it)."""
    import shlex  # the build-time checks import what they need: a cold start does not
    import sysconfig

    return shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")


def compiler() -> str | None:
    """The C compiler the install would build with, if it is here."""
    import shutil

    cc = _cc()
    return shutil.which(cc[0]) if cc else None


XXHASH_PROBE = """#include <xxhash.h>
int main(void) { return (int)(XXH3_128bits("", 0).low64 & 0); }
"""


@functools.lru_cache(maxsize=1)
def xxhash_found() -> bool:
    """Whether the compiler finds libxxhash's header and library (Debian:
    libxxhash-dev): native hashing is built only then. Compiles and links a probe."""
    import subprocess
    import tempfile

    if compiler() is None:
        return False
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [*_cc(), "-x", "c", "-", "-o", os.path.join(tmp, "probe"), "-lxxhash"]
        try:
            done = subprocess.run(cmd, input=XXHASH_PROBE, capture_output=True, text=True,
                                  timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
    return done.returncode == 0


def expected() -> dict[str, bool]:
    """Per path: whether the install should have built (and this process loaded) it."""
    build = ENABLED and compiler() is not None
    return {path: build and (path != "hash" or xxhash_found()) for path in EXTENSIONS}


def summary() -> str:
    """One line for the install's output: which paths run natively, and why not."""

    def why(path: str) -> str:
        if not ENABLED:
            return "SARPD_NO_EXTENSIONS=1"
        if compiler() is None:
            return "no C compiler"
        if path == "hash" and not xxhash_found():
            return "libxxhash not found: apt-get install libxxhash-dev"
        return "built but not loaded: reinstall"

    run = status()
    return "sarp native paths: " + ", ".join(
        f"{p} native" if run[p] else f"{p} reference ({why(p)})" for p in EXTENSIONS)
