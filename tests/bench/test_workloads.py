"""Synthetic workloads (tools.bench.workloads) and trace replay (tools.bench.traces)."""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tools.bench.api import BLOCK_TOKENS, Ids, Turn
from tools.bench.traces import TraceWorkload
from tools.bench.workloads import (
    SHAPES,
    WORKLOADS,
    SyntheticWorkload,
    chain_ids,
    get_workload,
    parse_trace_spec,
    root_state,
    round_robin,
    system_prompts,
    token_ids,
)

NAMES = sorted(WORKLOADS)
SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


def turns_of(spec: str, scale: int = 1, seed: int = 0) -> list[Turn]:
    return list(get_workload(spec, scale, seed).turns())


def digest(turns: list[Turn]) -> str:
    h = hashlib.sha256()
    for t in turns:
        h.update(f"{t.session},{t.ns},{len(t.prompt)};".encode())
        h.update(t.sequence.tobytes())
    return h.hexdigest()


def is_prefix(a: Ids, b: Ids) -> bool:
    return len(a) <= len(b) and bool((b[: len(a)] == a).all())


def common_prefix(a: Ids, b: Ids) -> int:
    m = min(len(a), len(b))
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if len(diff) else m


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


def test_chain_ids_are_prefix_determined() -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(1, 32_000, size=16 * 40 + 7, dtype=np.uint64)
    b = a.copy()
    b[16 * 25 + 3] += np.uint64(1)  # differs inside block 25
    ia, ib = token_ids(a, 1), token_ids(b, 1)
    assert len(ia) == 40  # the partial tail is not a block
    assert common_prefix(ia, ib) == 25
    assert not set(ia[25:].tolist()) & set(ib[25:].tolist())
    assert common_prefix(token_ids(a, 1), token_ids(a, 2)) == 0
    assert len(chain_ids(np.empty(0, dtype=np.uint64), 1)) == 0


# --- traces ------------------------------------------------------------------------


