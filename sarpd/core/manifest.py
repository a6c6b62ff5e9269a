"""The data set's manifest: which format and geometry the backend's data was written in.

Key b"M" (sarpd/core/segment.py's key table), value a JSON object, keys sorted:

    format          int   FORMAT_VERSION: the on-disk format of the whole data set
    segment_format  int   sarpd.core.segment.SEGMENT_FORMAT: the newest segment value
                          format the data may hold (1: no holder tables; data of
                          segment format 1 is upgraded to 2 by its first open, which
                          writes only the manifest: format-1 values stay valid)
    hash            str   sarpd.core.ids.HASH_NAME (the id scheme)
    block_tokens    int   tokens per block
    segment_blocks  int   blocks per segment / window
    block_locators  bool  whether per-block locators are kept (absent in data
                          written before the setting existed: read as true)

Written once, when an empty backend is first opened. Every later open checks it:
another `format` is refused naming both versions (no migration), another geometry,
hash or locator setting is refused naming the setting. A missing manifest over
existing data is refused too (its format is unknown). The data is never touched by
a refusal.
"""

from __future__ import annotations

import json

from sarpd.config import IndexConfig
from sarpd.core.ids import HASH_NAME
from sarpd.core.segment import MANIFEST_KEY, SEGMENT_FORMAT
from sarpd.errors import CorruptData, FormatVersionError

FORMAT_VERSION = 1  # on-disk format of the whole data set

_SAME = ("hash", "block_tokens", "segment_blocks")
_UPGRADABLE_SEGMENT_FORMATS = (1,)  # read as they are; the manifest is rewritten


def expected_manifest(cfg: IndexConfig) -> dict[str, object]:
    """The manifest this build and configuration write (and expect to read)."""
    return {"format": FORMAT_VERSION, "segment_format": SEGMENT_FORMAT, "hash": HASH_NAME,
            "block_tokens": cfg.block_tokens, "segment_blocks": cfg.segment_blocks,
            "block_locators": cfg.block_locators}


def encode_manifest(cfg: IndexConfig) -> bytes:
    return json.dumps(expected_manifest(cfg), sort_keys=True).encode()


def missing_manifest() -> CorruptData:
    """The error for a backend that holds sarp data but no manifest."""
    return CorruptData(
        f"the manifest (key {MANIFEST_KEY!r}) is missing but the backend holds "
        "sarp data: its format is unknown, so it is not opened (restore the "
        "manifest, or start on an empty data directory)")


def check_manifest(raw: bytes, cfg: IndexConfig) -> bool:
    """Refuse a stored manifest this build or configuration cannot read. True when it
    must be rewritten (an older segment format this build reads and upgrades)."""
    try:
        have = json.loads(raw)
    except ValueError as exc:
        raise CorruptData(f"manifest is not JSON: {raw[:64]!r}") from exc
    fmt = have.get("format") if isinstance(have, dict) else None
    if not isinstance(fmt, int):
        raise CorruptData(f"manifest has no integer format version: {raw[:64]!r}")
    if fmt != FORMAT_VERSION:
        side = "newer" if fmt > FORMAT_VERSION else "older"
        raise FormatVersionError(
            f"data format {fmt} was written by a {side} sarpd; this build reads format "
            f"{FORMAT_VERSION} only (no migration from {fmt}): refusing to open it, the "
            "data is left untouched")
    want = expected_manifest(cfg)
    for k in _SAME:
        if have.get(k) != want[k]:
            raise FormatVersionError(f"data was written with {k}={have.get(k)!r}; "
                                     f"this configuration has {want[k]!r}")
    seg_fmt = have.get("segment_format")
    if seg_fmt != SEGMENT_FORMAT and seg_fmt not in _UPGRADABLE_SEGMENT_FORMATS:
        raise FormatVersionError(f"data was written with segment_format={seg_fmt!r}; this "
                                 f"build reads {SEGMENT_FORMAT} and upgrades "
                                 f"{', '.join(map(str, _UPGRADABLE_SEGMENT_FORMATS))}")
    # data written before the setting existed has every block's locator
    if have.get("block_locators", True) != cfg.block_locators:
        raise FormatVersionError(
            f"data was written with block_locators={have.get('block_locators', True)}; "
            f"this configuration has {cfg.block_locators} (blocks indexed without "
            "locators cannot be found by bare id: rebuild the index to change it)")
    return bool(seg_fmt != SEGMENT_FORMAT)
