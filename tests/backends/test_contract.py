"""The one contract every storage backend keeps (backends/base.py).

Parametrised over every name in backends.registry.BACKENDS, so a newly registered
engine runs all of it. MemoryBackend is the oracle of the randomized test. Persistent
backends (`persistent` not False) also get reopen, kill -9 and disk-full tests.
Engine-specific checks are in tests/backends/test_<engine>.py, the registry's in
tests/backends/test_registry.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.base import Backend, WriteBatch
from backends.errors import BackendIOError
from backends.memory import MemoryBackend
from backends.registry import backend_names, open_backend
from tests.backends.helpers import batch_of, be8, get_one, put_all

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HELPER_PATH = HERE / "crash_helper.py"
CACHE = 8 << 20
NAMES = backend_names()


def _load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("backend_crash_helper", HELPER_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helper = _load_helper()


Opener = Callable[[], Backend]


@pytest.fixture(params=NAMES)
def name(request: pytest.FixtureRequest) -> str:
    value: str = request.param
    return value


@pytest.fixture
def opener(name: str, tmp_path: Path) -> Iterator[Opener]:
    """Opens `name` on one directory; closes whatever it opened at teardown."""
    opened: list[Backend] = []

    def open_() -> Backend:
        backend = open_backend(name, tmp_path / "db", cache_bytes=CACHE)
        opened.append(backend)
        return backend

    yield open_
    for backend in opened:
        backend.close()


@pytest.fixture
def backend(opener: Opener) -> Backend:
    return opener()


@pytest.fixture
def persistent_opener(opener: Opener) -> Opener:
    probe = opener()
    probe.close()
    if not probe.persistent:
        pytest.skip(f"{probe.name} keeps nothing across close")
    return opener


def _run_helper(mode: str, name: str, path: Path, **kw: Any) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, str(HELPER_PATH), mode, name, str(path)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


# --- protocol -------------------------------------------------------------------------


def test_backend_implements_protocol(backend: Backend, name: str) -> None:
    assert isinstance(backend, Backend)
    assert backend.name == name
    assert isinstance(backend.stats()["disk_bytes"], int)
    assert isinstance(backend.stats()["memory_bytes"], int)
    assert backend.direct_io is False  # the default of every factory


# --- direct I/O and write buffers (the bench's tunables) ------------------------------


def test_direct_io_reads_what_was_written(name: str, tmp_path: Path) -> None:
    """direct_io=True is accepted by every backend, reported, and changes no answer:
    after flush_buffers the reads come from the engine's files (its cache or the
    device), before and after a reopen, and a reopen without it reads the same."""
    items = [(be8(i), b"v%d" % i * 40) for i in range(3000)]
    backend = open_backend(name, tmp_path / "db", cache_bytes=1 << 20, direct_io=True)
    try:
        assert backend.direct_io is True
        put_all(backend, items, sync=False)
        backend.flush_buffers()
        assert backend.get_many([k for k, _ in items]) == [v for _, v in items]
        memory = backend.stats()["memory_bytes"]
        assert isinstance(memory, int) and memory > 0
        assert list(backend.scan(be8(10), be8(13))) == items[10:13]
    finally:
        backend.close()
    if not backend.persistent:
        return
    for direct in (True, False):
        again = open_backend(name, tmp_path / "db", cache_bytes=1 << 20, direct_io=direct)
        try:
            assert again.direct_io is direct
            assert again.get_many([items[0][0], items[-1][0], b"absent"]) == [
                items[0][1], items[-1][1], None]
        finally:
            again.close()


def test_flush_buffers_keeps_every_write(backend: Backend) -> None:
    put_all(backend, [(b"a", b"1"), (b"b", b"2")], sync=False)
    backend.flush_buffers()
    backend.flush_buffers()  # nothing left to flush: still fine
    put_all(backend, [(b"a", b"3")], sync=False)
    assert backend.get_many([b"a", b"b"]) == [b"3", b"2"]


# --- get_many / write -----------------------------------------------------------------


def test_get_many_hits_misses_duplicates_order(backend: Backend) -> None:
    put_all(backend, [(b"a", b"1"), (b"b", b"2"), (b"c", b"")], sync=False)
    keys = [b"c", b"zz", b"a", b"a", b"missing", b"b", b"c"]
    assert backend.get_many(keys) == [b"", None, b"1", b"1", None, b"2", b""]
    assert get_one(backend, b"b") == b"2"
    assert backend.get_many((b"b", b"a")) == [b"2", b"1"]  # any Sequence


def test_get_many_empty(backend: Backend) -> None:
    assert backend.get_many([]) == []
    put_all(backend, [(b"a", b"1")], sync=True)
    assert backend.get_many([]) == []


def test_write_batch_puts_and_deletes_together(backend: Backend) -> None:
    put_all(backend, [(b"k%d" % i, b"old%d" % i) for i in range(10)], sync=True)
    wb = batch_of({b"k1": b"new1", b"k20": b"v20", b"k21": b"v21"}, [b"k2", b"k3", b"k9"])
    assert len(wb) == 6
    backend.write(wb, sync=True)
    got = backend.get_many([b"k%d" % i for i in (0, 1, 2, 3, 9, 20, 21)])
    assert got == [b"old0", b"new1", None, None, None, b"v20", b"v21"]


@pytest.mark.parametrize("sync", [True, False])
def test_later_operation_on_same_key_wins(backend: Backend, sync: bool) -> None:
    put_all(backend, [(b"x", b"0"), (b"y", b"0")], sync=sync)
    wb = WriteBatch()
    wb.put(b"x", b"1")
    wb.delete(b"x")  # put then delete: deleted
    wb.delete(b"y")
    wb.put(b"y", b"2")  # delete then put: present
    wb.put(b"z", b"3")
    wb.put(b"z", b"4")  # put twice: last value
    backend.write(wb, sync=sync)
    assert backend.get_many([b"x", b"y", b"z"]) == [None, b"2", b"4"]
    # across batches too
    backend.write(batch_of({b"z": b"5"}), sync=sync)
    backend.write(batch_of(deletes=[b"y"]), sync=sync)
    assert backend.get_many([b"y", b"z"]) == [None, b"5"]


def test_delete_of_missing_key(backend: Backend) -> None:
    put_all(backend, [(b"a", b"1")], sync=False)
    backend.write(batch_of(deletes=[b"nope", b"nope2"]), sync=True)
    assert backend.get_many([b"a", b"nope"]) == [b"1", None]
    assert list(backend.scan(b"", b"\xff")) == [(b"a", b"1")]


@pytest.mark.parametrize("sync", [True, False])
def test_empty_batch(backend: Backend, sync: bool) -> None:
    put_all(backend, [(b"a", b"1")], sync=False)
    backend.write(WriteBatch(), sync=sync)
    assert list(backend.scan(b"", b"\xff")) == [(b"a", b"1")]


def test_large_values(backend: Backend) -> None:
    values = {b"big%d" % i: os.urandom(1 << 20) for i in range(3)}
    backend.write(batch_of(values), sync=True)
    assert backend.get_many(list(values)) == list(values.values())
    assert dict(backend.scan(b"big", b"bih")) == values


# --- scan -----------------------------------------------------------------------------

IDS = [0, 1, 255, 256, 65535, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


def _seed_ids(backend: Backend) -> None:
    items = [(b"S" + be8(i), b"v%d" % i) for i in reversed(IDS)]
    items += [(b"R" + be8(5), b"before"), (b"T", b"after"), (b"S", b"bare prefix")]
    put_all(backend, items, sync=False)


def _ids(pairs: list[tuple[bytes, bytes]]) -> list[int]:
    return [int.from_bytes(k[1:], "big") for k, _ in pairs]


def test_scan_big_endian_ids_in_order(backend: Backend) -> None:
    _seed_ids(backend)
    everything = list(backend.scan(b"S" + be8(0), b"S" + be8((1 << 64) - 1) + b"\x00"))
    assert _ids(everything) == IDS
    assert all(v == b"v%d" % int.from_bytes(k[1:], "big") for k, v in everything)
    assert all(isinstance(k, bytes) and isinstance(v, bytes) for k, v in everything)


def test_scan_bounds_inclusive_start_exclusive_end(backend: Backend) -> None:
    _seed_ids(backend)
    assert _ids(list(backend.scan(b"S" + be8(1), b"S" + be8(1 << 32)))) == [1, 255, 256, 65535]
    assert _ids(list(backend.scan(b"S" + be8(2), b"S" + be8(256)))) == [255]
    # "newer than X": start just after X
    newer = list(backend.scan(b"S" + be8((1 << 63) - 1 + 1), b"T"))
    assert _ids(newer) == [1 << 63, (1 << 64) - 1]
    # a bare prefix key sorts before every longer key it prefixes
    assert [k for k, _ in backend.scan(b"S", b"S" + be8(1))] == [b"S", b"S" + be8(0)]
    assert [k for k, _ in backend.scan(b"", b"S")] == [b"R" + be8(5)]
    assert [k for k, _ in backend.scan(b"T", b"\xff" * 9)] == [b"T"]


def test_scan_empty_ranges(backend: Backend) -> None:
    _seed_ids(backend)
    assert list(backend.scan(b"S" + be8(1), b"S" + be8(1))) == []  # start == end
    assert list(backend.scan(b"S" + be8(9), b"S" + be8(2))) == []  # start > end
    assert list(backend.scan(b"S" + be8(2), b"S" + be8(255))) == []  # no key inside
    assert list(backend.scan(b"U", b"\xff")) == []  # past the last key


def test_scan_sees_later_writes(backend: Backend) -> None:
    _seed_ids(backend)
    assert _ids(list(backend.scan(b"S" + be8(1), b"S" + be8(1 << 32)))) == [1, 255, 256, 65535]
    backend.write(batch_of({b"S" + be8(2): b"v2"}), sync=False)
    assert _ids(list(backend.scan(b"S" + be8(1), b"S" + be8(256)))) == [1, 2, 255]
    backend.write(batch_of(deletes=[b"S" + be8(255), b"S" + be8(256)]), sync=False)
    assert _ids(list(backend.scan(b"S" + be8(1), b"S" + be8(1 << 32)))) == [1, 2, 65535]


# --- errors after close ---------------------------------------------------------------


def test_calls_after_close_raise_backend_io_error(backend: Backend) -> None:
    put_all(backend, [(b"a", b"1")], sync=True)
    backend.close()
    backend.close()  # idempotent
    with pytest.raises(BackendIOError) as err:
        backend.write(batch_of({b"b": b"2"}), sync=True)
    assert backend.name in err.value.message
    with pytest.raises(BackendIOError):
        backend.write(WriteBatch(), sync=False)
    with pytest.raises(BackendIOError):
        backend.get_many([b"a"])
    with pytest.raises(BackendIOError):
        list(backend.scan(b"", b"\xff"))
    assert "disk_bytes" in backend.stats()


def test_write_failure_is_backend_io_error_and_invisible(
    persistent_opener: Opener, name: str, tmp_path: Path
) -> None:
    """A real I/O failure: the file size limit (RLIMIT_FSIZE, 1 MiB) makes the engine's
    append of a 2 MiB value fail with EFBIG in a child process."""
    proc = _run_helper("efbig", name, tmp_path / "db")
    out, errs = proc.communicate(timeout=60)
    assert proc.returncode == 0, errs
    result = json.loads(out.splitlines()[0])
    assert result["error"]["type"] == "BackendIOError", result
    assert str(tmp_path / "db") in result["error"]["message"]
    assert result["seen"] == [True, False, False]  # nothing of the failed batch
    backend = persistent_opener()
    assert backend.get_many([b"small", b"big", b"other"]) == [b"x", None, None]


# --- ingest (bulk load) ---------------------------------------------------------------


def _ingest_items(n: int) -> list[tuple[bytes, bytes]]:
    return [(b"S" + be8(i), b"v%d" % i * (1 + i % 7)) for i in range(n)]


def test_ingest_loads_sorted_items_over_existing_data(backend: Backend) -> None:
    put_all(backend, [(b"A", b"kept"), (b"S" + be8(3), b"old")], sync=True)
    items = _ingest_items(5000)
    assert backend.ingest(iter(items)) == 5000  # an iterator: need not be a list
    assert backend.get_many([b"A", b"S" + be8(3), b"S" + be8(4999), b"S" + be8(5000)]) == [
        b"kept", items[3][1], items[4999][1], None]
    assert list(backend.scan(b"S", b"T")) == items
    put_all(backend, [(b"S" + be8(1), b"after")], sync=True)  # writable afterwards
    assert get_one(backend, b"S" + be8(1)) == b"after"


def test_ingest_empty_and_out_of_order(backend: Backend) -> None:
    assert backend.ingest([]) == 0
    with pytest.raises(ValueError, match="strictly increasing"):
        backend.ingest([(b"b", b"1"), (b"a", b"2")])
    with pytest.raises(ValueError, match="strictly increasing"):
        backend.ingest([(b"c", b"1"), (b"c", b"2")])
    assert get_one(backend, b"a") is None


def test_ingested_items_survive_reopen(persistent_opener: Opener) -> None:
    backend = persistent_opener()
    items = _ingest_items(3000)
    backend.ingest(items)
    backend.close()
    again = persistent_opener()
    assert list(again.scan(b"S", b"T")) == items


# --- persistence ----------------------------------------------------------------------


def test_reopen_after_close_keeps_data(persistent_opener: Opener) -> None:
    backend = persistent_opener()
    big = os.urandom(1 << 20)
    put_all(backend, [(b"S" + be8(i), b"v%d" % i) for i in range(500)], sync=False)
    backend.write(batch_of({b"big": big}, [b"S" + be8(7)]), sync=False)
    backend.close()
    again = persistent_opener()
    assert again.get_many([b"S" + be8(6), b"S" + be8(7), b"big"]) == [b"v6", None, big]
    assert len(list(again.scan(b"S", b"T"))) == 499
    assert int(again.stats()["disk_bytes"]) > 1 << 20


def test_copy_to_is_a_consistent_copy_the_engine_reopens(
        persistent_opener: Opener, name: str, tmp_path: Path) -> None:
    """`copy_to` while open and unflushed: the copy holds every write made before it
    (synced or not, memtables and write buffers included) and nothing after; the
    original stays open and writable; the copy opens as its own store."""
    backend = persistent_opener()
    put_all(backend, [(b"S" + be8(i), b"v%d" % i) for i in range(300)], sync=False)
    backend.write(batch_of({b"last": b"synced"}, [b"S" + be8(5)]), sync=True)
    dest = tmp_path / "copy"
    backend.copy_to(dest)
    backend.write(batch_of({b"after": b"x"}, [b"S" + be8(6)]), sync=True)
    assert backend.get_many([b"after", b"S" + be8(6)]) == [b"x", None]
    copy = open_backend(name, dest, cache_bytes=CACHE)
    try:
        assert copy.get_many([b"S" + be8(4), b"S" + be8(5), b"S" + be8(6), b"last",
                              b"after"]) == [b"v4", None, b"v6", b"synced", None]
        assert len(list(copy.scan(b"S", b"T"))) == 299
        copy.write(batch_of({b"own": b"y"}, []), sync=True)  # a store of its own
        assert backend.get_many([b"own"]) == [None]
    finally:
        copy.close()


def test_copy_to_refuses_a_bad_destination(persistent_opener: Opener, tmp_path: Path) -> None:
    backend = persistent_opener()
    (tmp_path / "taken").mkdir()
    for dest, what in ((tmp_path / "taken", "already exists"),
                       (tmp_path / "no" / "such", "no directory"),
                       (tmp_path / "db" / "inner", "inside the store")):
        with pytest.raises(BackendIOError, match=f"copy_to .*{what}"):
            backend.copy_to(dest)
    backend.close()
    with pytest.raises(BackendIOError):
        backend.copy_to(tmp_path / "after-close")


def test_copy_to_of_the_memory_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackendIOError, match="keeps nothing on disk"):
        MemoryBackend().copy_to(tmp_path / "copy")


def test_acknowledged_batches_survive_kill_9(
    persistent_opener: Opener, name: str, tmp_path: Path
) -> None:
    proc = _run_helper("crash", name, tmp_path / "db")
    assert proc.stdout is not None
    acked = -1
    while acked < 40:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"helper died before 40 acks: {proc.communicate()[1]}")
        acked = int(line.split()[1])
    proc.send_signal(signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    for line in rest.splitlines():  # acks printed before the kill landed count too
        if line.startswith("acked "):
            acked = int(line.split()[1])

    backend = persistent_opener()
    last_raw = get_one(backend, b"last")
    assert last_raw is not None
    last = int.from_bytes(last_raw, "big")
    assert last >= acked  # every acknowledged batch, maybe one more
    present: dict[int, dict[int, bytes]] = {}
    for key, value in backend.scan(b"b", b"c"):
        present.setdefault(int.from_bytes(key[1:9], "big"), {})[key[9]] = value
    assert sorted(present) == list(range(last + 1))  # a prefix of the batches
    for i, values in present.items():  # each batch whole: atomic
        assert values == {j: helper.crash_value(i, j) for j in range(4)}
    assert list(backend.scan(b"d", b"e")) == [(b"d" + be8(last), b"x")]


# --- randomized comparison with the oracle --------------------------------------------

POOL = [b"S" + be8(i) for i in (0, 1, 2, 255, 256, 1 << 40, (1 << 64) - 1)]
POOL += [b"S", b"a", b"ab", b"b", b"\x00", b"\xff", b"\xff\xff"]
KEYS = st.one_of(st.sampled_from(POOL), st.binary(min_size=1, max_size=3))
BOUNDS = st.one_of(st.sampled_from([b"", *POOL]), st.binary(max_size=9))
VALUES = st.binary(max_size=40)
OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"),
            st.lists(st.tuples(KEYS, st.none() | VALUES), max_size=8),
            st.booleans(),
        ),
        st.tuples(st.just("get"), st.lists(KEYS, max_size=8)),
        st.tuples(st.just("scan"), BOUNDS, BOUNDS),
        st.tuples(st.just("reopen")),
    ),
    max_size=30,
)


def _apply(backend: Backend, ops: list[tuple[bytes, bytes | None]], sync: bool) -> None:
    wb = WriteBatch()
    for key, value in ops:
        if value is None:
            wb.delete(key)
        else:
            wb.put(key, value)
    backend.write(wb, sync)


@pytest.mark.parametrize("name", NAMES)
def test_random_ops_match_memory_oracle(name: str, tmp_path: Path) -> None:
    probe = open_backend(name, tmp_path / "probe", cache_bytes=CACHE)
    probe.close()
    if not probe.persistent:
        pytest.skip(f"{name} is the oracle's kind (not persistent)")

    @settings(
        max_examples=150,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(ops=OPS)
    def run(ops: list[tuple[Any, ...]]) -> None:
        path = Path(tempfile.mkdtemp(dir=tmp_path))
        oracle = MemoryBackend()
        real = open_backend(name, path, cache_bytes=1 << 20)
        try:
            for op in ops:
                if op[0] == "write":
                    _apply(oracle, op[1], op[2])
                    _apply(real, op[1], op[2])
                elif op[0] == "get":
                    assert real.get_many(op[1]) == oracle.get_many(op[1])
                elif op[0] == "scan":
                    assert list(real.scan(op[1], op[2])) == list(oracle.scan(op[1], op[2]))
                else:
                    real.close()
                    real = open_backend(name, path, cache_bytes=1 << 20)
            assert list(real.scan(b"", b"\xff" * 10)) == list(oracle.scan(b"", b"\xff" * 10))
        finally:
            real.close()
            shutil.rmtree(path, ignore_errors=True)

    run()
