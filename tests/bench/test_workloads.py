"""Synthetic workloads and the workload registry (tools.bench.workloads)."""

from __future__ import annotations

import hashlib
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from tests.bench.prefixes import common_prefix, is_prefix
from tools.bench.api import BLOCK_TOKENS, Ids, Turn
from tools.bench.branchy import SHAPES as BRANCHY
from tools.bench.chains import root_state, token_ids
from tools.bench.workloads import (
    SHAPES,
    WORKLOADS,
    SyntheticWorkload,
    get_workload,
    parse_trace_spec,
    round_robin,
    system_prompts,
)

NAMES = sorted(SHAPES)  # the synthetic workloads (the branchy ones: test_branchy.py)


def turns_of(spec: str, scale: int = 1, seed: int = 0) -> list[Turn]:
    return list(get_workload(spec, scale, seed).turns())


def digest(turns: list[Turn]) -> str:
    h = hashlib.sha256()
    for t in turns:
        h.update(f"{t.session},{t.ns},{len(t.prompt)};".encode())
        h.update(t.sequence.tobytes())
    return h.hexdigest()


def by_session(turns: list[Turn]) -> dict[int, list[Turn]]:
    out: dict[int, list[Turn]] = defaultdict(list)
    for t in turns:
        out[t.session].append(t)
    return out


@pytest.fixture(scope="module")
def scale1() -> dict[str, list[Turn]]:
    return {n: turns_of(n) for n in NAMES}


# --- synthetic workloads -----------------------------------------------------------


def test_registry_has_the_four_workloads() -> None:
    assert set(NAMES) == {"codeact", "agent", "sharegpt-long", "ultrachat"}
    assert set(WORKLOADS) == set(NAMES) | set(BRANCHY)
    for n in NAMES:
        w = get_workload(n)
        assert w.name == n
        assert w.describe().startswith(f"{n}: {SHAPES[n].sessions:,} sessions")


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_for_a_seed(name: str, scale1: dict[str, list[Turn]]) -> None:
    assert digest(turns_of(name)) == digest(scale1[name])
    assert digest(turns_of(name, seed=1)) != digest(scale1[name])


@pytest.mark.parametrize("name", NAMES)
def test_turns_are_well_formed(name: str, scale1: dict[str, list[Turn]]) -> None:
    turns = scale1[name]
    assert turns
    for t in turns:
        assert t.ns == name
        for ids in (t.prompt, t.sequence):
            assert ids.dtype == np.uint64 and ids.ndim == 1
            assert not ids.flags.writeable
        assert is_prefix(t.prompt, t.sequence)
        assert len(t.prompt) > 0
    everything = np.concatenate([t.sequence for t in turns])
    assert (everything != 0).all()
    if SHAPES[name].index_output:
        assert sum(len(t.sequence) > len(t.prompt) for t in turns) > len(turns) // 2
    else:
        assert all(len(t.sequence) == len(t.prompt) for t in turns)


@pytest.mark.parametrize("name", NAMES)
def test_history_accumulates(name: str, scale1: dict[str, list[Turn]]) -> None:
    """Each turn extends its session's previous turn (history + new input), but for a
    branch, which shares a prefix with the abandoned turn and then diverges."""
    branches = 0
    for turns in by_session(scale1[name]).values():
        for prev, t in itertools.pairwise(turns):
            if is_prefix(prev.sequence, t.prompt):
                assert len(t.prompt) > len(prev.sequence)
                if not SHAPES[name].index_output:  # the output is recomputed as input
                    assert len(t.prompt) > len(prev.prompt)
            else:
                branches += 1
                assert 0 < common_prefix(prev.sequence, t.sequence) < len(prev.sequence)
    assert (branches > 0) == (SHAPES[name].branch_share > 0)


def branch_kinds(turns: list[Turn]) -> list[str]:
    """Classify every branch; check it shares then diverges and is followed."""
    kinds = []
    for session in by_session(turns).values():
        for i in range(1, len(session)):
            before, prev, t = session[i - 2] if i >= 2 else None, session[i - 1], session[i]
            if is_prefix(prev.sequence, t.prompt):
                continue
            if len(t.prompt) == len(prev.prompt) and (t.prompt == prev.prompt).all():
                kinds.append("regen")  # same prompt, new output
                assert common_prefix(prev.sequence, t.sequence) == len(t.prompt)
            else:
                kinds.append("edit")  # new input after the turn before
                assert before is not None
                assert is_prefix(before.sequence, t.prompt)
                assert common_prefix(prev.prompt, t.prompt) == len(before.sequence)
            if i + 1 < len(session):  # later turns follow the branch, not the abandoned turn
                assert is_prefix(t.sequence, session[i + 1].prompt)
                assert not is_prefix(prev.sequence, session[i + 1].prompt)
    return kinds


