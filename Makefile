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

# Benchmarks print ratios measured side by side in one run; run them on a quiet machine.
bench: setup
	@$(PY) benchmarks/throughput.py
	@$(PY) benchmarks/scaling.py
	@$(PY) benchmarks/data_path.py
	@$(PY) benchmarks/checkpoint.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
