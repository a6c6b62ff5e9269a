"""Subprocess side of tests/backends/test_contract.py.

python crash_helper.py crash NAME PATH
    write batch 0, 1, 2, ... with sync=True until killed; print "acked N" (and
    flush) after batch N returned.
python crash_helper.py efbig NAME PATH
    under RLIMIT_FSIZE = 1 MiB, write a small batch, then a batch holding a 2 MiB
    value; print one JSON line: the exception class and message of that write and
    what get_many saw afterwards.
"""

from __future__ import annotations

import hashlib
import json
import resource
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FSIZE_LIMIT = 1 << 20
BIG_VALUE = 2 << 20


def be8(i: int) -> bytes:
    return i.to_bytes(8, "big")


def crash_value(i: int, j: int) -> bytes:
    digest = hashlib.blake2b(f"{i}:{j}".encode(), digest_size=16).digest()
    return digest * (1 + (i + j) % 40)


def crash_batch(i: int) -> tuple[dict[bytes, bytes], set[bytes]]:
    """Batch i: four values under b"b"+id, b"last" = i, b"d"+i put and b"d"+(i-1)
    deleted. After any prefix 0..M of batches: b"last" = M, exactly one b"d" key."""
    puts = {b"b" + be8(i) + bytes([j]): crash_value(i, j) for j in range(4)}
    puts[b"last"] = be8(i)
    puts[b"d" + be8(i)] = b"x"
    deletes = {b"d" + be8(i - 1)} if i > 0 else set()
    return puts, deletes


def _crash(name: str, path: Path) -> None:
    from backends.base import WriteBatch
    from backends.registry import open_backend

    backend = open_backend(name, path, cache_bytes=4 << 20)
    i = 0
    while True:
        puts, deletes = crash_batch(i)
        batch = WriteBatch()
        for key in deletes:
            batch.delete(key)
        for key, value in puts.items():
            batch.put(key, value)
        backend.write(batch, sync=True)
        sys.stdout.write(f"acked {i}\n")
        sys.stdout.flush()
        i += 1


def _efbig(name: str, path: Path) -> None:
    from backends.base import WriteBatch
    from backends.registry import open_backend

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG instead of a signal
    backend = open_backend(name, path, cache_bytes=4 << 20)
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, resource.RLIM_INFINITY))
    small = WriteBatch()
    small.put(b"small", b"x")
    backend.write(small, sync=True)
    big = WriteBatch()
    big.put(b"big", b"y" * BIG_VALUE)
    big.put(b"other", b"z")
    error: dict[str, str] = {}
    try:
        backend.write(big, sync=True)
    except Exception as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
    seen = [v is not None for v in backend.get_many([b"small", b"big", b"other"])]
    print(json.dumps({"error": error, "seen": seen}), flush=True)
    try:
        backend.close()
    except Exception as exc:  # the engine may refuse to flush after the failure
        print(json.dumps({"close_error": type(exc).__name__}), flush=True)


def main() -> None:
    sys.path.insert(0, str(ROOT))
    mode, name, path = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    {"crash": _crash, "efbig": _efbig}[mode](name, path)


if __name__ == "__main__":
    main()
