"""The README's examples, pasted in order on one fresh `make run`, print what it shows
(tests/readme_runner.py says how the blocks are read and run)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.daemon_helpers import REPO
from tests.readme_runner import blocks, commands, matches, run_readme

README = REPO / "README.md"


@contextlib.contextmanager
def make_run(cwd: Path) -> Iterator[subprocess.Popen[bytes]]:
    """sarpd started as `make run` starts it (its recipe's command), in `cwd`."""
    (cwd / "var").mkdir()
    sarpd = Path(sys.executable).parent / "sarpd"
    log = open(cwd / "sarpd.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(sarpd), "--data-dir", "var", "--socket", "var/sarpd.sock", "--backend", "rocksdb"],
        cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 60
        while True:
            log_text = (cwd / "sarpd.log").read_text()
            assert proc.poll() is None, log_text
            if "ready: serving" in log_text:  # no request of ours: the counters stay the README's
                break
            assert time.monotonic() < deadline, "sarpd not ready in 60 s"
            time.sleep(0.05)
        yield proc
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        finally:
            proc.kill()
            log.close()


def test_readme_examples_run_in_order_on_one_fresh_daemon(tmp_path: Path) -> None:
    with make_run(tmp_path):
        ran, failures = run_readme(README, tmp_path)
    assert ran >= 4, f"only {ran} runnable blocks found in the README"
    assert not failures, "\n\n".join(str(f) for f in failures)


# ------------------------------------------------------------------ the runner itself


def test_blocks_takes_pycon_and_console_in_order_and_skips_marked_ones() -> None:
    text = "\n".join([
        "```pycon", ">>> 1 + 1", "2", "```",
        "<!-- not run: needs a stopped daemon -->",
        "```console", "$ false", "```",
        "```sh", "echo not run", "```",
        "```console", "$ echo hi", "hi", "```",
    ])
    found = blocks(text)
    assert [(b.kind, b.line) for b in found] == [("pycon", 1), ("console", 12)]
    assert commands(found[1]) == [("echo hi", ["hi"])]


def test_varying_numbers_match_any_number_and_nothing_else() -> None:
    assert matches(["uptime ~12.5 s, requests 3"], ["uptime 0.31 s, requests 3"])
    assert not matches(["uptime ~12.5 s, requests 3"], ["uptime 0.31 s, requests 4"])
    assert not matches(["uptime ~12.5 s"], ["uptime soon s"])
    assert not matches(["a"], ["a", "b"])


def test_a_wrong_output_is_reported(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("```console\n$ echo 41\n42\n```\n```pycon\n>>> 6 * 7\n43\n```\n")
    ran, failures = run_readme(readme, tmp_path)
    assert ran == 2
    assert [(f.command, f.expected, f.got) for f in failures] == [
        ("echo 41", "42", "41\n(exit 0)"), ("6 * 7", "43", "42")]
