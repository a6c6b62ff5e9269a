"""sarpctl's door to the lab (sarpd/ctl/lab.py): `bench` and `cluster local` load only
when they run; `--help`, `status` and `import sarpd.daemon.cli` import no module of
tools/; outside a source checkout the lab commands say where they run (exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from sarpd.ctl.main import main
from tests.daemon_helpers import REPO, SarpdProc


def imported(args: list[str], cwd: Path = REPO) -> tuple[subprocess.CompletedProcess[str],
                                                         set[str]]:
    """Run `python -X importtime ARGS` (in the checkout: tools/ is importable there);
    (the process, the names of the modules it imported)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SARP_CLUSTER", "SARPD_SOCKET")}
    out = subprocess.run([sys.executable, "-X", "importtime", *args], capture_output=True,
                         text=True, timeout=120, cwd=cwd, env=env)
    names = {line.rsplit("|", 1)[1].strip() for line in out.stderr.splitlines()
             if line.startswith("import time:") and "|" in line}
    assert "sarpd" in names or "click" in names, out.stderr[-2000:]  # the parse works
    return out, names


def lab(names: set[str]) -> set[str]:
    return {n for n in names if n == "tools" or n.startswith("tools.")}


def test_help_and_status_import_no_module_of_the_lab(shared_sarpd: SarpdProc) -> None:
    out, names = imported(["-m", "sarpd.ctl.main", "--help"])
    assert out.returncode == 0 and "bench" in out.stdout and "cluster" in out.stdout
    assert lab(names) == set()
    out, names = imported(["-m", "sarpd.ctl.main", "cluster", "--help"])
    assert out.returncode == 0 and "local" in out.stdout and "status" in out.stdout
    assert lab(names) == set()
    out, names = imported(["-m", "sarpd.ctl.main", "--socket", str(shared_sarpd.socket),
                           "status"])
    assert out.returncode == 0 and "ready" in out.stdout, out.stderr[-2000:]
    assert "sarpd.ctl.common" in names and lab(names) == set()
    _, names = imported(["-c", "import sarpd.daemon.cli"])
    assert "sarpd.daemon.cli" in names and lab(names) == set()


def test_lab_commands_load_when_they_run() -> None:
    out, names = imported(["-m", "sarpd.ctl.main", "bench", "--help"])
    # the door opens (importlib's own import is not timed, the bench's imports are):
    # the test above can fail
    assert out.returncode == 0 and "tools.bench.runner" in names
    res = CliRunner().invoke(main, ["cluster", "local", "--help"])
    assert res.exit_code == 0 and "--replicas" in res.output, res.output
    res = CliRunner().invoke(main, ["bench", "--help"])
    assert res.exit_code == 0 and "--workload" in res.output, res.output


OUTSIDE = ("import sys, sarpd.ctl.lab as lab; lab.checkout_root = lambda: None; "
           "from sarpd.ctl.main import main; main(prog_name='sarpctl')")


def test_outside_a_checkout_lab_commands_say_where_they_run(tmp_path: Path) -> None:
    """An install without the checkout (here: run from elsewhere, the checkout not
    found): a one-line error naming how to run it from a checkout, exit 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for args, says in [(["bench", "-w", "codeact"], "python -m tools.bench"),
                       (["bench", "--help"], "python -m tools.bench"),
                       (["cluster", "local", "--dir", "x"], "python -m tools.cluster.local")]:
        out = subprocess.run([sys.executable, "-c", OUTSIDE, *args], capture_output=True,
                             text=True, timeout=60, cwd=tmp_path, env=env)
        assert out.returncode == 2, out
        name = " ".join(args[:2]) if args[0] == "cluster" else "bench"
        assert out.stderr == (f"sarpctl: {name} is a lab command: it runs from a source "
                              f"checkout of sarp (there: sarpctl {name}, or {says})\n")
    out = subprocess.run([sys.executable, "-c", OUTSIDE, "--help"], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path, env=env)
    assert out.returncode == 0 and "bench" in out.stdout
