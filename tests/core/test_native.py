"""sarpd.core.native: the one place that picks native code, and what it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sarpd.core import native

PROBE = ("import json; from sarpd.core import native; "
         "print(json.dumps([native.ENABLED, native.status(), native.expected()]))")


def _probe(no_extensions: str | None) -> tuple[bool, dict[str, bool], dict[str, bool]]:
    env = {k: v for k, v in os.environ.items() if k != "SARPD_NO_EXTENSIONS"}
    if no_extensions is not None:
        env["SARPD_NO_EXTENSIONS"] = no_extensions
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                         text=True, check=True)
    enabled, status, expected = json.loads(out.stdout)
    return enabled, status, expected


def test_every_path_is_reported_by_status_and_expected() -> None:
    assert set(native.status()) == set(native.expected()) == set(native.EXTENSIONS)
    for path in native.EXTENSIONS:
        assert native.status()[path] == (getattr(native.pick(), path) is not None)


def test_no_extensions_forces_every_reference() -> None:
    enabled, status, expected = _probe("1")
    assert enabled is False
    assert not any(status.values()) and not any(expected.values())


def test_without_the_variable_what_was_built_is_loaded() -> None:
    enabled, status, expected = _probe(None)
    assert enabled is True
    for path, want in expected.items():
        assert status[path] or not want, f"{path}: expected native, the reference ran"


def test_an_index_runs_the_kernels_it_was_built_with_beside_another() -> None:
    """sarp and sarp-py in one process: each index calls through its own kernels."""
    import numpy as np

    from backends.memory import MemoryBackend
    from sarpd.config import IndexConfig
    from sarpd.core import verify
    from sarpd.core.directory import Directory
    from sarpd.core.index import SarpIndex

    ref = native.pick(reference=True)
    assert ref is native.REFERENCE and not any(ref.status().values()) and ref.name == "reference"
    assert native.pick() is native.pick()  # picked once
    fast = SarpIndex(MemoryBackend(), IndexConfig(), kernels=native.pick())
    slow = SarpIndex(MemoryBackend(), IndexConfig(), kernels=ref)
    assert fast.store.k is fast.router.k is fast.k
    assert type(slow.router.dir) is Directory  # the reference, whatever the install built
    cdir = native.pick().dir
    assert type(fast.router.dir) is (cdir.Directory if cdir is not None else Directory)
    assert slow.stats()["kernels"] == "reference" and slow.stats()["verifier"] == "numpy"
    assert fast.stats()["verifier"] == verify.implementation(native.pick())
    a = np.arange(20, dtype=np.uint64).reshape(10, 2)
    b = a.copy()
    b[7, 1] += np.uint64(1)
    for k in (ref, native.pick()):
        assert (verify.first_mismatch(a, b, k), verify.first_mismatch_many([a, a], [b, a], k)
                ) == (7, [7, 10])
