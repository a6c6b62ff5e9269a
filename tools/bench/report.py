"""Human-readable output of a bench run: a terminal table with ratios against sarp,
a Markdown table, and PNG plots (matplotlib, imported only when a report is asked for).
Indexes that failed are listed under the table with their error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from backends.registry import cache_floor
from sarpd.ctl.common import human_bytes
from tools.bench.runner import BenchResult, IndexResult
from tools.bench.sarp_recover import split_budget

COLUMNS = ("index", "req/s", "x sarp", "match us", "p99 us", "reused tok", "loss %",
           "recover s", "spawn s", "rec x sarp", "memory", "routing", "reads/match", "disk")


def _exact(res: BenchResult) -> int | None:
    """Tokens reused by the exact in-memory index, when it ran."""
    r = res.by_name().get("dram-blockhash")
    return r.tokens_reused if r is not None else None


def rows(res: BenchResult) -> list[list[str]]:
    sarp = res.by_name().get("sarp")
    exact = _exact(res)
    out = []
    for r in res.completed():
        ratio = sarp.throughput_rps / r.throughput_rps if sarp and r.throughput_rps else 0.0
        rec = r.recovery_s / sarp.recovery_s if sarp and sarp.recovery_s else 0.0
        loss = (exact - r.tokens_reused) / exact * 100 if exact else 0.0
        out.append([r.index, f"{r.throughput_rps:,.0f}",
                    "1" if r.index == "sarp" else f"{ratio:.2f}",
                    f"{r.match_us_mean:,.1f}", f"{r.match_us_p99:,.1f}",
                    f"{r.tokens_reused:,}", f"{loss:.4f}",
                    f"{r.recovery_s:.4f}", f"{r.recovery_spawn_s:.4f}",
                    "1" if r.index == "sarp" else f"{rec:.2f}",
                    human_bytes(r.memory_bytes), human_bytes(r.routing_bytes),
                    f"{r.reads_per_match:,.2f}", human_bytes(r.disk_bytes)])
    return out


def failures(res: BenchResult) -> list[str]:
    return [f"FAILED {f.index}: {f.error}" for f in res.failed()]


def floor_note(backend: str, budget: int) -> str:
    """Why `budget` does not bind `backend`, when its cache floor (backends.registry)
    is above the engine's share of it (sarp's share is the smallest: split_budget);
    "" when it binds."""
    floor = cache_floor(backend)
    if floor <= split_budget(budget)[0]:
        return ""
    than = "this budget" if floor > budget else "sarp's engine share of this budget"
    return (f"{backend} keeps a cache of at least {human_bytes(floor)} (a write batch "
            f"must fit), more than {than}")


def conditions(res: BenchResult) -> str:
    io = "direct I/O" if res.direct_io else "page cache on"
    notes = [n for n in dict.fromkeys(floor_note(r.backend, res.cache_bytes)
                                      for r in res.completed()) if n]
    return (f"memory budget {human_bytes(res.cache_bytes)} (engine cache + write buffers + "
            f"own caches), {io}, preload {res.preload_blocks:,} blocks, schema {res.schema}"
            + "".join(f"; {n}" for n in notes))


def text_table(res: BenchResult) -> str:
    body = rows(res)
    widths = [max(len(c), *(len(row[i]) for row in body), 0) for i, c in enumerate(COLUMNS)]

    def line(cells: tuple[str, ...] | list[str]) -> str:
        return "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))

    sarp = res.by_name().get("sarp")
    verifier = f", sarp verifier: {sarp.verifier}" if sarp and sarp.verifier else ""
    head = (f"workload {res.workload}: {res.requests:,} requests, {res.blocks:,} unique blocks, "
            f"{conditions(res)}{verifier}\n{res.description}")
    return "\n".join([head, line(COLUMNS), *(line(r) for r in body), *natives(res),
                      *failures(res)]) + (
        "\n'x sarp': sarp's throughput / this index's; 'recover s': in-process (open, load, "
        "first match); 'spawn s': from a process spawn; 'rec x sarp': this index's recover s "
        "/ sarp's; memory: inside the budget; routing: in memory outside it; loss: tokens "
        "reused below the exact dram-blockhash")


def natives(res: BenchResult) -> list[str]:
    """Per sarp index: which paths ran natively and its kernel efficiency (match time /
    a bare multi-get of its reads), when the run measured them."""
    out = []
    for r in res.completed():
        if r.native is None:
            continue
        on = [p for p, yes in r.native.items() if yes]
        eff = f", kernel efficiency {r.kernel_efficiency:.2f}" if r.kernel_efficiency else ""
        out.append(f"{r.index}: native {', '.join(on) if on else 'none'} "
                   f"(verifier {r.verifier or '?'}){eff}")
    return out


def markdown_table(res: BenchResult) -> str:
    out = [f"### {res.workload}", "", f"{res.description}; {conditions(res)}", "",
           "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    out += ["| " + " | ".join(r) + " |" for r in rows(res)]
    if res.failed():
        out += ["", *failures(res)]
    return "\n".join(out) + "\n"


def write_report(res: BenchResult, directory: Path) -> list[Path]:
    """`<workload>.md` and PNG plots: throughput, recovery, match latency CDF, reuse loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    slug = res.workload.replace("/", "_").replace(":", "_").replace("@", "_")
    md = directory / f"{slug}.md"
    md.write_text(markdown_table(res))
    paths = [md]
    done = res.completed()
    names = [r.index for r in done]
    short = res.workload.split("/")[-1]

    def bar(values: list[float], ylabel: str, fname: str, log: bool = False) -> None:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        ax.bar(names, values, color=["#d62728" if n == "sarp" else "#1f77b4" for n in names])
        ax.set_ylabel(ylabel)
        ax.set_title(f"{short}: {ylabel}", fontsize=10)
        if log:
            ax.set_yscale("log")
        ax.tick_params(axis="x", rotation=20)
        fig.tight_layout()
        p = directory / f"{slug}-{fname}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)

    bar([r.throughput_rps for r in done], "requests/s (higher is better)", "throughput")
    bar([r.recovery_s for r in done], "recovery s, in-process (lower is better)", "recovery",
        log=True)
    exact = _exact(res)
    if exact:
        bar([max(0.0, (exact - r.tokens_reused) / exact * 100) for r in done],
            "reuse loss % vs exact", "loss")
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for r in done:
        _cdf(ax, r)
    ax.set_xscale("log")
    ax.set_xlabel("match latency per request (us)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(f"{short}: match latency CDF", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = directory / f"{slug}-latency-cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def _cdf(ax: object, r: IndexResult) -> None:
    if not r.match_us:
        return
    xs = np.sort(np.array(r.match_us))
    ys = np.arange(1, len(xs) + 1) / len(xs)
    ax.plot(xs, ys, label=r.index, lw=2.2 if r.index == "sarp" else 1.2)  # type: ignore[attr-defined]
