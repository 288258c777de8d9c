#!/bin/bash -l
#PBS -l select=2
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -l filesystems=home:flare
#PBS -q debug
#PBS -N harness-scaling
#PBS -k doe
#PBS -j oe
# A scaling study of the harness's backends on ALCF Aurora (PBS Pro, PALS mpiexec, 6 Intel GPU Max
# 1550 per node = 12 tiles, one rank each): every backend x node count in one allocation, all of it
# in JOB_DIR (put it under /lus/flare/projects/<project>). The logic is `harness study --site
# aurora` (harness/study/, the site in harness/study/sites/aurora.json). From the kit, on a login
# node: check first (it loads the job's software, as below), then submit:
#
#   bash -l submissions/aurora.sc --check -- -A <project>                  # judge, queue nothing
#   bash -l submissions/aurora.sc --smoke -- -A <project>                  # the night before: a 10-minute debug job
#   bash -l submissions/aurora.sc --submit -- -A <project> -q debug-scaling \
#        -l select=8 -v BACKENDS="ddp fsdp",JOB_DIR=/lus/flare/projects/<project>/study
#
# Settings are qsub -v NAME=VALUE,... (list items separated by spaces): BACKENDS NODES RANKS SCALING
# MODEL DATASET DATA_DIR BATCH_SIZE STEPS PRECISION TRAIN_ARGS JOB_DIR RESUBMIT ...
# (harness/study/jobs/settings.py). Software: ALCF's frameworks module, pinned (FRAMEWORKS_MODULE,
# default frameworks/2025.3.1: PyTorch with XPU and the xccl process group, DeepSpeed; no Horovod;
# the pin and its source in harness/study/sites/aurora.json); submit with -v, never -V (ALCF's
# known issues: -V can abort the start-up); -v PYTHON_ENV=venv adds a venv layered on it (VENV,
# default .venv-aurora: `python -m venv --system-site-packages` after `module load frameworks`,
# then `pip install --no-deps -e .` into it).
set -euo pipefail

KIT_DIR="${KIT_DIR:-${PBS_O_WORKDIR:-$(cd "$(dirname "$0")/.." && pwd)}}"
if [[ ! -f "$KIT_DIR/harness/study/jobs/job.py" ]]; then
    echo "job: error: $KIT_DIR is not the kit; qsub from it or pass -v KIT_DIR=/path/to/kit" >&2
    exit 2
fi
export KIT_DIR

# shellcheck source=submissions/load_modules.sh
source "$KIT_DIR/submissions/load_modules.sh"

set +u  # Lmod reads unset variables
module use /soft/modulefiles
load_modules "${FRAMEWORKS_MODULE:-frameworks/2025.3.1}"
if [[ "${PYTHON_ENV:-frameworks}" == venv ]]; then
    VENV="${VENV:-$KIT_DIR/.venv-aurora}"
    if [[ ! -f "$VENV/bin/activate" ]]; then
        echo "job: error: no venv $VENV; make it after \`module load frameworks\` with \`python -m venv --system-site-packages $VENV\`" >&2
        exit 2
    fi
    # shellcheck source=/dev/null
    source "$VENV/bin/activate"
fi
set -u
export PYTHONPATH="$KIT_DIR${PYTHONPATH:+:$PYTHONPATH}"

exec python -m harness study --site aurora --script "$0" "$@"
