"""tools/bench/targets.py: every ratio is between indexes of one run, a missing index
reads "-", and a run without sarp is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tools.bench.targets import main, row, table, workload_name


def result(index: str, match_us: float, rps: float, reused: int = 1000,
           eff: float = 0.0) -> dict[str, Any]:
    return {"index": index, "match_us_mean": match_us, "throughput_rps": rps,
            "tokens_reused": reused, "kernel_efficiency": eff}


def doc(*results: dict[str, Any], preload: int = 0, direct: bool = True) -> dict[str, Any]:
    return {"workload": "branchy", "preload_blocks": preload, "direct_io": direct,
            "results": list(results)}


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip("|").split("|")]


def test_ratios_are_taken_within_the_run() -> None:
    d = doc(result("sarp", 10, 800, 990, eff=1.25), result("sarp-py", 55, 300, 990, eff=4.0),
            result("dram-blockhash", 2, 1600, 1000), result("ssd-blockhash", 400, 100),
            result("segment-radix", 8, 400), result("segment-hash", 20, 1000))
    c = cells(row(d, "branchy"))
    assert c[:3] == ["branchy", "0", "direct"]
    assert c[3] == "5.50"  # 55 / 10
    assert c[4] == "1.25 / 4.00"
    assert c[5:9] == ["0.50", "8.00", "2.00", "0.80"]
    assert c[9] == "segment-radix"  # 8 us: the lowest mean match time of the SSD designs
    assert c[10] == "1.0000"  # 10 of 1,000 tokens below the exact index


def test_missing_indexes_read_as_a_dash() -> None:
    c = cells(row(doc(result("sarp", 10, 800, eff=2.0), preload=10_000_000, direct=False),
                  "w"))
    assert c[1:3] == ["10,000,000", "page cache"]
    assert c[3] == "-" and c[4] == "2.00" and c[5:11] == ["-"] * 6


def test_a_run_without_sarp_is_refused() -> None:
    with pytest.raises(ValueError, match=r"w: the run has no sarp result.*dram-blockhash"):
        row(doc(result("dram-blockhash", 2, 1600)), "w")
    failed = {"index": "sarp", "error": "boom"}
    with pytest.raises(ValueError, match="no sarp result"):
        row(doc(failed), "w")


def test_table_and_main_read_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "run.json"
    d = doc(result("sarp", 10, 800))
    d["workload"] = "trace:/x/lmcache_agent_trace_blk16.jsonl@16"
    f.write_text(json.dumps(d))
    lines = table([f]).splitlines()
    assert len(lines) == 3 and lines[1].count("---") == len(cells(lines[0]))
    assert cells(lines[2])[0] == "lmcache_agent_trace_blk16"
    assert main([str(f)]) == 0 and "lmcache_agent_trace_blk16" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.json")]) == 2
    assert "error:" in capsys.readouterr().err
    assert main([]) == 2


def test_workload_names() -> None:
    assert workload_name("codeact") == "codeact"
    assert workload_name("trace:mooncake_fast25_conversation_trace.jsonl@512") == \
        "mooncake_fast25_conversation_trace"
