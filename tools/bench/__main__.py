"""`python -m tools.bench ...`: `sarpctl bench` without sarpctl (a source checkout's lab)."""

from tools.bench.cli import bench

bench(prog_name="python -m tools.bench")
