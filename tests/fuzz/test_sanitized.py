"""Under `make sanitize` (tools/ci/sanitize.sh sets SARP_SANITIZED_ROOT): every C
extension that loads is the copy built there with AddressSanitizer and
UndefinedBehaviorSanitizer, not the in-place build of the work tree. Skipped in any
other run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sarpd.core import native
from tests.fuzz._common import extension

ROOT = os.environ.get("SARP_SANITIZED_ROOT")


@pytest.mark.skipif(not ROOT, reason="not a `make sanitize` run")
def test_the_extensions_loaded_are_the_sanitized_build() -> None:
    assert ROOT is not None
    root = Path(ROOT).resolve()
    loaded = 0
    for path, want in native.expected().items():
        mod = extension(path)
        assert mod is not None or not want, f"{path}: the sanitized build did not load"
        if mod is None:
            continue
        so = Path(mod.__file__ or "").resolve()
        assert so.is_relative_to(root), f"{path}: loaded {so}, not the copy under {root}"
        data = so.read_bytes()
        assert b"__asan_" in data and b"__ubsan_" in data, f"{so}: not built with ASan+UBSan"
        loaded += 1
    assert loaded, "no C extension loaded"
