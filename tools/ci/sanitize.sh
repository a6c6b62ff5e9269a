#!/usr/bin/env bash
# `make sanitize`: the native tests under AddressSanitizer + UndefinedBehaviorSanitizer.
#
# Every C extension of setup.py is built with the sanitizers into a copy of the tree
# (build/sanitize/src: the files git knows, tracked or new, as they are in the work
# tree), so the normal in-place build next to the sources is left alone; pytest runs
# from that copy (`import sarpd` is the copy's: the editable install's finder comes
# after sys.path) with the compiler's libasan/libubsan preloaded into python, and
# tests/fuzz/test_sanitized.py checks that the extensions loaded are the sanitized ones.
# Fails when a test fails, when a sanitizer stops the process, and when any sanitizer
# report was written, by any process (build/sanitize/logs: ASan's report files, and
# pytest's output, where UBSan's reports go).
#
# The flags reach the compiler through a wrapper given as CC (setuptools also links
# with it), placed last so that they win over setup.py's -O2.
#
# usage: tools/ci/sanitize.sh [PYTHON] [pytest args...]   (default: .venv/bin/python and
#        the native tests)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=$(realpath -s "${1:-.venv/bin/python}")  # -s: the venv's own link, not its target
shift $(($# > 0 ? 1 : 0))
OUT=$ROOT/build/sanitize
SRC=$OUT/src
LOGS=$OUT/logs
SAN_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined -O1 -g"
REAL_CC=${CC:-cc}
REPORT='runtime error:|ERROR: AddressSanitizer|SUMMARY: (Address|UndefinedBehavior)Sanitizer'

TESTS=(
    tests/core/test_kernel.py tests/core/test_cwrite.py tests/core/test_chash.py
    tests/core/test_verify.py tests/core/test_native.py tests/core/test_write_batches.py
    tests/core/test_index.py tests/core/test_blockmap.py tests/core/test_cmap.py
    tests/core/test_csegment.py tests/core/test_cdir.py tests/core/test_delta.py
    tests/core/test_segcache.py tests/core/test_threads.py
    tests/core/test_holders_index.py::test_holder_spans_are_the_references_on_hard_workloads
    tests/fuzz
)
(($#)) && TESTS=("$@")

libasan=$("$REAL_CC" -print-file-name=libasan.so)
libubsan=$("$REAL_CC" -print-file-name=libubsan.so)
for lib in "$libasan" "$libubsan"; do
    [[ $lib == /* && -e $lib ]] || {
        echo "sanitize: $REAL_CC has no $lib (Debian: gcc's libasan8 / libubsan1)" >&2
        exit 1
    }
done

echo "sanitize: copying the tree to $SRC"
rm -rf "$SRC" "$LOGS"
mkdir -p "$SRC" "$LOGS"
git ls-files -z --cached --others --exclude-standard -- \
        sarpd backends bloomstore tests tools setup.py pyproject.toml README.md \
    | tar --null -T - --ignore-failed-read -cf - | tar -xf - -C "$SRC"

printf '#!/bin/sh\nexec %s "$@" %s\n' "$REAL_CC" "$SAN_FLAGS" > "$OUT/cc"
chmod +x "$OUT/cc"
echo "sanitize: building the extensions with $SAN_FLAGS"
# without pyproject.toml: the venv's setuptools (not pip's isolated build) reads only
# setup.py, whatever [project] says that it may not understand
mv "$SRC/pyproject.toml" "$OUT/pyproject.toml"
(cd "$SRC" && CC="$OUT/cc" "$PY" setup.py --quiet build_ext --inplace --force)
mv "$OUT/pyproject.toml" "$SRC/pyproject.toml"

echo "sanitize: pytest ${TESTS[*]}"
rc=0
(
    cd "$SRC"
    export LD_PRELOAD="$libasan $libubsan${LD_PRELOAD:+ $LD_PRELOAD}"
    export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:log_path=$LOGS/asan"
    export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
    export PYTHONMALLOC=malloc  # Python's objects in malloc'd blocks: ASan sees their bounds
    export SARP_SANITIZED_ROOT="$SRC"
    # --capture=sys: what the C runtimes write to fd 2 is not captured (and lost when a
    # sanitizer ends the process) but shown, and kept in pytest.log
    "$PY" -m pytest -q -p no:cacheprovider --capture=sys "${TESTS[@]}" 2>&1 \
        | tee "$LOGS/pytest.log"
    exit "${PIPESTATUS[0]}"
) || rc=$?

# ASan writes its reports to files (log_path); UBSan (gcc's libubsan) to stderr
reports=$(find "$LOGS" -type f -name 'asan*' -size +0c | sort)
if [[ -n $reports ]]; then
    for f in $reports; do
        echo "==== sanitizer report: $f" >&2
        cat "$f" >&2
    done
fi
if [[ -n $reports ]] || grep -Eq "$REPORT" "$LOGS/pytest.log"; then
    echo "sanitize: FAILED: a sanitizer reported (above; logs in $LOGS)" >&2
    exit 1
fi
if ((rc)); then
    echo "sanitize: FAILED: pytest exited $rc" >&2
    exit "$rc"
fi
echo "sanitize: passed, no sanitizer report"
