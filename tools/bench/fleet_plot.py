"""`python -m tools.bench.fleet_plot FLEET.json OUT.png`: the fleet bench's offered-load
sweep as a plot: achieved block-ops/s against offered block-ops/s, one line per index
(log-log; the diagonal is "keeps up"), and query p99 against offered load beside it.
matplotlib is imported only here (the `report` extra of the bench)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import click


def sweep(doc: dict[str, Any]) -> dict[str, list[tuple[float, float, float]]]:
    """index -> [(offered, achieved, p99 us)] by offered load, from `results`."""
    out: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for r in doc["results"]:
        if "block_ops_per_s" not in r:
            continue  # an index that did not run (its reason is in the JSON)
        out[r["index"]].append((float(r["offered_block_ops_per_s"]),
                                float(r["block_ops_per_s"]), float(r["query_us_p99"])))
    return {k: sorted(v) for k, v in out.items()}


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = sweep(doc)
    fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    offered = [o for pts in lines.values() for o, _, _ in pts] or [1.0]
    lo, hi = min(offered) / 2, max(offered) * 1.5
    ax.plot([lo, hi], [lo, hi], color="0.8", linestyle="--", label="offered (keeps up)")
    for name, pts in lines.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        lat.plot([p[0] for p in pts], [p[2] / 1000 for p in pts], marker="o", label=name)
    for a in (ax, lat):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("offered block-ops/s")
        a.grid(True, which="both", alpha=0.3)
    ax.set_ylabel("achieved block-ops/s")
    lat.set_ylabel("query p99 (ms)")
    ax.legend(fontsize=8)
    fig.suptitle(f"fleet: {doc.get('workers')} engines, {doc.get('requests'):,} requests, "
                 f"transport {doc.get('transport')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command()
@click.argument("fleet_json", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("out_png", type=click.Path(dir_okay=False, path_type=Path))
def main(fleet_json: Path, out_png: Path) -> None:
    """Plot a `python -m tools.bench.fleet --json` result (module docstring)."""
    plot(json.loads(fleet_json.read_text()), out_png)
    click.echo(f"wrote {out_png}")


if __name__ == "__main__":
    main()
