"""sarpctl against a real sarpd (click's CliRunner in-process, plus the installed
console script once)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sarpd.ctl.main import main
from tests.daemon_helpers import REPO, SarpdProc

TOKENS = list(range(1, 16 * 5 + 3))  # 5 whole blocks and a partial one


def run(daemon: SarpdProc, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(main, ["--socket", str(daemon.socket), *args], input=stdin)


def test_status(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "status")
    assert res.exit_code == 0, res.output
    assert "ready" in res.output and "backend rocksdb" in res.output
    assert "recovered in" in res.output


def test_insert_from_stdin_then_match(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "insert", "--ns", "ctl", "--meta", "42", stdin=json.dumps(TOKENS))
    assert res.exit_code == 0, res.output
    assert "inserted 5 blocks: 5 new" in res.output
    res = run(shared_sarpd, "match", "--ns", "ctl", "--json", stdin=" ".join(map(str, TOKENS)))
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["blocks"] == 5 and out["tokens"] == 80 and out["meta"] == [42] * 5
    res = run(shared_sarpd, "match", "--ns", "ctl", stdin=json.dumps(TOKENS))
    assert "matched 5 blocks (80 tokens)" in res.output


def test_match_and_remove_from_a_file(shared_sarpd: SarpdProc, tmp_path: Path) -> None:
    path = tmp_path / "tokens.txt"
    path.write_text("\n".join(map(str, TOKENS)) + "\n")
    assert run(shared_sarpd, "insert", "--ns", "ctl-file", str(path)).exit_code == 0
    res = run(shared_sarpd, "remove", "--ns", "ctl-file", "--from", "3", "--json", str(path))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == {"removed": 2}
    res = run(shared_sarpd, "match", "--ns", "ctl-file", "--json", str(path))
    assert json.loads(res.output)["blocks"] == 3


def test_holders_from_the_command_line(shared_sarpd: SarpdProc) -> None:
    toks = json.dumps(TOKENS)
    for meta in ("7", "3"):
        res = run(shared_sarpd, "insert", "--ns", "ctl-h", "--meta", meta, "--holder", stdin=toks)
        assert res.exit_code == 0, res.output
    res = run(shared_sarpd, "match", "--ns", "ctl-h", "--holders", "4", stdin=toks)
    assert res.exit_code == 0, res.output
    assert "holder 0x0000000000000003: 5 blocks" in res.output
    assert "holder 0x0000000000000007: 5 blocks" in res.output
    res = run(shared_sarpd, "remove", "--ns", "ctl-h", "--meta", "3", stdin=toks)
    assert "removed 0 blocks (left with no holder)" in res.output
    res = run(shared_sarpd, "match", "--ns", "ctl-h", "--holders", "4", "--json", stdin=toks)
    assert json.loads(res.output)["holders"] == [[7, 5]]


def test_stats_json_parses(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "stats", "--json")
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    for name in ("blocks", "segments", "directory_bytes", "requests", "recovered_in_s"):
        assert name in stats
    plain = run(shared_sarpd, "stats")
    assert plain.exit_code == 0 and "directory_bytes" in plain.output


def test_snapshot_and_check(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "snapshot")
    assert res.exit_code == 0 and "snapshot up to segment" in res.output
    res = run(shared_sarpd, "check")
    assert res.exit_code == 0, res.output
    assert "clean" in res.output
    res = run(shared_sarpd, "check", "--json")
    assert res.exit_code == 0 and json.loads(res.output)["clean"] is True
    res = run(shared_sarpd, "check", "--fix")
    assert res.exit_code == 0 and "0 fixed" in res.output


def test_bad_token_input_is_a_usage_error(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "match", stdin="1 2 three")
    assert res.exit_code == 2
    assert "whitespace-separated ints" in res.output


def test_server_errors_exit_2_with_the_code(shared_sarpd: SarpdProc) -> None:
    res = run(shared_sarpd, "insert", "--ns", "x" * 5000, stdin=json.dumps(TOKENS))
    assert res.exit_code == 2
    assert "bad_request" in res.output and "ns" in res.output


def test_unreachable_socket(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["--socket", str(tmp_path / "nope.sock"), "status"])
    assert res.exit_code == 2
    assert "nope.sock" in res.output and "does not exist" in res.output


def test_socket_from_environment(shared_sarpd: SarpdProc) -> None:
    res = CliRunner().invoke(main, ["status"], env={"SARPD_SOCKET": str(shared_sarpd.socket)})
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ([], "sarpctl check"),
        (["status"], "ready"),
        (["match"], "JSON list"),
        (["insert"], "--meta"),
        (["remove"], "--from"),
        (["stats"], "--json"),
        (["check"], "--fix"),
        (["snapshot"], "snapshot"),
    ],
)
def test_help_texts(args: list[str], text: str) -> None:
    res = CliRunner().invoke(main, [*args, "--help"])
    assert res.exit_code == 0
    assert text in res.output
    assert "SARPD_SOCKET" in res.output or args


def test_console_scripts_installed() -> None:
    """`make setup` installs both entry points next to the interpreter."""
    bindir = Path(sys.executable).parent
    for name in ("sarpctl", "sarpd"):
        exe = bindir / name
        if not exe.exists():
            exe = Path(shutil.which(name) or "")
        if not exe.is_file():
            pytest.skip(f"{name} is not installed (run make setup)")
        out = subprocess.run(
            [str(exe), "--help"], capture_output=True, text=True, timeout=60, cwd=REPO,
            env={**os.environ},
        )
        assert out.returncode == 0, out.stderr
        assert "Usage:" in out.stdout


def test_match_remove_and_dump_by_hashes(shared_sarpd: SarpdProc, tmp_path: Path) -> None:
    """Blocks inserted by hash (as the vLLM bridge does) are found from the command line:
    an inline list, a file, standard input, or hex of a bytes hash."""
    from sarpd.client import SyncClient

    digest = bytes(range(32))  # an engine's sha256 bytes hash: the bridge keeps the last 8
    hashes = [1311, 4242, int.from_bytes(digest[-8:], "big"), 2**64 - 1]
    with SyncClient(shared_sarpd.socket) as c:
        c.insert(hashes=hashes, meta=9, ns="ctl-hash")
    path = tmp_path / "hashes.txt"
    path.write_text("1311\n4242\n")
    for src, stdin, blocks in [(f"[1311, 4242, {hashes[2]}]", None, 3), ("1311,4242", None, 2),
                               (str(path), None, 2), ("-", json.dumps(hashes), 4),
                               (f'["{(1311).to_bytes(8, "big").hex()}", 4242, '
                                f'"{digest.hex()}"]', None, 3)]:
        res = run(shared_sarpd, "match", "--ns", "ctl-hash", "--hashes", src, "--json",
                  stdin=stdin)
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["blocks"] == blocks, (src, res.output)
    res = run(shared_sarpd, "dump", "--ns", "ctl-hash", "--hashes", "1311,4242")
    assert res.exit_code == 0 and "ns 'ctl-hash': 2 blocks, 2 match" in res.output, res.output
    res = run(shared_sarpd, "remove", "--ns", "ctl-hash", "--from", "2", "--hashes",
              json.dumps(hashes))
    assert res.exit_code == 0 and "removed 2 blocks" in res.output, res.output
    res = run(shared_sarpd, "match", "--ns", "ctl-hash", "--hashes", str(path), str(path))
    assert res.exit_code == 2 and "not both" in res.output
    res = run(shared_sarpd, "match", "--hashes", "[1, 18446744073709551616]")
    assert res.exit_code == 2 and "hashes[1]: 18446744073709551616 is not a uint64" in res.output


def test_stats_is_plain_aligned_text(shared_sarpd: SarpdProc) -> None:
    from sarpd.client import SyncClient

    with SyncClient(shared_sarpd.socket) as c:
        c.report("ctltest", {"events": 12, "lag_s": 0.5})
    res = run(shared_sarpd, "stats")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert "{" not in res.output and "backend_backend" not in res.output
    rows = dict(line.split(None, 1) for line in lines)
    assert rows["reports.ctltest.events"] == "12" and rows["reports.ctltest.lag_s"] == "0.5"
    assert rows["backend"] == "rocksdb" and rows["requests"].isdigit()
    assert rows["directory_bytes"].endswith(("B", "KiB", "MiB"))
    assert len({len(line) - len(line.split(None, 1)[1]) for line in lines}) == 1  # aligned
    js = json.loads(run(shared_sarpd, "stats", "--json").output)
    assert js["reports"]["ctltest"]["events"] == 12 and "backend_backend" not in js


MUTE_SERVER = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1]); s.listen(8)
print("listening", flush=True)
held = []
while True:
    held.append(s.accept()[0])  # accepts, reads nothing, answers nothing
"""


