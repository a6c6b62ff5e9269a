"""tools/bench/indexer_api.py: sarpd's indexer API against Dynamo's indexer on the same
engines. A tiny run through the CLI reports every figure for both, sarp answers as
before right after its kill -9 and Dynamo comes back empty; every process is stopped
when the run is interrupted; the workload's own bookkeeping (sans-I/O)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tools.bench import indexer_api as ia
from tools.bench.indexer_parts import Marker

needs_dynamo = pytest.mark.skipif(importlib.util.find_spec("dynamo") is None,
                                  reason="ai-dynamo-runtime (dynamo.indexer) not installed; "
                                  "the dev extra installs it")


@needs_dynamo
def test_a_tiny_run_reports_every_figure_for_both(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    res = CliRunner().invoke(ia.main, [
        "--engines", "2", "--sequences", "40", "--clients", "2", "--seconds", "1",
        "--rate", "10", "--restart-timeout", "3",
        "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert [r["index"] for r in doc["indexes"]] == ["sarp", "dynamo"]
    assert (doc["engines"], doc["clients"], doc["sequences"]) == (2, 2, 40)
    assert doc["blocks_indexed"] > 0 and doc["cores"] >= 1
    sarp, dyn = doc["indexes"]
    for r in (sarp, dyn):
        assert r["queries_per_s"] > 0 and r["fill_s"] > 0
        assert 0 < r["query_us_p50"] <= r["query_us_p99"]
        assert r["query_us_p50_one_client"] > 0
        assert r["query_errors"] == 0 and r["empty_answers"] == 0  # real prefixes
        assert r["event_lag_ms_p99"] > 0 and r["markers"] > 0 and r["markers_unseen"] == 0
        assert r["rss_bytes"] > 0
        assert r["answers_equal_engines_before"] == 1.0  # both hold the engines' state
        assert r["probe_answers_before_nonempty"] == ia.PROBES
    # killed at once (its listeners' watermarks are saved as soon as a batch is
    # applied): its index answers as before, and nothing is replayed over it
    assert sarp["answers_right_after_restart"] == 1.0 and sarp["wrong_rounds"] == 0
    assert sarp["restart_s"] is not None and sarp["restart_s"] > 0
    assert sarp["converged_after_resume"] is True
    # Dynamo keeps nothing across a restart and nothing registered it again
    assert dyn["restart_s"] is None and dyn["answers_right_after_restart"] < 1.0
    assert dyn["converged_after_resume"] is False
    for name in ia.RATIOS:
        assert doc[name] is not None and doc[name] > 0


@needs_dynamo
def test_every_process_stops_when_the_run_is_interrupted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[ia.Indexer] = []

    def interrupted(bench: ia.Bench, opts: ia.Options) -> dict[str, Any]:
        seen.extend(bench.ixs)
        assert all(ix.proc is not None and ix.proc.poll() is None for ix in bench.ixs)
        raise KeyboardInterrupt

    monkeypatch.setattr(ia, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ia.run(ia.Options(engines=1))
    assert [ix.name for ix in seen] == ["sarp", "dynamo"]
    assert all(ix.proc is not None and ix.proc.poll() is not None for ix in seen)


def test_lag_figures_split_the_phase_in_tenths_and_tell_a_growing_backlog() -> None:
    """Markers published 1 s apart, each seen later than the one before (a backlog):
    the tenths' medians follow the lag, the last quarter is past twice the first, and
    a marker never seen counts until the end."""
    markers = [Marker(0, [], float(i)) for i in range(20)]
    for i, m in enumerate(markers[:-1]):
        m.seen["x"] = m.published + 0.01 * (i + 1)
    got = ia.lag_figures("x", markers, end=19.5)
    assert got["event_lag_ms_tenths"] == pytest.approx(
        [15.0, 35.0, 55.0, 75.0, 95.0, 115.0, 135.0, 155.0, 175.0, 345.0])
    assert got["backlog_grows"] is True and got["markers_unseen"] == 1
    assert got["event_lag_ms_max"] == pytest.approx(500.0)
