"""Markdown tables from saved `sarpctl bench --json FILE` results.

    python -m tools.bench.summarize RESULT.json [...]   # one table per file

Every file must have the same JSON schema (`schema`, absent in schema 1): schema 2
changed what `recovery_s` means (in-process, no interpreter start), so a table of
schema-1 and schema-2 runs would compare different things; mixing them is refused.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tools.bench.report import markdown_table
from tools.bench.runner import BenchResult


class SchemaMixError(ValueError):
    """Files of two JSON schemas were given together."""


def schema_of(doc: dict[str, Any]) -> int:
    return int(doc.get("schema", 1))


def check_one_schema(docs: list[tuple[str, dict[str, Any]]]) -> None:
    first: dict[int, str] = {}
    for path, doc in docs:
        first.setdefault(schema_of(doc), path)
    if len(first) > 1:
        named = ", ".join(f"{p} is schema {s}" for s, p in sorted(first.items()))
        raise SchemaMixError(
            f"refusing to mix result schemas: {named} (schema 2 measures recovery_s "
            "in-process and reads with direct I/O; re-run the older files)")


def _recovery_table(doc: dict[str, Any]) -> None:
    print(f"### recovery at {doc['blocks']:,} blocks ({doc['backend']})\n")
    print("| index | build s | recovery s | spawn s | x sarp | memory B | disk B |")
    print("|---|---|---|---|---|---|---|")
    done = [r for r in doc["results"] if "error" not in r]
    sarp = next((r["recovery_s"] for r in done if r["index"] == "sarp"), None)
    for r in done:
        ratio = f"{r['recovery_s'] / sarp:.2f}" if sarp else ""
        print(f"| {r['index']} | {r['build_s']:.1f} | {r['recovery_s']:.3f} | "
              f"{r.get('recovery_spawn_s', 0.0):.3f} | {ratio} | "
              f"{r['memory_bytes']:,} | {r['disk_bytes']:,} |")
    for r in doc["results"]:
        if "error" in r:
            print(f"\nFAILED {r['index']}: {r['error']}")
    print()


def main(paths: list[str]) -> None:
    docs = [(p, json.loads(Path(p).read_text())) for p in paths]
    check_one_schema(docs)
    for _, doc in docs:
        if "workload" not in doc:  # --recovery-only output
            _recovery_table(doc)
            continue
        print(markdown_table(BenchResult.from_json(doc)))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SchemaMixError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