def test_status_against_a_server_that_never_answers_times_out(tmp_path: Path) -> None:
    """The issue's target: `sarpctl status` exits non-zero with a timeout error (default
    request timeout 10 s) instead of hanging; --timeout / SARPCTL_TIMEOUT change it."""
    import tempfile

    sock_dir = Path(tempfile.mkdtemp(prefix="sarpm", dir="/tmp"))
    sock = sock_dir / "mute.sock"
    server = subprocess.Popen([sys.executable, "-c", MUTE_SERVER, str(sock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline() == "listening\n"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("SARPCTL_TIMEOUT", None)
        out = subprocess.run([sys.executable, "-m", "sarpd.ctl.main", "--socket", str(sock),
                              "status"], capture_output=True, text=True, timeout=15,
                             cwd=REPO, env=env)
        assert out.returncode == 2, out
        assert f"sarpd at {sock} did not answer hello within 10 s" in out.stderr
        assert "--timeout" in out.stderr and "Traceback" not in out.stderr
        for args, extra, op in [(["--timeout", "0.5", "check"], {}, "check within 0.5 s"),
                                (["snapshot"], {"SARPCTL_TIMEOUT": "0.5"}, "snapshot within"),
                                (["stats"], {"SARPCTL_TIMEOUT": "0.5"}, "stats within 0.5 s")]:
            res = CliRunner().invoke(main, ["--socket", str(sock), *args], env=extra)
            assert res.exit_code == 2 and op in res.output, res.output
        res = CliRunner().invoke(main, ["--socket", str(sock), "--timeout", "-1", "status"])
        assert res.exit_code == 2 and "--timeout" in res.output
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(sock_dir, ignore_errors=True)
