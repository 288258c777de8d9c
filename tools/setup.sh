#!/usr/bin/env bash
# Idempotent set-up for a fresh machine: system MPI (and, as root, Slurm for the job-template tests),
# a virtual environment with torch, DeepSpeed, the workshop tools and the harness, and Horovod 0.28.1
# built from source against that torch. Each step is skipped when its result is already there.
# Run through `make setup`.
set -euo pipefail

VENV="${VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
# torch and torchvision: by default pip resolves a pair within pyproject.toml's range that also fits
# this machine's pip configuration (tools/install_torch.py); TORCH_SPEC / TORCHVISION_SPEC ask for
# other requirements, e.g. a pair that matches a site's CUDA driver.
SKIP_HOROVOD="${SKIP_HOROVOD:-0}"

say() { printf '[setup] %s\n' "$*"; }

# --- 1. system packages: OpenMPI (Horovod's MPI controller, mpi4py, mpirun tests) and cmake; ---
# as root also Slurm, munge and shellcheck, which the job-template tests use (they start their own
# slurmctld), and Chromium with its WebDriver for the JupyterLab browser test; a user without root
# gets those tests' clear error (or skip) instead.
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
[ -e /usr/include/x86_64-linux-gnu/mpi/mpi.h ] || [ -e /usr/include/mpi.h ] || command -v mpicc >/dev/null \
  || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
if [ "$(id -u)" = 0 ]; then
  command -v slurmctld >/dev/null || missing+=(slurmctld slurmd slurm-client munge)
  command -v shellcheck >/dev/null || missing+=(shellcheck)
  command -v chromium >/dev/null || missing+=(chromium)
  command -v chromedriver >/dev/null || missing+=(chromium-driver)
elif ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  say "tests/notebooks/test_lab_browser.py is skipped without a browser: sudo apt-get install chromium chromium-driver"
fi
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "missing system packages: ${missing[*]}"
    say "install them first, e.g.: sudo apt-get install ${missing[*]}  (or 'module load' your site's MPI)"
    exit 2
  fi
fi

# --- 2. virtual environment with torch and the harness ---
[ -x "$VENV/bin/python" ] || { say "creating $VENV"; "$PYTHON" -m venv "$VENV"; }
PY="$VENV/bin/python"
PIP=("$PY" -m pip install -q --disable-pip-version-check)
if ! "$PY" -c "import torch, torchvision" 2>/dev/null; then
  "${PIP[@]}" --upgrade pip wheel setuptools
  "$PY" tools/install_torch.py
fi
stamp="$VENV/.harness-installed"
if [ ! -e "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing the harness with its extras"
  "${PIP[@]}" -e ".[all]"
  touch "$stamp"
fi

# --- 3. Horovod, built from its sdist against this torch and cached by torch version ---
if [ "$SKIP_HOROVOD" = 1 ]; then
  say "SKIP_HOROVOD=1: not building Horovod"
elif "$PY" -c "import horovod.torch" 2>/dev/null; then
  say "Horovod already importable"
else
  PATH="$PWD/$VENV/bin:$PATH" bash tools/build_horovod.sh "$PY"
fi

if [ "$SKIP_HOROVOD" != 1 ]; then
  "$VENV/bin/horovodrun" --check-build | sed 's/^/[setup] /'
fi
# (DeepSpeed logs its accelerator choice on stdout at import: keep the last line, ours.)
say "ready: $("$PY" -c 'import torch, deepspeed; print("torch", torch.__version__, "| deepspeed", deepspeed.__version__)' 2>/dev/null | tail -n 1)"
