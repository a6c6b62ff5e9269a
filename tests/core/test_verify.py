"""First-mismatch verification: the C/AVX2 extension agrees with the numpy reference.

Both halves are imported directly, so this runs the same with or without
SARPD_NO_EXTENSIONS; the C half is skipped only when the extension could not have
been built (SARPD_NO_EXTENSIONS=1 or no C compiler) and is absent.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from types import ModuleType

import numpy as np
import pytest

from sarpd.core.verify import _numpy as npv
from sarpd.model import IdArray

cv: ModuleType | None
try:
    cv = importlib.import_module("sarpd.core.verify._cverify")
except ImportError:  # pragma: no cover - depends on the build
    _cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    _expected = os.environ.get("SARPD_NO_EXTENSIONS") != "1" and shutil.which(_cc) is not None
    if _expected:
        raise
    cv = None

needs_c = pytest.mark.skipif(
    cv is None,
    reason="sarpd.core.verify._cverify not built (SARPD_NO_EXTENSIONS=1 or no C compiler)",
)

Pair = Callable[[IdArray, IdArray], int]


def _paths() -> list[str]:
    if cv is None:
        return []
    return ["avx2", "scalar"] if cv.HAVE_AVX2 else ["scalar"]


@pytest.fixture(params=_paths())
def c(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """The C module, on its AVX2 path and on its plain C path."""
    assert cv is not None
    was = cv._set_simd(request.param == "avx2")
    try:
        yield cv
    finally:
        cv._set_simd(was)


def ids(n: int, rng: np.random.Generator) -> IdArray:
    return rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)


def unaligned(a: IdArray) -> IdArray:
    """A read-only copy of `a` whose data starts at an odd address."""
    out = np.frombuffer(b"x" + a.tobytes(), dtype=np.uint64, offset=1).reshape(-1, 2)
    assert out.ctypes.data % 8 != 0
    return out


def check(c: ModuleType, a: IdArray, b: IdArray) -> int:
    want = npv.first_mismatch(a, b)
    assert c.first_mismatch(a, b) == want
    assert c.first_mismatch(unaligned(a), unaligned(b)) == want
    assert c.first_mismatch_many([a], [b]) == [want]
    return want


def test_numpy_reference_semantics() -> None:
    a = np.arange(20, dtype=np.uint64).reshape(10, 2)
    b = a.copy()
    b[7, 1] += 1
    assert npv.first_mismatch(a, b) == 7
    assert npv.first_mismatch(a, a[:4]) == 4
    assert npv.first_mismatch(a[:0], a) == 0
    assert npv.first_mismatch_many([a, a[:3]], [b, a]) == [7, 3]


@needs_c
def test_random_parity(c: ModuleType) -> None:
    rng = np.random.default_rng(1)
    cands, queries = [], []
    for _ in range(300):
        n = int(rng.integers(0, 80))
        a = ids(n, rng)
        b = a.copy()
        if n and rng.random() < 0.8:
            b[int(rng.integers(0, n)), int(rng.integers(0, 2))] ^= np.uint64(
                1 << int(rng.integers(0, 64))
            )
        b = b[: int(rng.integers(0, n + 1))] if rng.random() < 0.3 else b
        cands.append(a)
        queries.append(b)
        check(c, a, b)
    assert c.first_mismatch_many(cands, queries) == npv.first_mismatch_many(cands, queries)


@needs_c
@pytest.mark.parametrize("n", range(10))
def test_mismatch_at_every_row_and_half(c: ModuleType, n: int) -> None:
    """Every lane of the 256-bit compare, every tail position, lengths 0..9."""
    rng = np.random.default_rng(n)
    a = ids(n, rng)
    assert check(c, a, a.copy()) == n
    for row in range(n):
        for half in (0, 1):
            b = a.copy()
            b[row, half] ^= np.uint64(1 << 63)
            assert check(c, a, b) == row
            b[row:] = 0  # everything after the first mismatch differs too
            b[row, half] = a[row, half] ^ np.uint64(1)
            assert check(c, a, b) == row


@needs_c
def test_different_lengths_and_empty(c: ModuleType) -> None:
    rng = np.random.default_rng(2)
    a = ids(9, rng)
    for k in range(10):
        assert check(c, a, a[:k]) == k
        assert check(c, a[:k], a) == k
    b = a.copy()
    b[5, 0] += np.uint64(1)
    assert check(c, a, b[:5]) == 5  # the mismatch lies past the shorter one
    assert check(c, a, b[:6]) == 5
    assert c.first_mismatch_many([], []) == []
    assert c.first_mismatch_many([a[:0]], [a]) == [0]


@needs_c
def test_row_slices_and_read_only_views(c: ModuleType) -> None:
    rng = np.random.default_rng(3)
    q = ids(64, rng)
    raw = np.frombuffer(q.tobytes(), dtype=np.uint64).reshape(-1, 2)
    assert not raw.flags.writeable
    for start in range(0, 60, 3):
        assert c.first_mismatch(raw[start : start + 4], q[start : start + 4]) == 4
        assert c.first_mismatch(q[start:], q) == npv.first_mismatch(q[start:], q)


@needs_c
def test_bad_inputs_name_the_argument(c: ModuleType) -> None:
    a = np.zeros((4, 2), dtype=np.uint64)
    with pytest.raises(ValueError, match="query must be a C-contiguous"):
        c.first_mismatch(a, np.zeros((8, 2), dtype=np.uint64)[::2])
    with pytest.raises(ValueError, match="cand must be a C-contiguous"):
        c.first_mismatch(np.zeros((2, 4), dtype=np.uint64).T, a)
    with pytest.raises(TypeError, match=r"cand must have dtype uint64.*'l'"):
        c.first_mismatch(a.astype(np.int64), a)
    with pytest.raises(TypeError, match="query must have dtype uint64"):
        c.first_mismatch(a, a.astype(np.uint32))
    with pytest.raises(TypeError, match="query must have dtype uint64"):
        c.first_mismatch(a, a.astype(">u8"))
    with pytest.raises(ValueError, match=r"cand must have shape \(n, 2\), got ndim 1"):
        c.first_mismatch(a.ravel(), a)
    with pytest.raises(ValueError, match=r"query must have shape \(n, 2\), got ndim 2"):
        c.first_mismatch(a, a.reshape(2, 4))
    with pytest.raises(TypeError, match=r"cand must be a uint64 array of shape \(n, 2\), got list"):
        c.first_mismatch([[1, 2]], a)
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        c.first_mismatch_many([a, a], [a])
    with pytest.raises(TypeError, match="cands must be a sequence"):
        c.first_mismatch_many(None, [])
    with pytest.raises(ValueError, match="query must be a C-contiguous"):
        c.first_mismatch_many([a, a], [a, a[:, :1]])


def _implementation(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SARPD_NO_EXTENSIONS"}
    if env_value is not None:
        env["SARPD_NO_EXTENSIONS"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", "import sarpd.core.verify as v; print(v.implementation())"],
        env=env, capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def test_env_var_forces_numpy() -> None:
    assert _implementation("1") == "numpy"


@needs_c
def test_extension_picked_by_default() -> None:
    assert _implementation(None) == "c"
