"""The cold-start process of `Baseline.recover()` (see `_common.cold_start`).

    python -m tools.bench.baselines.recover NAME --data-dir D --backend B \\
        --cache-bytes N --probe ids.npy --ns NS --options '{"sync": true}' [--direct-io]

Opens the baseline on D (its full load), answers one match of the probe and prints
one JSON line: the probe's metas and the time of each step. The parent times the
whole process from spawn to that line.
"""

from __future__ import annotations

import time

_T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.bench.baselines.recover")
    p.add_argument("name")
    p.add_argument("--data-dir", required=True, type=Path)
    p.add_argument("--backend", required=True)
    p.add_argument("--cache-bytes", required=True, type=int)
    p.add_argument("--probe", required=True, type=Path)
    p.add_argument("--ns", default="")
    p.add_argument("--options", default="{}")
    p.add_argument("--direct-io", action="store_true")
    args = p.parse_args(argv)

    from tools.bench.baselines import baseline_class

    cls = baseline_class(args.name)
    ids = np.load(args.probe)
    t1 = time.perf_counter()
    index = cls(**json.loads(args.options))
    index.open(args.data_dir, args.backend, args.cache_bytes, args.direct_io)
    t2 = time.perf_counter()
    metas = index.match_many([ids], [args.ns])[0]
    t3 = time.perf_counter()
    report = {"metas": [int(m) for m in metas], "import_s": t1 - _T0, "open_s": t2 - t1,
              "match_s": t3 - t2, "detail": getattr(index, "load_detail", "")}
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    index.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
