# Two commands for a newcomer:  `make demo` (the main job on the embedded default)  and  `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

demo: setup
	$(VENV)/bin/tunecost demo

test: setup
	$(PY) -m pytest -q -m "not gpu"

clean:
	rm -rf $(VENV) runs .pytest_cache