def write_trace(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def row(n_in: int, ids: list[Any], **extra: Any) -> dict[str, Any]:
    return {"timestamp": 0, "input_length": n_in, "output_length": 10, "hash_ids": ids,
            **extra}


def test_trace_coarse_blocks_expand_to_fine_ids(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [
        row(1000, [1, 2]),  # 62 fine blocks: 32 of id 1, 30 of (partial) id 2
        row(1636, [1, 5, 6, 7]),  # shares coarse id 1 only
        row(1100, [1, 2, 8]),  # shares ids 1, 2: 64 fine blocks, 62 of them with row 1
        row(15, [9]),  # no whole block
        row(1000, [1, 2]),  # a repeat
    ])
    w = get_workload(f"trace:{path}@512")
    assert isinstance(w, TraceWorkload) and w.block_tokens == 512
    turns = list(w.turns())
    assert [len(t.prompt) for t in turns] == [62, 102, 68, 0, 62]
    assert all(t.prompt is t.sequence for t in turns)
    a, b, c, _, e = (t.prompt for t in turns)
    assert common_prefix(a, b) == 32
    assert common_prefix(a, c) == 62 and common_prefix(b, c) == 32
    assert (a == e).all()
    assert not set(b[32:].tolist()) & set(c.tolist())
    assert (np.concatenate([a, b, c]) != 0).all()
    assert "5 rows" in w.describe() and "@512" in w.describe()


def test_trace_sessions_given_or_derived(tmp_path: Path) -> None:
    given = write_trace(tmp_path / "given.jsonl", [
        row(40, [1, 2, 3], session_id="x"), row(70, [1, 2, 4, 5, 6], session_id="y"),
        row(80, [1, 2, 4, 5, 7], session_id="x")])
    assert [t.session for t in TraceWorkload(given).turns()] == [0, 1, 0]
    assert [len(t.prompt) for t in TraceWorkload(given).turns()] == [2, 4, 5]
    derived = write_trace(tmp_path / "derived.jsonl", [
        row(48, [1, 2, 3]),  # session 0
        row(40, [1, 4, 5]),  # shares only block 1 (its tail is not new): session 1
        row(64, [1, 2, 3, 6]),  # extends row 1: session 0
        row(60, [1, 4, 5, 8]),  # extends row 2 (tail 4 was new when it came): session 1
        row(32, [1, 2]),  # extends nothing whole: new session
    ])
    w = TraceWorkload(derived)
    assert [t.session for t in w.turns()] == [0, 1, 0, 1, 2]
    assert w.stats().sessions == 3 and w.stats().rows == 5


def test_trace_scale_and_seed(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [row(100, [1] * 7), row(200, [1] * 13)])
    one = list(TraceWorkload(path).turns())
    two = list(TraceWorkload(path, scale=2).turns())
    assert [t.session for t in two] == [0, 1, 0, 1]  # row 2 continues row 1's session
    assert [len(t.prompt) for t in two] == [6, 6, 12, 12]
    assert (two[0].prompt == one[0].prompt).all() and (two[2].prompt == one[1].prompt).all()
    assert not set(two[1].prompt.tolist()) & set(two[2].prompt.tolist())
    other = list(TraceWorkload(path, seed=1).turns())
    assert not set(other[0].prompt.tolist()) & set(one[0].prompt.tolist())
    assert "4 rows, 2 sessions x 2 copies" in TraceWorkload(path, scale=2).describe()
    with pytest.raises(ValueError, match="multiple of 16 tokens, got 100"):
        TraceWorkload(path, 100)


GOOD = json.dumps(row(40, [1, 2, 3]))


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({"timestamp": 0, "input_length": 4, "hash_ids": [1]}),
     "missing field 'output_length'"),
    (json.dumps(row(-1, [])), "field 'input_length' must be a non-negative integer, got -1"),
    (json.dumps(row(40, [1, "2", 3])), r"hash_ids\[1\] must be an integer"),
    (json.dumps(row(40, [1, -2, 3])), r"hash_ids\[1\] must be an integer"),
    (json.dumps(row(40, [1])), "hash_ids has 1 ids but input_length 40 at 16 tokens"),
    (json.dumps(row(40, [1, 2, 3, 4])), "needs 2-3"),
    (json.dumps({**row(40, [1, 2, 3]), "timestamp": "x"}), "'timestamp' must be a number"),
    (json.dumps(row(40, [1, 2, 3], session_id=[1])), "'session_id' must be a string"),
])
def test_trace_malformed_line_names_path_and_line(tmp_path: Path, line: str,
                                                  message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(f"{GOOD}\n\n{line}\n{GOOD}\n")  # the blank line 2 is skipped
    w = TraceWorkload(path)
    with pytest.raises(ValueError, match=message) as e:
        list(w.turns())
    assert str(e.value).startswith(f"{path}:3: ")
    with pytest.raises(ValueError, match=message):
        w.describe()


def test_trace_wrong_block_size_is_caught(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [row(1000, [1, 2])])  # a 512-token trace
    with pytest.raises(ValueError, match=r"t.jsonl:1: .*needs 62-63 .*trace:PATH@BLOCKSIZE"):
        list(TraceWorkload(path).turns())


@pytest.mark.parametrize(("name", "block", "rows", "sessions"), [
    ("mooncake_fast25_conversation_trace.jsonl", 512, 12_031, None),
    ("mooncake_fast25_synthetic_trace.jsonl", 512, 3_993, None),
    ("lmcache_agent_trace_blk16.jsonl", 16, 1_619, 69),
])
def test_shared_traces_load(name: str, block: int, rows: int, sessions: int | None) -> None:
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"shared trace {path} is absent (the shared folder sits beside the clone)")
    w = get_workload(f"trace:{path}@{block}")
    assert isinstance(w, TraceWorkload)
    with path.open() as f:
        lengths = [json.loads(line)["input_length"] for line in f]
    turns = list(w.turns())
    assert len(turns) == len(lengths) == rows
    assert [len(t.prompt) for t in turns] == [n // BLOCK_TOKENS for n in lengths]
    assert w.stats().rows == rows
    if sessions is not None:
        assert w.stats().sessions == sessions == len({t.session for t in turns})
    assert f"{rows:,} rows" in w.describe()
