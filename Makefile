VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast lab exercises gpu-check bench clean
setup:
	@bash tools/setup.sh

demo: setup
	@$(PY) -m harness demo

# Everything, slow multi-process tests, notebooks and scheduler tests included (not the GPU ones):
# first on TEST_WORKERS pytest-xdist workers, a file per worker at a time, the longest first
# (tests/conftest.py); then, one at a time, the tests marked
# `alone`, which measure time or machine-wide state. Both parts always run; either failing fails.
TEST_WORKERS ?= 2
test: setup
	@$(PY) -m pytest -q -ra --durations=40 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not gpu and not alone" tests; \
	shared=$$?; $(PY) -m pytest -q -ra --durations=10 -m "alone and not gpu" tests; alone=$$?; \
	[ $$shared -eq 0 ] && [ $$alone -eq 0 ]

test-fast: setup
	@$(PY) -m pytest -q -ra -m "not slow and not gpu" tests

# JupyterLab from the kit's environment on notebooks/: a browser opens here; on a remote node
# `make lab REMOTE=1` (or LAB_IP=..., LAB_PORT=...) prints the URL and the ssh tunnel (tools/lab.sh).
lab: setup
	@VENV="$(VENV)" bash tools/lab.sh

# Regenerate exercises/ from solutions/ (a test fails when they differ). Attendees' copies live in
# my-exercises/ (`harness exercise start 02`), which this never touches.
exercises: setup
	@$(PY) tools/make_exercises.py

# On a GPU node: the GPU tests and the GPU benchmarks, in one command.
gpu-check: setup
	@bash tools/gpu_check.sh $(ARGS)

# Benchmarks print ratios measured side by side in one run; run them on a quiet machine.
bench: setup
	@$(PY) benchmarks/throughput.py
	@$(PY) benchmarks/scaling.py
	@$(PY) benchmarks/data_path.py
	@$(PY) benchmarks/checkpoint.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
