VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test test-fast lint lab exercises gpu-check bench docs docs-figure clean
setup:
	@bash tools/setup.sh

demo: setup
	@$(PY) -m harness demo

# The test tiers, one directory each: in-process; real launchers and several processes; Slurm and
# emulated PBS; the notebooks and the lab in a browser; nodes as network namespaces.
# tests/test_architecture.py checks that every test module is in one of them.
TIERS := tests/unit tests/integration tests/scheduler tests/notebooks tests/multinode

# Everything but the GPU tests, in two passes; both run, and either failing fails the target. First
# two lanes side by side (pytest-xdist): run one at a time, the tests keep about 1.2 of 2 cores busy
# (a launcher and each rank start up one after another). Each test file runs whole in one lane, so a
# module's fixture is made once; the cluster tiers share one lane, and the lanes take the longest
# files first (tests/conftest.py; --no-loadscope-reorder keeps xdist from ordering them by their
# number of tests). Then, one at a time, the tests marked `alone`: they time themselves, read
# machine-wide load or pin cores, so nothing may run beside them.
test: setup lint
	@status=0; \
	$(PY) -m pytest -q -ra -n 2 --dist loadfile --no-loadscope-reorder --durations=20 \
		-m "not gpu and not alone" tests/test_architecture.py $(TIERS) || status=$$?; \
	$(PY) -m pytest -q -ra --durations=20 -m "not gpu and alone" $(TIERS) || status=$$?; \
	exit $$status

# Lint and format check (ruff, configured in pyproject.toml); `make test` runs it first.
lint: setup
	@$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# The inner loop: the in-process tier, which starts no process (tests/unit/conftest.py fails a test that does).
test-fast: setup
	@$(PY) -m pytest -q -ra tests/test_architecture.py tests/unit

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
	@$(PY) benchmarks/heartbeat.py

# The documentation site (MkDocs, Material theme) into build/site; --strict makes a broken link or a
# page missing from the nav an error. Offline: no plugin downloads anything.
docs: setup
	@NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir build/site

# Redraw the figure the README and docs/ show from the committed study docs/results/weak-scaling.jsonl.
docs-figure: setup
	@$(PY) tools/docs_figure.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
