# Two commands for a newcomer:  `make demo` (the main job on the embedded default)  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test lint bench clean browser-deps

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

demo: setup
	$(VENV)/bin/tunecost demo

# Two workers on the 2-core machine; tests share one simulation cache in a temporary folder (tests/conftest.py).
test: setup
	$(PY) -m pytest -q -m "not gpu" -n 2

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
