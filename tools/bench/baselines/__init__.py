"""The baselines of the evaluation harness, each a `tools.bench.api.BenchIndex`.

`BASELINES` maps each name to its class; the classes' docstrings say exactly how each
is built (the text docs/RESULTS.md uses). Every constructor takes `sync=` (the run's
durability policy); `segment-radix` also takes `cap_bytes=`. The modules are imported
on first use, so that a recovery process loads only the baseline it measures.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tools.bench.baselines._common import Baseline

_CLASSES: dict[str, tuple[str, str]] = {
    "dram-blockhash": ("tools.bench.baselines.blockhash", "DramBlockHash"),
    "ssd-blockhash": ("tools.bench.baselines.blockhash", "SsdBlockHash"),
    "segment-hash": ("tools.bench.baselines.segment_hash", "SegmentHash"),
    "segment-hash-head": ("tools.bench.baselines.segment_hash", "SegmentHashHead"),
    "segment-radix": ("tools.bench.baselines.segment_radix", "SegmentRadix"),
    "redis": ("tools.bench.baselines.redis_index", "RedisBlockHash"),
}

NAMES: tuple[str, ...] = tuple(_CLASSES)


def baseline_class(name: str) -> type[Baseline]:
    try:
        module, cls = _CLASSES[name]
    except KeyError:
        raise KeyError(f"baseline {name!r} is not known (known: {', '.join(NAMES)})") from None
    found: type[Baseline] = getattr(importlib.import_module(module), cls)
    return found


def __getattr__(attr: str) -> dict[str, type[Baseline]]:
    if attr == "BASELINES":
        return {name: baseline_class(name) for name in NAMES}
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")
