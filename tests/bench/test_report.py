"""Human-readable bench output (tools.bench.report): the terminal table with ratios
against sarp and reuse loss against the exact index, the Markdown table, the plots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tools.bench.report import (
    COLUMNS,
    conditions,
    markdown_table,
    rows,
    text_table,
    write_report,
)
from tools.bench.runner import BenchResult, IndexFailure, IndexResult


def result(index: str, rps: float, reused: int, recovery_s: float) -> IndexResult:
    return IndexResult(index=index, backend="rocksdb", requests=100, seconds=100 / rps,
                       throughput_rps=rps, match_us_mean=12.5, match_us_p99=40.0,
                       tokens_reused=reused, tokens_queried=2000, recovery_s=recovery_s,
                       memory_bytes=3 * 1024 * 1024, disk_bytes=512, verifier="numpy",
                       recovery_spawn_s=recovery_s + 0.25, routing_bytes=2048,
                       reads_per_match=1.5, match_us=[10.0, 20.0, 40.0])


def bench() -> BenchResult:
    return BenchResult("codeact", "codeact: 12 sessions", 100, 900, 1 << 20, [
        result("sarp", 2000.0, 1600, 0.5),
        result("dram-blockhash", 4000.0, 1600, 1.0),
        result("segment-hash", 1000.0, 1200, 0.25),
    ])


def test_rows_have_ratios_against_sarp_and_loss_against_the_exact_index() -> None:
    sarp, exact, seg = rows(bench())
    assert len(sarp) == len(COLUMNS)
    col = {c: i for i, c in enumerate(COLUMNS)}
    assert sarp[:3] == ["sarp", "2,000", "1"] and sarp[col["rec x sarp"]] == "1"
    assert exact[2] == "0.50" and exact[col["rec x sarp"]] == "2.00" and exact[6] == "0.0000"
    assert seg[2] == "2.00" and seg[6] == "25.0000" and seg[col["rec x sarp"]] == "0.50"
    assert seg[col["recover s"]] == "0.2500" and seg[col["spawn s"]] == "0.5000"
    assert seg[col["memory"]] == "3.0 MiB" and seg[col["routing"]] == "2.0 KiB"
    assert seg[col["reads/match"]] == "1.50" and seg[col["disk"]] == "512 B"


def test_text_table_is_aligned_and_explains_its_ratios() -> None:
    text = text_table(bench())
    head, desc, cols, *body = text.splitlines()
    assert head == ("workload codeact: 100 requests, 900 unique blocks, memory budget "
                    "1.0 MiB (engine cache + write buffers + own caches), page cache on, "
                    "preload 0 blocks, "
                    "schema 2, sarp verifier: numpy")
    assert desc == "codeact: 12 sessions"
    assert cols.split() [:3] == ["index", "req/s", "x"]
    assert len({len(line) for line in [cols, *body[:3]]}) == 1  # right-justified columns
    assert "'x sarp': sarp's throughput / this index's" in text


def test_markdown_table() -> None:
    md = markdown_table(bench())
    lines = md.splitlines()
    assert lines[0] == "### codeact" and lines[2].startswith("codeact: 12 sessions; memory")
    assert lines[4] == "| " + " | ".join(COLUMNS) + " |"
    assert lines[6].startswith("| sarp | 2,000 | 1 |") and len(lines) == 9


def test_write_report_writes_markdown_and_plots(tmp_path: Path) -> None:
    res = bench()
    res = BenchResult("trace:a/b.jsonl@512", res.description, res.requests, res.blocks,
                      res.cache_bytes, res.results)
    paths = write_report(res, tmp_path / "r")
    names = sorted(p.name for p in paths)
    slug = "trace_a_b.jsonl_512"
    assert names == sorted([f"{slug}.md", f"{slug}-throughput.png", f"{slug}-recovery.png",
                            f"{slug}-loss.png", f"{slug}-latency-cdf.png"])
    assert all(p.stat().st_size > 0 for p in paths)
    assert (tmp_path / "r" / f"{slug}.md").read_text() == markdown_table(res)


def test_a_failed_index_is_listed_under_the_tables() -> None:
    res = bench()
    res = BenchResult(res.workload, res.description, res.requests, res.blocks,
                      res.cache_bytes, [*res.results, IndexFailure("redis", "redis: boom")],
                      direct_io=True)
    assert len(rows(res)) == 3
    text = text_table(res)
    assert "FAILED redis: redis: boom" in text and "direct I/O" in text
    md = markdown_table(res)
    assert md.rstrip().endswith("FAILED redis: redis: boom")


@pytest.mark.parametrize(("budget", "note"), [
    (1 << 20, "wiredtiger keeps a cache of at least 32.0 MiB (a write batch must fit), "
              "more than this budget"),
    (48 << 20, "wiredtiger keeps a cache of at least 32.0 MiB (a write batch must fit), "
               "more than sarp's engine share of this budget"),
    (64 << 20, None)])
def test_conditions_say_when_wiredtigers_cache_floor_is_above_the_budget(
        budget: int, note: str | None) -> None:
    wt = dataclasses.replace(result("ssd-blockhash", 1000.0, 1600, 0.5), backend="wiredtiger")
    res = BenchResult("codeact", "", 100, 900, budget, [result("sarp", 2000.0, 1600, 0.5), wt])
    text = conditions(res)
    if note is None:
        assert "wiredtiger" not in text
    else:
        assert text.endswith(f"schema 2; {note}") and text.count("wiredtiger") == 1
    assert "wiredtiger" not in conditions(dataclasses.replace(res, results=res.results[:1]))
