"""bloomstore/manifest.py: the snapshot and FLUSH records; lost FLUSH edits are
replayed from the log, a damaged or foreign manifest is refused."""

from __future__ import annotations

from pathlib import Path

from bloomstore import (
    BloomStore,
)
from tests.bloomstore.helpers import (
    QUIET,
    SMALL,
    assert_same,
)


def test_lost_manifest_edits_are_replayed_from_the_log(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"v%d" % i for i in range(600)}
    store.write(model, (), sync=True)  # flushes many pages: FLUSH edits after the snapshot
    assert sum(store.page_counts()) > 20
    store.close()
    manifest = path / "MANIFEST"
    with manifest.open("r+b") as fh:
        fh.truncate(manifest.stat().st_size - 500)
    store = BloomStore(path, None, QUIET)
    assert_same(store, model, 600)
    store.close()
