"""What an install of sarp holds and does (issue 23): the wheel ships the product only
(`sarpd`, `backends`, `bloomstore`: never the lab in tools/ or the tests), and
without an extra, what needs it says which extra, in one line (no traceback)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.daemon_helpers import REPO

PRODUCT = {"sarpd", "backends", "bloomstore"}
SOURCES = ("pyproject.toml", "setup.py", "README.md", "sarpd", "backends", "bloomstore",
           "tools")


def test_the_wheel_holds_the_product_only(tmp_path: Path) -> None:
    """The wheel built from a clean copy of the tree (the lab and a tests package in it
    too)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns(
                "__pycache__", "*.so", "*.egg-info", ".*"))
        else:
            shutil.copy2(path, src / name)
    (src / "tests").mkdir()
    (src / "tests" / "__init__.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check",
         "-q", "-w", str(tmp_path / "dist"), str(src)],
        capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("sarp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == PRODUCT, sorted(tops)
    assert "sarpd/ctl/main.py" in names and "sarpd/ctl/lab.py" in names
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    scripts = zipfile.ZipFile(wheel).read(entry).decode()
    assert "sarpctl = sarpd.ctl.main:main" in scripts and "tools" not in scripts


def without(modules: list[str], code: str) -> str:
    """`code` run as if the optional `modules` were not installed (an import of one
    raises ModuleNotFoundError, as in a `pip install .` without extras)."""
    hide = "".join(f"sys.modules[{m!r}] = None; " for m in modules)
    return f"import sys; {hide}{code}"


def run(code: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SARP_CLUSTER", "SARPD_SOCKET")}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd, env=env)


def one_line_error(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr


SARPCTL = "from sarpd.ctl.main import main; main(prog_name='sarpctl')"


def test_sarpctl_without_nats_names_the_cluster_extra() -> None:
    code = without(["nats"], SARPCTL)
    assert run(code, "--help").returncode == 0
    for args in (["--cluster", "nats://127.0.0.1:1", "status"],
                 ["--cluster", "nats://127.0.0.1:1", "cluster", "status"],
                 ["--cluster", "nats://127.0.0.1:1", "match", "--hashes", "[1]"]):
        out = run(code, *args)
        assert out.returncode == 2, out
        assert "--cluster needs the cluster extra (nats is not installed): pip install " \
            "'sarp[cluster]'" in one_line_error(out)
    out = run(code, "cluster", "local", "--dir", "unused")  # the lab's launcher
    assert out.returncode == 2
    assert "cluster local needs the cluster extra" in one_line_error(out)


def test_sarpd_without_an_extra_says_which(tmp_path: Path) -> None:
    sarpd = "from sarpd.daemon.cli import main; main(prog_name='sarpd')"
    base = ["--data-dir", str(tmp_path / "d"), "--socket", str(tmp_path / "s.sock")]
    out = run(without(["nats"], sarpd), *base, "--cluster", "nats://127.0.0.1:1",
              "--shard", "s0", "--replica-id", "r0")
    assert out.returncode == 1
    assert "cluster mode needs the cluster extra (nats is not installed)" in \
        one_line_error(out)
    assert not (tmp_path / "d").exists()  # said before anything was created
    out = run(without(["wiredtiger"], sarpd), *base, "--backend", "wiredtiger")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "backend wiredtiger needs the wiredtiger extra (wiredtiger is not installed): " \
        "pip install 'sarp[wiredtiger]'" in out.stderr
