VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast bench clean
setup:
	@bash tools/setup.sh

demo: setup
	@$(PY) -m harness demo

test: setup
	@$(PY) -m pytest -q -ra tests

test-fast: setup
	@$(PY) -m pytest -q -ra -m "not slow" tests

bench: setup
	@$(PY) benchmarks/throughput.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
