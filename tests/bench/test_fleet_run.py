"""The fleet benchmark's replay and scoring: agreement and holder-block error on hand
cases, and sarp's kill -9 run against its own sarpd (killed and restarted mid-replay)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.bench.fleet_workload import WORKERS, small_timeline
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Query, Timeline
from tools.bench.fleet_run import run_crash, score


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return small_timeline(seed=5, n=120)


def _q(truth: list[int]) -> Query:
    h = np.arange(1, 6, dtype=np.uint64)
    return Query(0, 0.0, h, h, np.array(truth, dtype=np.int32))


def test_score_agreement_and_holder_error() -> None:
    qs = [_q([3, 3, 0, 1]), _q([3, 3, 0, 1]), _q([0, 0, 0, 0]), _q([0, 2, 0, 0]), _q([1, 0, 0, 0])]
    answers = [
        {0: 3, 1: 3, 3: 1},  # exact
        {1: 3, 3: 2},  # first-ranked is worker 1 (tied best): agrees; error 3 + 1
        {},  # nobody holds block 0: an empty answer agrees
        {},  # worker 1 holds 2 blocks: an empty answer does not
        None,  # not answered: not scored
    ]
    agreement, error, answered = score(qs, answers, holders=4)
    assert (agreement, error, answered) == (0.75, 6, 4)
    assert score(qs, answers, holders=4, start=3) == (0.0, 2, 1)
    # K = 1: the model's answer is its top holder (ties by smaller worker)
    assert score(qs[:1], [{0: 3}], holders=1) == (1.0, 0, 1)
    assert score(qs[:1], [{1: 3}], holders=1) == (1.0, 6, 1)


def test_kill_9_run_against_its_own_sarpd(tmp_path: Path, timeline: Timeline) -> None:
    doc = run_crash(timeline, 0.0, FleetConfig(WORKERS, WORKERS), "direct", tmp_path / "c")
    assert doc["sync"] == "always" and doc["recovery_s"] > 0
    assert doc["agreement_after_recovery"] == 1.0 and doc["holder_blocks_error_after"] == 0
    assert doc["killed_after_queries"] > 0
    assert not (tmp_path / "c").exists()
