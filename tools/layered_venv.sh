#!/usr/bin/env bash
# A venv layered on the site's Python (--system-site-packages: it sees the site's torch, DeepSpeed,
# mpi4py and NCCL and adds to them), with the kit and Horovod built against that torch with NCCL
# operations. For Polaris, where ALCF's conda module has no Horovod since 2025-10:
#
#   module use /soft/modulefiles; module load conda; conda activate    # the site's Python first
#   bash tools/layered_venv.sh .venv-polaris                          # on a compute node (GPU, nvcc)
#   qsub -v PYTHON_ENV=venv ... submissions/polaris.sc                 # jobs then activate it
#
# Usage: layered_venv.sh VENV. Horovod's build needs the NCCL the site's torch uses: set
# HOROVOD_NCCL_HOME to it when torch's own wheels do not bring one (tools/build_horovod.sh says so).
set -euo pipefail
VENV="${1:?usage: layered_venv.sh VENV (e.g. .venv-polaris)}"
KIT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
say() { printf '[layered-venv] %s\n' "$*"; }

python -c 'import torch' 2> /dev/null || { say "this python ($(command -v python)) has no torch: load the site's modules first"; exit 2; }
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV on top of $(command -v python)"
    python -m venv --system-site-packages "$VENV"
fi
# The kit without its dependencies: they are the site's, seen through --system-site-packages.
"$VENV/bin/python" -m pip install -q --no-deps -e "$KIT_DIR"
HOROVOD_GPU_OPERATIONS="${HOROVOD_GPU_OPERATIONS-NCCL}" bash "$KIT_DIR/tools/build_horovod.sh" "$VENV/bin/python"
"$VENV/bin/python" -c 'import horovod.torch as hvd; print("[layered-venv] Horovod", hvd.__version__, "mpi:", hvd.mpi_built(), "nccl:", bool(hvd.nccl_built()))'
say "done: submit with PYTHON_ENV=venv VENV=$VENV"
