"""Markdown tables from saved `sarpctl bench --json FILE` results.

    python -m tools.bench.summarize RESULT.json [...]   # one table per file
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.bench.report import markdown_table
from tools.bench.runner import BenchResult


def main(paths: list[str]) -> None:
    for p in paths:
        doc = json.loads(Path(p).read_text())
        if "workload" not in doc:  # --recovery-only output
            print(f"### recovery at {doc['blocks']:,} blocks ({doc['backend']})\n")
            print("| index | build s | recovery s | x sarp | memory B | disk B |")
            print("|---|---|---|---|---|---|")
            sarp = next((r["recovery_s"] for r in doc["results"] if r["index"] == "sarp"), None)
            for r in doc["results"]:
                ratio = f"{r['recovery_s'] / sarp:.2f}" if sarp else ""
                print(f"| {r['index']} | {r['build_s']:.1f} | {r['recovery_s']:.3f} | {ratio} | "
                      f"{r['memory_bytes']:,} | {r['disk_bytes']:,} |")
            print()
            continue
        print(markdown_table(BenchResult.from_json(doc)))


if __name__ == "__main__":
    main(sys.argv[1:])
