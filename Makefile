# sarp: `make run` serves the index on ./var/sarpd.sock; `make test` runs every check.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sarp-installed
DATA   ?= ./var

.PHONY: setup run test lint typecheck pytest clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes (the install is editable, so code
# changes need nothing).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

run: setup
	mkdir -p $(DATA)
	exec $(BIN)/sarpd --data-dir $(DATA) --socket $(DATA)/sarpd.sock --backend rocksdb

lint: setup
	$(BIN)/ruff check .

typecheck: setup
	$(BIN)/mypy

pytest: setup
	$(BIN)/pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
