"""The shard log measurement runs end to end on a real cluster (figures not checked:
no assertion on speed)."""

from __future__ import annotations

import pytest

from tools.cluster import measure_log


def test_the_log_measurement_reports_both_stream_sizes(
        capsys: pytest.CaptureFixture[str]) -> None:
    measure_log.main(["5"])
    out = capsys.readouterr().out
    assert "R1: publish p50 " in out and "R3: publish p50 " in out
    assert "R3 vs R1 (same run): publish p50 x" in out and "(5 entries)" in out
    assert "python -m tools.cluster.measure_log 5" in out
