# Two commands for a newcomer:  `make demo` (the main job on the embedded default)  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-long bench-tests lint bench clean browser-deps

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c constraints.txt -e '.[dev]'
	@# bytecode on every core (pip compiles on one); torch's one Python 3.12-only test file left out
	$(PY) -m compileall -q -j 0 -x 'torch/testing/_internal/py312_intrinsics\.py' $(VENV)/lib src > /dev/null
	touch $@

demo: setup
	$(VENV)/bin/tunecost demo

# Two workers on the 2-core machine; tests share one simulation cache in a temporary folder (tests/conftest.py).
# --dist loadgroup in collection order: the `slow` tests, sorted first, are handed out one at a time so both workers
# start on them; the rest go a module at a time (tests/conftest.py), so module fixtures and shared launches run once.
# (pytest stays below 9.2, where xdist's groups are lost: constraints.txt; tests/test_workers.py checks.)
# `long` tests (end-to-end runs, real multi-process launches, the full option sweep, the config-vs-flags pairs beyond
# one job per format, checks of generated files, the slowest single CLI runs) are left to `make test-long`;
# CI runs every test in one session: `make test TEST_MARKS="not gpu"` (.ci/run).
PYTEST := $(PY) -m pytest -q -n 2 --dist loadgroup --no-loadscope-reorder
TEST_MARKS ?= not gpu and not long

test: setup
	$(PYTEST) -m "$(TEST_MARKS)"

test-long: setup
	$(PYTEST) -m "long and not gpu"

# Seconds per test folder, one folder after another (benchmarks/bench_tests.py): recheck the split above.
bench-tests: setup
	$(PY) benchmarks/bench_tests.py

# Formatter check, linter, type checker and the import layers of docs/architecture.md (CI runs this before the tests).
lint: setup
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -q -p no:cacheprovider tests/test_architecture.py

# Headless Chromium for tests/report/test_browser.py (Debian's package); does nothing when it is installed.
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" -eq 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && \
	  $$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { echo "browser-deps: chromium still not found" >&2; exit 1; }

clean:
	rm -rf $(VENV) runs .pytest_cache
