"""Shared fixtures: real `sarpd` processes on temp data dirs and sockets.

- `sarpd_factory`: call it to start a daemon (`backend=`, `config={"server": {...},
  "index": {...}}`, `sync=`, `extra_args=`, `env=`, `start=False` to start it later);
  every daemon it started is killed at the end of the test.
- `sarpd_proc`: one ready daemon with `--sync always`; the backend is "rocksdb"
  unless the test parametrises it indirectly:
  `@pytest.mark.parametrize("sarpd_proc", ["rocksdb", "memory"], indirect=True)`.
- `shared_sarpd`: one daemon per test module, for tests that only need some daemon
  (use a namespace of your own to stay independent of other tests).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon_helpers import Launcher, SarpdProc, launcher


@pytest.fixture
def sarpd_factory(tmp_path: Path) -> Iterator[Launcher]:
    with launcher(tmp_path) as lau:
        yield lau


@pytest.fixture
def sarpd_proc(request: pytest.FixtureRequest, sarpd_factory: Launcher) -> SarpdProc:
    backend = getattr(request, "param", "rocksdb")
    return sarpd_factory(backend=backend)


@pytest.fixture(scope="module")
def shared_sarpd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SarpdProc]:
    with launcher(tmp_path_factory.mktemp("shared")) as lau:
        yield lau()


def pytest_sessionstart(session: pytest.Session) -> None:
    """Guard: with a C compiler and without SARPD_NO_EXTENSIONS=1 the install builds
    the native paths (sarpd.core.native), so the suite must be running them (not
    silently the references)."""
    from sarpd.core import native

    missing = [p for p, want in native.expected().items() if want and not native.status()[p]]
    if missing:
        mods = ", ".join(native.EXTENSIONS[p] for p in missing)
        raise pytest.UsageError(
            f"native paths {', '.join(missing)} did not load ({mods}): a C compiler "
            f"({native.compiler()}) is here, so the install should have built them; rebuild "
            "with `pip install -e .` (or set SARPD_NO_EXTENSIONS=1 to test the references only)"
        )
