#!/bin/bash -l
#PBS -l select=2:system=polaris
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -l filesystems=home:eagle
#PBS -q debug
#PBS -N harness-scaling
#PBS -k doe
#PBS -j oe
# A scaling study of the harness's backends on ALCF Polaris (PBS Pro, PALS mpiexec, 4 A100 per
# node): every backend x node count in one allocation, all of it in JOB_DIR. The logic is
# `harness study --site polaris` (harness/study/, the site in harness/study/sites/polaris.json).
# From the kit, on a login node: check first (it loads the job's software, as below), then submit:
#
#   bash -l submissions/polaris.sc --check -- -A <project>                 # judge, queue nothing
#   bash -l submissions/polaris.sc --smoke -- -A <project>                 # the night before: a 10-minute debug job
#   bash -l submissions/polaris.sc --submit -- -A <project> -q debug-scaling \
#        -l select=8:system=polaris -v BACKENDS="ddp deepspeed",SCALING=strong   # check, then qsub
#
# Settings are qsub -v NAME=VALUE,... (list items separated by spaces): BACKENDS NODES RANKS SCALING
# MODEL DATASET DATA_DIR BATCH_SIZE STEPS PRECISION TRAIN_ARGS PROCS_PER_GPU JOB_DIR RESUBMIT ...
# (harness/study/jobs/settings.py). Software: ALCF's conda module (conda/2025-09-25: PyTorch, DeepSpeed,
# NCCL, mpi4py; no Horovod since 2025-10); -v PYTHON_ENV=venv adds a venv layered on it
# (VENV, default .venv-polaris, made by tools/layered_venv.sh, which builds Horovod with NCCL).
# NCCL over Slingshot uses ALCF's aws-ofi-nccl plugin, found before any run (--check says so on a
# login node); -v NCCL_NET_PLUGIN=off runs without it, as ALCF advises where DeepSpeed hangs.
set -euo pipefail

KIT_DIR="${KIT_DIR:-${PBS_O_WORKDIR:-$(cd "$(dirname "$0")/.." && pwd)}}"
if [[ ! -f "$KIT_DIR/harness/study/jobs/job.py" ]]; then
    echo "job: error: $KIT_DIR is not the kit; qsub from it or pass -v KIT_DIR=/path/to/kit" >&2
    exit 2
fi
export KIT_DIR

# shellcheck source=submissions/load_modules.sh
source "$KIT_DIR/submissions/load_modules.sh"

set +u  # Lmod and conda read unset variables
module use /soft/modulefiles
load_modules conda
conda activate
if [[ "${PYTHON_ENV:-conda}" == venv ]]; then
    VENV="${VENV:-$KIT_DIR/.venv-polaris}"
    if [[ ! -f "$VENV/bin/activate" ]]; then
        echo "job: error: no venv $VENV; make it with \`bash tools/layered_venv.sh $VENV\` on a compute node" >&2
        exit 2
    fi
    # shellcheck source=/dev/null
    source "$VENV/bin/activate"
fi
set -u
export PYTHONPATH="$KIT_DIR${PYTHONPATH:+:$PYTHONPATH}"

exec python -m harness study --site polaris --script "$0" "$@"
