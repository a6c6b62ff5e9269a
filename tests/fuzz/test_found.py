"""The bugs the fuzz harnesses and the sanitized run found in the C extensions, each as
its smallest failing case. The C is not changed here: each test is
xfail(strict=True) until the C is fixed, when it passes and strict makes the suite
say so (then drop the mark, and the harness's tolerance of it named in the test).

The use-after-free cases run in a child process (the parent would crash with it);
the unaligned-array cases run only under `make sanitize` (elsewhere the loads work
and nothing tells), in a child that inherits its sanitizers."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import sarpd
from sarpd.core import kernel
from sarpd.core.segment import Segment
from tests.fuzz._common import extension

W, K, H = extension("write"), extension("match"), extension("hash")
SANITIZED = os.environ.get("SARP_SANITIZED_ROOT")
needs_write = pytest.mark.skipif(W is None, reason="the C codecs are not built")
needs_match = pytest.mark.skipif(K is None, reason="the match kernel is not built")


def _child(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh python, importing sarpd from the tree this test runs from."""
    root = Path(sarpd.__file__).resolve().parents[1]  # the parent's own sarpd
    env = dict(os.environ)
    for var in ("ASAN_OPTIONS", "UBSAN_OPTIONS"):  # a report expected here: to its stderr,
        if var in env:  # not to `make sanitize`'s report files
            env[var] = ":".join(o for o in env[var].split(":") if not o.startswith("log_path="))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120, check=False)


@needs_match
def test_verify_skips_a_candidate_of_a_window_past_int64() -> None:
    """A segment whose (u64) window is >= 2**63 is another window's candidate, as the
    reference (index._verify_round) has it, not an OverflowError for the batch."""
    assert K is not None
    qids = np.arange(16, dtype=np.uint64).reshape(8, 2)
    rows = np.zeros((1, kernel.ROW_FIELDS), np.int64)
    rows[0, kernel.LEN], rows[0, kernel.FCOUNT] = 8, 1
    seg = Segment(5, 2**63, 0xFF, 0, qids.copy(), np.zeros(8, np.uint64))
    got = K.verify(qids, np.zeros(1, np.int64), rows, np.array([5], np.uint64), {5: seg}, 8)
    assert got == (bytes(8), bytes(8))  # no candidate of window 0: no run


EVIL = """
    import numpy as np
    from sarpd.core import kernel, native
    import importlib
    K = importlib.import_module(native.EXTENSIONS["match"])
    segs, dead = {}, []

    class Evil:  # its first attribute read drops the dict's reference, the only other one
        def __getattr__(self, name):
            if dead:
                print("read after free:", name, flush=True)
            if name == FIRST:
                segs.clear()
            return {"window": 0, "presence": 0xFF, "xmeta": np.empty(0, np.uint64),
                    "xmask": np.empty(0, np.uint64), "meta": np.zeros(8, np.uint64),
                    "ids": np.zeros((8, 2), np.uint64)}[name]

        def __del__(self):
            dead.append(1)

    segs[5] = Evil()
    rows = np.zeros((1, kernel.ROW_FIELDS), np.int64)
    rows[0, kernel.LEN], rows[0, kernel.FCOUNT] = 8, 1
    one = np.array([5], np.uint64)
"""


@needs_match
@pytest.mark.parametrize(("first", "call"), [
    ("window", "K.verify(np.zeros((8, 2), np.uint64), np.zeros(1, np.int64), rows, one, segs, 8)"),
    ("xmeta", "K.assemble(rows, np.array([[0, 1]], np.int64), np.array([8], np.int64), one, segs,"
              " np.zeros(1, np.int64))"),
])
def test_a_segment_dropped_from_segs_while_read_is_not_used_after_free(
        first: str, call: str) -> None:
    """verify and assemble hold a reference to each segment they read (its SegView) while
    its attributes run Python code: one whose attribute read drops it from segs lives
    on until the call is done."""
    done = _child(f"{textwrap.dedent(EVIL)}\nFIRST = {first!r}\nprint({call})\n")
    assert done.returncode == 0, f"exit {done.returncode}: {done.stdout}{done.stderr[-2000:]}"
    assert "after free" not in done.stdout, done.stdout


UNALIGNED = """
    import importlib
    import numpy as np
    from sarpd.core import native

    def unaligned(a):  # the same values, one byte past an 8-byte boundary
        buf = bytearray(a.nbytes + 1)
        buf[1:] = a.tobytes()
        return np.frombuffer(buf, a.dtype, offset=1).reshape(a.shape)

    K = importlib.import_module(native.EXTENSIONS["match"])
    H = importlib.import_module(native.EXTENSIONS["hash"])
    keys = np.array([1, 2, 3], np.uint64)
    u = np.zeros(3, np.uint64)
    order = np.arange(3, dtype=np.int64)
    qids = np.ones((3, 2), np.uint64)
"""


@pytest.mark.skipif(not SANITIZED, reason="shows only under `make sanitize` (UBSan)")
@pytest.mark.parametrize("call", [
    "K.merge_order(keys, unaligned(order), keys)",
    "K.route(qids, np.array([3], np.int64), unaligned(keys), u, u, keys, u, u, order, 8, 1, 2)",
    "K.route(qids, unaligned(np.array([3], np.int64)), keys, u, u, keys, u, u, order, 8, 1, 2)",
    "H.chain_ids_flat(bytes(16), np.zeros(32, np.uint32), unaligned(np.array([0, 32])), 16)",
])
@pytest.mark.xfail(strict=True, reason=(
    "_cmatch.c (route, verify, assemble, merge_order: every array but qids and segment "
    "ids) and _chash.c (chain_ids_flat's offsets) read the int64/uint64 buffers they take "
    "through typed pointers, which numpy may hand them unaligned (np.frombuffer at an "
    "offset): undefined behaviour (UBSan: misaligned load); read them with memcpy, as "
    "load_u64 and _cwrite.c do, or refuse them (harness: u64_form(unaligned=False))"))
def test_the_kernels_read_unaligned_arrays_without_undefined_behaviour(call: str) -> None:
    done = _child(f"{textwrap.dedent(UNALIGNED)}\nprint({call})\n")
    assert done.returncode == 0 and "runtime error" not in done.stderr, done.stderr[-3000:]
