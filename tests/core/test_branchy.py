"""Exactness on branchy traffic (issue 12): sessions that branch from inside earlier
ones, many siblings of one parent (retries, regenerations, tree search), edits and
shared templates. The DEFAULT configuration must reuse exactly what the exact oracle
reuses, on every backend: this is where a fixed per-window cap drops the right
candidate (its siblings' fingerprints tie with it and newer ones are read first)."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.registry import backend_names
from sarpd.config import IndexConfig
from tests.core.test_index import GEOMETRIES, _run
from tests.oracle import BT

GEOMETRIES["default-exact"] = IndexConfig()  # the shipped defaults, nothing widened

Op = tuple[str, object]


def _blocks(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(32_000) for _ in range(n * BT))


@st.composite
def branchy(draw: st.DrawFn) -> list[Op]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    templates = [_blocks(rng, draw(st.integers(1, 70))) for _ in range(draw(st.integers(1, 3)))]
    seqs: list[tuple[int, ...]] = []
    ops: list[Op] = []

    def insert(toks: tuple[int, ...]) -> None:
        seqs.append(toks)
        ops.append(("insert", ("", toks, draw(st.integers(0, 3)))))

    for _ in range(draw(st.integers(2, 14))):
        kind = draw(st.sampled_from(["new", "turn", "branch", "siblings", "siblings", "edit"]))
        if kind == "new" or not seqs:
            insert(draw(st.sampled_from(templates)) + _blocks(rng, draw(st.integers(0, 8))))
            continue
        src = seqs[draw(st.integers(0, len(seqs) - 1))]
        n = len(src) // BT
        if kind == "turn":  # the session goes on
            insert(src + _blocks(rng, draw(st.integers(1, 20))))
        elif kind == "branch":  # from inside an earlier sequence, at any block
            insert(src[: BT * draw(st.integers(0, n))] + _blocks(rng, draw(st.integers(1, 10))))
        elif kind == "edit":  # a message edited: same head, the turn replaced
            cut = max(0, n - draw(st.integers(1, 6)))
            insert(src[: BT * cut] + _blocks(rng, draw(st.integers(1, 8))))
        else:  # retries / tree search: many siblings of one parent
            cut = BT * draw(st.integers(1, n))
            for _ in range(draw(st.integers(4, 30))):
                insert(src[:cut] + _blocks(rng, draw(st.integers(1, 3))))
        ops.append(("check_all", None))
    ops.append(("check_all", None))
    return ops


@pytest.mark.parametrize("backend_name", backend_names())
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=branchy())
def test_default_configuration_is_exact_on_branchy_sessions(backend_name: str,
                                                            ops: list[Op]) -> None:
    _run(backend_name, "default-exact", ops)
