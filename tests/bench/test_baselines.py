"""The baseline registry (tools.bench.baselines): every name, its class and its
description; an unknown name."""

from __future__ import annotations

import pytest

from tools.bench.api import BenchIndex
from tools.bench.baselines import NAMES, baseline_class
from tools.bench.baselines._common import Baseline


def test_registry() -> None:
    from tools.bench.baselines import BASELINES

    assert set(BASELINES) == set(NAMES) >= {"dram-blockhash", "ssd-blockhash", "segment-hash",
                                            "segment-hash-head", "segment-radix", "redis"}
    for name, cls in BASELINES.items():
        assert cls.name == name
        assert cls.__doc__ and len(cls.__doc__) > 200  # the text RESULTS.md uses
    with pytest.raises(KeyError, match="not known"):
        baseline_class("nope")


def _conforms(index: Baseline) -> BenchIndex:
    return index  # mypy: every baseline implements tools.bench.api.BenchIndex
