"""What the fuzz harnesses share.

A harness is one function `one_input(data: bytes) -> None` that turns the fuzzer's
bytes into a case (`Source`: every draw consumes bytes from the front, and past the
end every draw is its smallest choice), runs a C extension's entry point and its
Python/numpy reference on it, and raises (a finding) when they disagree: a different
answer, an exception the reference does not raise, or an exception that is not a
clean argument error (`CLEAN`). A crash or a sanitizer report ends the process.

The same function runs two ways: `replay` (pytest: a fixed number of seeded random
inputs, a few hundred milliseconds) and `fuzz` (atheris: coverage-guided, as
`python -m tests.fuzz.test_fuzz_<name> -atheris_runs=N` or `-max_total_time=S`; any
other libFuzzer flag or a corpus directory may follow). Without clang the C
extensions carry no libFuzzer coverage: atheris then steers by the Python coverage of
the harness and the references (which branch each case takes), not by the C's.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from sarpd.core import native

CLEAN: tuple[type[Exception], ...] = (TypeError, ValueError, OverflowError)
"""What a C entry point may raise for an argument it refuses."""

U64 = npt.NDArray[np.uint64]
I64 = npt.NDArray[np.int64]
T = TypeVar("T")

EDGE_U64 = (0, 1, 2, 15, 16, 63, 64, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**56 - 1, 2**56,
            2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
HOSTILE_INTS: tuple[object, ...] = (-1, -(2**63), 2**63, 2**64 - 1, 2**64, 2**70, -(2**70),
                                    True, np.int64(3), 3.0, None, "3", b"3")


def extension(path: str) -> ModuleType | None:
    """The C extension of native path `path` ("verify", "hash", "match", "write"; see
    sarpd.core.native) as this process loads it, or None (not built, or
    SARPD_NO_EXTENSIONS=1)."""
    if os.environ.get("SARPD_NO_EXTENSIONS") == "1":
        return None
    try:
        return importlib.import_module(native.EXTENSIONS[path])
    except ImportError:
        return None


class Source:
    """The fuzzer's bytes as a sequence of choices."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def _take(self, n: int) -> int:
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return int.from_bytes(chunk, "little")

    def integer(self, lo: int, hi: int) -> int:
        """An int in [lo, hi]."""
        span = hi - lo
        if span <= 0:
            return lo
        return lo + self._take((span.bit_length() + 7) // 8) % (span + 1)

    def flag(self) -> bool:
        return self.integer(0, 1) == 1

    def chance(self, percent: int) -> bool:
        """True `percent` times in 100 (False past the end of the bytes)."""
        return self.integer(0, 99) >= 100 - percent

    def pick(self, options: Sequence[T]) -> T:
        return options[self.integer(0, len(options) - 1)]

    def u64(self) -> int:
        """A uint64, often an edge value."""
        if self.chance(40):
            return self.pick(EDGE_U64)
        return self.integer(0, 2**64 - 1)

    def raw(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk + bytes(n - len(chunk))

    def u64s(self, shape: int | tuple[int, ...], pool: int = 0) -> U64:
        """Random uint64 of `shape`; from a pool of `pool` values when pool > 0 (so that
        values collide), else each from the bytes (edge values among them)."""
        n = int(np.prod(shape))
        if pool > 0:
            values = [self.u64() for _ in range(pool)]
            out = np.array([values[self.integer(0, pool - 1)] for _ in range(n)], np.uint64)
        elif self.chance(20):
            out = np.array([self.u64() for _ in range(n)], np.uint64)
        else:
            out = np.frombuffer(self.raw(8 * n), dtype="<u8").astype(np.uint64)
        return out.reshape(shape)


def u64_form(src: Source, arr: U64, unaligned: bool = True) -> tuple[object, bool]:
    """`arr` (C-contiguous uint64) as a C entry point may meet it: (obj, True) for a form
    holding the same values that it must read (itself, unaligned, read-only, a
    memoryview), (obj, False) for one it must refuse with a clean exception (another
    dtype, byte order or memory order, no buffer, a bytes object). `unaligned=False`:
    never unaligned (an entry point that reads them with undefined behaviour: a known
    bug, tests/fuzz/test_found.py)."""
    k = src.integer(0, 17)
    if k <= 7 or (k == 8 and not unaligned):
        return arr, True
    if k == 8:  # the same values, one byte past an 8-byte boundary
        buf = bytearray(arr.nbytes + 1)
        buf[1:] = arr.tobytes()
        return np.frombuffer(buf, dtype=np.uint64, offset=1).reshape(arr.shape), True
    if k == 9:
        ro = arr.copy()
        ro.flags.writeable = False
        return ro, True
    if k == 10:
        return arr.data, True  # its memoryview
    if k == 11:
        return arr.view(src.pick([np.int64, np.float64, np.complex64])), False
    if k == 12:
        return arr.astype(">u8"), False
    if k == 13:  # strided: refused unless numpy calls it contiguous (length <= 1)
        wide = np.repeat(arr, 2, axis=0)[::2]
        return wide, bool(wide.flags.c_contiguous)
    if k == 14:
        fort = np.asfortranarray(arr)
        return fort, bool(fort.flags.c_contiguous)
    if k == 15:
        return arr.tolist(), False
    if k == 16:
        return arr.tobytes(), False
    return src.pick([None, 7, "ids", object()]), False


def outcome(fn: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    """fn's result, or the exception it raised."""
    try:
        return fn(), None
    except Exception as e:
        return None, e


def clean(err: BaseException | None, what: str, *also: type[Exception]) -> None:
    """`err` must be a clean argument error (or one of `also`)."""
    if err is not None and not isinstance(err, CLEAN + also):
        raise AssertionError(f"{what}: raised {type(err).__name__}: {err}") from err


def refused(err: BaseException | None, what: str, *also: type[Exception]) -> None:
    """The call must have raised a clean argument error."""
    if err is None:
        raise AssertionError(f"{what}: accepted an argument it must refuse")
    clean(err, what, *also)


def replay(one_input: Callable[[bytes], None], seed: int, runs: int, max_len: int) -> None:
    """`runs` random inputs of up to `max_len` bytes (seeded): what pytest runs."""
    rng = np.random.default_rng(seed)
    for i in range(runs):
        data = rng.bytes(int(rng.integers(0, max_len + 1)))
        try:
            one_input(data)
        except Exception as e:
            shown = data.hex() if len(data) <= 512 else f"{len(data)} bytes"
            raise AssertionError(f"replay seed {seed}, input {i}: {e}\ninput: {shown}") from e


def fuzz(one_input: Callable[[bytes], None], argv: list[str] | None = None) -> None:
    """Coverage-guided fuzzing with atheris (libFuzzer's flags in argv). The harness's
    and the references' Python code is instrumented for coverage; the C extensions are
    not (no clang here: see the module docstring)."""
    atheris: Any = importlib.import_module("atheris")  # dev extra; typed Any (no stubs)
    targets = [m for name, m in list(sys.modules.items())
               if name == "__main__"
               or name.startswith(("sarpd.core", "tests.fuzz", "tests.core.test_kernel"))]
    for mod in targets:
        for obj in list(vars(mod).values()):
            if getattr(obj, "__module__", None) != mod.__name__:
                continue
            for fn in [obj, *vars(obj).values()] if isinstance(obj, type) else [obj]:
                if callable(fn) and hasattr(fn, "__code__"):
                    atheris.instrument_func(fn)
    atheris.Setup(argv if argv is not None else sys.argv, one_input)
    atheris.Fuzz()