def test_branching_regenerates_or_edits() -> None:
    kinds = branch_kinds(turns_of("codeact", seed=1)) + branch_kinds(turns_of("codeact"))
    assert set(kinds) == {"regen", "edit"}
    assert set(branch_kinds(turns_of("sharegpt-long", seed=1))) == {"edit"}


def test_system_prompts_share_ids_across_sessions(scale1: dict[str, list[Turn]]) -> None:
    shape = SHAPES["codeact"]
    systems = system_prompts(shape, 0)
    root = root_state(0, shape.tag)
    heads = {bytes(token_ids(s, root).tobytes()) for s in systems}
    firsts = [ts[0].prompt for ts in by_session(scale1["codeact"]).values()]
    common = shape.system_common // BLOCK_TOKENS
    assert len({f[:common].tobytes() for f in firsts}) == 1  # the common header
    used = set()
    for f in firsts:  # every session starts with the whole blocks of one variant
        match = [h for h in heads if f.tobytes().startswith(h)]
        assert len(match) == 1
        used.add(match[0])
    assert len(used) > 1
    # ultrachat: 2,000 chats open with one of 5 short system prompts
    first_ids = {ts[0].prompt[0] for ts in by_session(scale1["ultrachat"]).values()}
    assert 1 < len(first_ids) <= SHAPES["ultrachat"].systems


@pytest.mark.parametrize("name", ["codeact", "agent", "sharegpt-long"])
def test_sessions_share_nothing_past_the_system_prompt(
        name: str, scale1: dict[str, list[Turn]]) -> None:
    shape = SHAPES[name]
    sys_blocks = shape.system_tokens[1] // BLOCK_TOKENS
    sessions = by_session(scale1[name])
    owned: dict[int, int] = {}
    for s, turns in sessions.items():
        for t in turns:
            for x in t.sequence[sys_blocks:].tolist():
                assert owned.setdefault(x, s) == s


def test_scale_grows_sessions_and_turns() -> None:
    for name in ("codeact", "ultrachat"):
        one, two = turns_of(name), turns_of(name, scale=2)
        assert len({t.session for t in two}) == 2 * len({t.session for t in one})
        assert len(two) > 1.5 * len(one)
        a, b = by_session(one), by_session(two)  # scale 2 extends scale 1
        assert all(digest(a[s]) == digest(b[s]) for s in a)


def test_round_robin_unit() -> None:
    lengths = [3, 1, 2, 1]
    empty = np.empty(0, dtype=np.uint64)

    def build(i: int) -> list[tuple[Ids, Ids]]:
        return [(empty, empty)] * lengths[i]

    order = [s for s, _, _ in round_robin(4, 2, build)]
    assert order == [0, 1, 0, 2, 0, 2, 3]
    assert [s for s, _, _ in round_robin(4, 10, build)] == [0, 1, 2, 3, 0, 2, 0]


@pytest.mark.parametrize("name", NAMES)
def test_round_robin_order(name: str, scale1: dict[str, list[Turn]]) -> None:
    """Rounds over at most `active` sessions in admission order; sessions start in
    order; between two turns of a session every other open session goes once."""
    active = SHAPES[name].active
    turns = scale1[name]
    assert [t.session for t in turns[:active]] == list(range(active))
    last = {}
    for i, t in enumerate(turns):
        last[t.session] = i
    started: list[int] = []
    open_: set[int] = set()
    prev_pos: dict[int, int] = {}
    for i, t in enumerate(turns):
        s = t.session
        if s not in prev_pos:
            assert s == len(started)
            started.append(s)
            open_.add(s)
        else:
            between = [u.session for u in turns[prev_pos[s] + 1: i]]
            assert len(between) == len(set(between)) and s not in between
        assert len(open_) <= active
        prev_pos[s] = i
        if last[s] == i:
            open_.discard(s)


def test_get_workload_errors_and_specs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown workload 'nope'; known: .*codeact"):
        get_workload("nope")
    with pytest.raises(ValueError, match="scale must be >= 1, got 0"):
        get_workload("codeact", scale=0)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        SyntheticWorkload("agent", 1, -1)
    assert parse_trace_spec("trace:a/b.jsonl") == (Path("a/b.jsonl"), 16)
    assert parse_trace_spec("trace:a/b.jsonl@512") == (Path("a/b.jsonl"), 512)
    assert parse_trace_spec("trace:a@b/c.jsonl") == (Path("a@b/c.jsonl"), 16)
    with pytest.raises(ValueError, match="needs a path"):
        get_workload("trace:")
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        get_workload(f"trace:{tmp_path / 'missing.jsonl'}@512")
