#!/usr/bin/env bash
# `make fuzz`: coverage-guided fuzzing (atheris, libFuzzer) of every C extension against
# its Python/numpy reference: each harness tests/fuzz/test_fuzz_*.py runs as
# `python -m tests.fuzz.<name>` for an equal share of SECONDS, on the in-place build.
#
# The C extensions carry no libFuzzer coverage (that needs clang's
# -fsanitize=fuzzer-no-link; gcc has no equivalent): libFuzzer steers by the Python
# coverage of the harnesses and the references. Nor do they run under ASan here: with
# gcc's libasan preloaded, libasan's own coverage hooks take the place of libFuzzer's
# and the fuzzer runs blind; `make sanitize` replays the same harnesses under ASan.
#
# A finding (a disagreement with the reference, an unclean exception, a crash) stops
# the run, fails it, and leaves its input in build/fuzz/crashes/ (rerun it:
# `python -m tests.fuzz.<name> build/fuzz/crashes/<file>`). Each harness's corpus
# grows in build/fuzz/corpus/<name> from run to run.
#
# usage: tools/ci/fuzz.sh [PYTHON] [SECONDS]   (default: .venv/bin/python 60)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=$(realpath -s "${1:-.venv/bin/python}")  # -s: the venv's own link, not its target
TOTAL=${2:-60}
OUT=build/fuzz

"$PY" -c 'import atheris' 2>/dev/null || {
    echo "fuzz: atheris is not installed in $PY (the dev extra: pip install -e '.[dev]')" >&2
    exit 1
}
# a harness whose extension did not load tests nothing: refuse to run blind
"$PY" -c '
import sys
from sarpd.core import native
missing = [p for p, want in native.expected().items() if want and not native.status()[p]]
if missing:
    sys.exit(f"fuzz: native paths {missing} did not load: build them (make setup)")
if not any(native.status().values()):
    sys.exit("fuzz: no C extension loaded (SARPD_NO_EXTENSIONS=1, or no C compiler)")
'
harnesses=(tests/fuzz/test_fuzz_*.py)
each=$((TOTAL / ${#harnesses[@]}))
((each >= 1)) || each=1
mkdir -p "$OUT/crashes"
echo "fuzz: ${#harnesses[@]} harnesses, ${each}s each (C extensions uninstrumented: Python coverage)"
for path in "${harnesses[@]}"; do
    name=$(basename "$path" .py)
    mkdir -p "$OUT/corpus/$name"
    log=$OUT/$name.log
    if "$PY" -m "tests.fuzz.$name" -max_total_time="$each" -timeout=60 -print_final_stats=1 \
            -artifact_prefix="$OUT/crashes/$name-" "$OUT/corpus/$name" >"$log" 2>&1; then
        runs=$(grep -Eo '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -Eo '[0-9]+$' || true)
        cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1 || true)
        echo "fuzz: $name: ${runs:-?} inputs, ${cov:-cov: ?} (Python edges), no finding"
    else
        tail -n 60 "$log" >&2
        echo "fuzz: FAILED: $name found a problem (log: $log; inputs: $OUT/crashes/)" >&2
        exit 1
    fi
done
echo "fuzz: passed"
