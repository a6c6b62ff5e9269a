"""The harness end to end: `sarpctl bench` on a tiny trace runs every index in one
run, prints the JSON the issue specifies, agrees with the exact index, and writes a
report a person can read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sarpd.ctl.main import main
from tools.bench.runner import index_factories

FIELDS = {"index": str, "backend": str, "requests": int, "seconds": float,
          "throughput_rps": float, "match_us_mean": float, "match_us_p99": float,
          "tokens_reused": int, "tokens_queried": int, "recovery_s": float,
          "recovery_spawn_s": float, "memory_bytes": int, "routing_bytes": int,
          "reads_per_match": float, "disk_bytes": int}


def tiny_trace(tmp_path: Path) -> Path:
    """Sessions that share a prompt, grow turn by turn, and branch."""
    rows = []
    shared = list(range(1, 9))
    for s in range(6):
        ids = shared + [100 * (s + 1) + i for i in range(3)]
        for turn in range(4):
            ids = ids + [10_000 * (s + 1) + 10 * turn + i for i in range(2 + turn)]
            rows.append({"timestamp": len(rows), "input_length": 16 * len(ids) - 5,
                         "output_length": 10, "hash_ids": ids, "session_id": f"s{s}"})
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    tmp = tmp_path_factory.mktemp("bench")
    trace = tiny_trace(tmp)
    names = ",".join(n for n in index_factories() if n != "segment-hash-head")
    res = CliRunner().invoke(main, ["bench", "--workload", f"trace:{trace}", "--index", names,
                                    "--data-dir", str(tmp / "data"), "--json", "-",
                                    "--report", str(tmp / "report")])
    assert res.exit_code == 0, res.output
    doc: dict[str, object] = json.loads(res.stdout.strip().splitlines()[-1])
    doc["_report"] = str(tmp / "report")
    return doc


def test_json_has_the_specified_fields(bench_json: dict[str, object]) -> None:
    assert bench_json["schema"] == 2 and bench_json["direct_io"] is True  # the default
    assert bench_json["preload_blocks"] == 0
    assert isinstance(bench_json["cache_bytes"], int) and bench_json["cache_bytes"] > 0
    assert isinstance(bench_json["workload"], str) and bench_json["workload"].startswith("trace")
    assert bench_json["requests"] == 24
    assert isinstance(bench_json["blocks"], int) and bench_json["blocks"] > 0
    results = bench_json["results"]
    assert isinstance(results, list)
    assert {r["index"] for r in results} >= {"sarp", "dram-blockhash", "ssd-blockhash",
                                             "segment-hash", "segment-radix", "redis"}
    for r in results:
        for field, typ in FIELDS.items():
            assert isinstance(r[field], typ), (r["index"], field, r[field])
        assert r["requests"] == 24
        assert r["tokens_queried"] > 0 and r["recovery_s"] > 0
        assert r["recovery_spawn_s"] >= r["recovery_s"]  # the spawn's time includes it
        assert r["memory_bytes"] > 0
    by = {r["index"]: r for r in results}
    assert by["sarp"]["routing_bytes"] > 0 and by["segment-radix"]["routing_bytes"] > 0
    assert by["ssd-blockhash"]["routing_bytes"] == 0
    assert by["dram-blockhash"]["reads_per_match"] == 0  # its dict answers
    assert by["ssd-blockhash"]["reads_per_match"] >= 1 and by["redis"]["reads_per_match"] >= 1
    assert by["sarp"]["reads_per_match"] >= 0


def test_every_index_reuses_exactly_what_the_exact_index_does(
        bench_json: dict[str, object]) -> None:
    results = bench_json["results"]
    assert isinstance(results, list)
    reused = {r["index"]: r["tokens_reused"] for r in results}
    queried = {r["tokens_queried"] for r in results}
    assert len(queried) == 1  # every index saw the same requests
    assert reused["dram-blockhash"] > 0
    assert set(reused.values()) == {reused["dram-blockhash"]}, reused


def test_report_is_written(bench_json: dict[str, object]) -> None:
    report = Path(str(bench_json["_report"]))
    md = next(report.glob("*.md")).read_text()
    assert "| sarp |" in md and "| redis |" in md
    pngs = sorted(p.name for p in report.glob("*.png"))
    assert any(p.endswith("throughput.png") for p in pngs)
    assert any(p.endswith("recovery.png") for p in pngs)
    assert any(p.endswith("latency-cdf.png") for p in pngs)
    assert all((report / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)


def test_table_output_and_unknown_index(tmp_path: Path) -> None:
    trace = tiny_trace(tmp_path)
    runner = CliRunner()
    res = runner.invoke(main, ["bench", "-w", f"trace:{trace}", "--index", "sarp,dram-blockhash"])
    assert res.exit_code == 0, res.output
    assert "x sarp" in res.output and "dram-blockhash" in res.output
    bad = runner.invoke(main, ["bench", "-w", f"trace:{trace}", "--index", "nope"])
    assert bad.exit_code == 2 and "nope" in bad.output
    bad = runner.invoke(main, ["bench", "-w", "no-such-workload"])
    assert bad.exit_code == 2 and "codeact" in bad.output


def test_recovery_only_at_scale(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["bench", "--recovery-only", "--blocks", "5000",
                                    "--index", "sarp,dram-blockhash,redis",
                                    "--data-dir", str(tmp_path), "--json", "-"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["blocks"] == 5000
    got = {r["index"]: r for r in doc["results"]}
    assert set(got) == {"sarp", "dram-blockhash", "redis"}
    for r in got.values():
        assert r["recovery_s"] > 0 and r["build_s"] > 0 and r["disk_bytes"] > 0
    assert got["sarp"]["memory_bytes"] < got["dram-blockhash"]["memory_bytes"]


def test_json_names_the_verifier(bench_json: dict[str, object]) -> None:
    results = bench_json["results"]
    assert isinstance(results, list)
    sarp = next(r for r in results if r["index"] == "sarp")
    from sarpd.core import verify

    assert sarp["verifier"] == verify.implementation()


def test_a_failing_index_costs_only_its_own_result(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index that fails on purpose: its JSON entry is {index, error}, the others
    are printed, and the exit status says something failed. --page-cache reaches the
    JSON."""
    from tests.bench.test_runner import with_broken_index

    with_broken_index(monkeypatch)
    trace = tiny_trace(tmp_path)
    res = CliRunner().invoke(main, ["bench", "-w", f"trace:{trace}", "--page-cache",
                                    "--index", "broken,dram-blockhash", "--json", "-"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout.strip().splitlines()[-1])
    assert doc["direct_io"] is False and doc["schema"] == 2
    broken, exact = doc["results"]
    assert broken == {"index": "broken", "error": "broken: RuntimeError: broken on purpose"}
    assert exact["index"] == "dram-blockhash" and exact["tokens_reused"] > 0
    assert "failed: broken" in res.stderr
    table = CliRunner().invoke(main, ["bench", "-w", f"trace:{trace}",
                                      "--index", "dram-blockhash,broken"])
    assert table.exit_code == 1
    assert "FAILED broken: broken: RuntimeError: broken on purpose" in table.output
