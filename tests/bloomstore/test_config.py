"""bloomstore/config.py: Geometry and Tuning refuse values outside their ranges
(ConfigError naming the tunable, the value and the range); the filter formulas."""

from __future__ import annotations

import math

import pytest

from bloomstore import ConfigError, Geometry, Tuning
from bloomstore.config import MAX_PARTITIONS, filter_fp_rate, optimal_hashes


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"partitions": 0}, r"partitions 0 is outside \[1, 4096\]"),
    ({"partitions": MAX_PARTITIONS + 1}, "partitions 4097"),
    ({"keys_per_page": 0}, "keys_per_page 0"),
    ({"bits_per_key": 65}, r"bits_per_key 65 is outside \[1, 64\]"),
    ({"hashes": 33}, r"hashes 33 is outside \[1, 32\]"),
    ({"keys_per_page": 4, "bits_per_key": 8}, r"filter bits .* 32 is outside \[64, "),
])
def test_geometry_checks_name_the_tunable_and_its_range(kwargs: dict[str, int],
                                                        named: str) -> None:
    with pytest.raises(ConfigError, match=named) as err:
        Geometry(**kwargs)
    assert err.value.message.startswith("bloomstore: ")
    assert isinstance(err.value, ValueError)  # a ConfigError is a ValueError too


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"page_bytes": 255}, r"page_bytes 255 is outside \[256, "),
    ({"wal_bytes": 1024}, r"wal_bytes 1024 is outside \[4096, "),
    ({"cache_bytes": -1}, "cache_bytes -1"),
    ({"dead_ratio": 0.0}, r"dead_ratio 0\.0 is outside \[0\.01, 1\.0\]"),
    ({"compact_min_pages": -1}, "compact_min_pages -1"),
    ({"max_buffered_bytes": 1000}, "max_buffered_bytes 1000"),
])
def test_tuning_checks_name_the_tunable_and_its_range(kwargs: dict[str, float],
                                                      named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Tuning(**kwargs)  # type: ignore[arg-type]


def test_defaults_and_derived_values() -> None:
    g = Geometry()
    assert (g.partitions, g.keys_per_page, g.bits_per_key, g.hashes) == (16, 256, 16, 11)
    assert g.filter_bits == 256 * 16
    assert g.target_fp_rate == pytest.approx(filter_fp_rate(16, 11))
    assert Tuning().fsync is True and Tuning(cache_bytes=0).cache_bytes == 0


def test_filter_formulas() -> None:
    assert optimal_hashes(10) == 7 and optimal_hashes(16) == 11 and optimal_hashes(1) == 1
    assert filter_fp_rate(0, 3) == 1.0
    assert filter_fp_rate(10, 7) == pytest.approx((1 - math.exp(-0.7)) ** 7)
    rates = [filter_fp_rate(b, optimal_hashes(b)) for b in (4, 8, 12, 16)]
    assert rates == sorted(rates, reverse=True)  # more bits per key, fewer false hits
    assert 0.0081 < filter_fp_rate(10, 7) < 0.0083  # the textbook ~0.82 %
