# sarp: `make run` serves the index on ./var/sarpd.sock; `make test` runs every check.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sarp-installed
WT_STAMP := $(VENV)/.sarp-wiredtiger
WT_SHIM  := $(VENV)/wt-build-bin
DATA   ?= ./var

.PHONY: setup setup-wt run test lint imports typecheck pytest sanitize fuzz clean

setup: $(STAMP)

# Re-installs only when pyproject.toml, setup.py or a C extension change (the
# install is editable, so Python changes need nothing); compiles the modules to
# bytecode as a regular install does (sarpd then starts without compiling them, also
# where PYTHONDONTWRITEBYTECODE is set); then says which paths run natively (pip
# hides setup.py's own output).
$(STAMP): pyproject.toml setup.py sarpd/core/verify/_cverify.c sarpd/core/_chash.c sarpd/core/_cmatch.c sarpd/core/_cwrite.c \
		sarpd/core/_cmap.c sarpd/core/csrc/blockmap.c sarpd/core/csrc/blockmap.h \
		sarpd/core/csrc/sarp.h sarpd/core/csrc/segment.c sarpd/core/csrc/segment.h \
		sarpd/core/csrc/holders.c sarpd/core/csrc/holders.h \
		sarpd/core/csrc/rounds.c sarpd/core/csrc/rounds.h \
		sarpd/core/csrc/segcache.c sarpd/core/csrc/segcache.h \
		sarpd/core/_cdir.c sarpd/core/csrc/directory.c sarpd/core/csrc/directory.h
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	$(BIN)/python -m compileall -q sarpd backends bloomstore tools
	$(BIN)/python -c 'from sarpd.core import native; print(native.summary())'
	@echo 'installed in $(VENV): run `. $(VENV)/bin/activate` to put sarpd and sarpctl on PATH'
	touch $(STAMP)

# The wiredtiger backend's engine (optional: `make run` on rocksdb does not need it),
# built from source: ~2.5 min on 2 cores, needs swig, cmake, ninja and a C compiler.
# Its setup.py configures WiredTiger without a build type, which WiredTiger turns into
# a Debug build (-Og; diagnostics: any panic aborts the process) and it passes only
# PATH to cmake, so a cmake shim first on PATH asks for Release. An installed Debug
# build is rebuilt.
setup-wt: $(WT_STAMP)

$(WT_STAMP): $(STAMP)
	@for tool in cmake swig ninja cc; do command -v $$tool >/dev/null || { \
	    echo "wiredtiger: $$tool not found (Debian: cmake swig ninja-build build-essential)" >&2; \
	    exit 1; }; done
	mkdir -p $(WT_SHIM)
	printf '#!/bin/sh\nexec %s -DCMAKE_BUILD_TYPE=Release "$$@"\n' "$$(command -v cmake)" > $(WT_SHIM)/cmake
	chmod +x $(WT_SHIM)/cmake
	$(BIN)/python -c 'import sys, wiredtiger; sys.exit(wiredtiger.diagnostic_build())' 2>/dev/null \
	    || PATH="$(abspath $(WT_SHIM)):$$PATH" $(BIN)/python -m pip install --quiet \
	        --disable-pip-version-check --no-cache-dir --no-deps --force-reinstall 'wiredtiger>=11.3'
	$(BIN)/python -c 'import sys, wiredtiger; sys.exit(wiredtiger.diagnostic_build())'
	touch $(WT_STAMP)

run: setup
	mkdir -p $(DATA)
	exec $(BIN)/sarpd --data-dir $(DATA) --socket $(DATA)/sarpd.sock --backend rocksdb

lint: setup
	$(BIN)/ruff check .

# The rooms' arrows and the leaves (pyproject.toml [tool.importlinter]).
imports: setup
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# The suite runs on the native paths when they are built; the exactness, holder and
# block id tests run a second time on the references (numpy verifier, Python match
# path, Python hashing).
pytest: setup setup-wt
	$(BIN)/pytest -q
	SARPD_NO_EXTENSIONS=1 $(BIN)/pytest -q tests/core/test_verify.py tests/core/test_index.py \
	    tests/core/test_branchy.py tests/core/test_holders_index.py -k "memory or verify or holder"
	SARPD_NO_EXTENSIONS=1 $(BIN)/pytest -q tests/core/test_ids.py tests/core/test_chash.py

test: lint imports typecheck pytest

# The native tests (and the fuzz harnesses' replays) under ASan + UBSan: every C
# extension of setup.py built with the sanitizers in a copy of the tree
# (build/sanitize/src; the in-place build is left alone), run there with the
# compiler's libasan/libubsan preloaded; fails on any sanitizer report
# (tools/ci/sanitize.sh; ~3 min on 2 cores).
sanitize: setup
	tools/ci/sanitize.sh $(BIN)/python

# Coverage-guided fuzzing (atheris) of every C extension against its reference, the
# harnesses of tests/fuzz sharing FUZZ_SECONDS (tools/ci/fuzz.sh; findings are left
# in build/fuzz/crashes).
FUZZ_SECONDS ?= 60
fuzz: setup
	tools/ci/fuzz.sh $(BIN)/python $(FUZZ_SECONDS)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
