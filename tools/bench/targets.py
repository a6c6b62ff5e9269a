"""The speed targets (issues 12 and 14) as one Markdown table, from saved bench runs.

    python -m tools.bench.targets RUN.json [...]     # one row per file

Each file is a `sarpctl bench --json FILE` run; every ratio is between indexes of the
SAME run (same machine state, same replay), and a column whose indexes the run did
not include reads "-". Columns:

- `match x ref`: sarp-py's mean match time per request / sarp's (issue 14: >= 5);
- `kernel eff`: sarp's match time / a bare multi-get of the same keys (<= 1.5), then
  sarp-py's;
- `x dram`: sarp's throughput / dram-blockhash's (>= 1.0 at preload 0 with
  `--page-cache`: as fast as memory; the `io` column says how the run read);
- `x ssd-bh`, `x radix`, `x seg-hash`: sarp's throughput / SSD-BlockHash's (>= 5),
  segment-radix's (>= 2.5), segment-hash's (>= 1.5) (issue 12's, kept by issue 14);
- `lowest latency`: the SSD design with the lowest mean match time (sarp's goal);
- `loss %`: sarp's reused tokens below dram-blockhash's (the exact index): 0.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SSD_DESIGNS = ("sarp", "ssd-blockhash", "segment-hash", "segment-radix")
HEADER = ("| workload | preload | io | match x ref | kernel eff (sarp / sarp-py) | x dram "
          "| x ssd-bh | x radix | x seg-hash | lowest latency | loss % |")


def _ratio(a: float | None, b: float | None, digits: int = 2) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.{digits}f}"


def row(doc: dict[str, Any], name: str) -> str:
    """One table row for one run (`name`: what the first column calls it)."""
    ok = {r["index"]: r for r in doc["results"] if "error" not in r}
    if "sarp" not in ok:
        raise ValueError(f"{name}: the run has no sarp result (indexes: {sorted(ok)})")
    sarp = ok["sarp"]

    def get(index: str, field: str) -> float | None:
        return float(ok[index][field]) if index in ok else None

    thr = sarp["throughput_rps"]
    eff = f"{sarp['kernel_efficiency']:.2f}"
    if "sarp-py" in ok:
        eff += f" / {ok['sarp-py']['kernel_efficiency']:.2f}"
    ssd = [n for n in SSD_DESIGNS if n in ok]
    lowest = min(ssd, key=lambda n: ok[n]["match_us_mean"]) if len(ssd) > 1 else "-"
    exact = get("dram-blockhash", "tokens_reused")
    loss = ("-" if not exact else
            f"{100 * (exact - sarp['tokens_reused']) / exact:.4f}")
    preload = int(doc.get("preload_blocks", 0))
    cells = [name, f"{preload:,}" if preload else "0",
             "direct" if doc.get("direct_io", False) else "page cache",
             _ratio(get("sarp-py", "match_us_mean"), sarp["match_us_mean"]), eff,
             _ratio(thr, get("dram-blockhash", "throughput_rps")),
             _ratio(thr, get("ssd-blockhash", "throughput_rps")),
             _ratio(thr, get("segment-radix", "throughput_rps")),
             _ratio(thr, get("segment-hash", "throughput_rps")), lowest, loss]
    return "| " + " | ".join(cells) + " |"


def table(paths: Sequence[Path]) -> str:
    lines = [HEADER, "|" + "---|" * (HEADER.count("|") - 1)]
    for p in paths:
        doc = json.loads(p.read_text())
        lines.append(row(doc, workload_name(str(doc.get("workload", p.stem)))))
    return "\n".join(lines)


def workload_name(workload: str) -> str:
    """`trace:DIR/NAME.jsonl@16` -> NAME; a generated workload's name as it is."""
    if not workload.startswith("trace:"):
        return workload
    return Path(workload.removeprefix("trace:").rsplit("@", 1)[0]).stem


def main(argv: Sequence[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    try:
        print(table([Path(a) for a in argv]))
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
