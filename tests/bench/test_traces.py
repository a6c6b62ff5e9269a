"""Replay of Mooncake-format request traces (tools.bench.traces)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.bench.prefixes import common_prefix
from tools.bench.api import BLOCK_TOKENS
from tools.bench.traces import TraceWorkload
from tools.bench.workloads import get_workload

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"


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
