#!/bin/bash
# The Python that submissions/frontier.sbatch runs on OLCF Frontier, made as OLCF's PyTorch guide
# makes it (olcf/olcf-user-docs, software/analytics/pytorch_frontier.rst, revised 2026-07-07): the
# programming environment, miniforge3 and the ROCm module; a conda environment with Python 3.12 from
# conda-forge; torch and torchvision from the PyTorch wheel index of the module's ROCm; DeepSpeed
# (a default backend of the study); mpi4py built against Cray MPICH (MPICC="cc -shared",
# --no-binary=mpi4py, with ROCm unloaded for the build, as the guide's "Optional: install mpi4py");
# then the kit. Run it once, on a login node (pip needs the network):
#
#   bash tools/setup_frontier.sh [ENV]      # ENV default $KIT_DIR/.conda-frontier
#   sbatch -A <project> submissions/frontier.sbatch     # PYTHON_ENV=conda CONDA_ENV=ENV (defaults)
#
# Put ENV on Orion rather than in an NFS home (the guide: "NVMe > Orion >> NFS"), e.g.
# /lustre/orion/<project>/proj-shared/$USER/harness-env, and pass it as CONDA_ENV. The versions
# are the profile's pins (harness/study/sites/frontier.json), each with its source; FRONTIER_MODULES,
# TORCH_SPEC and DEEPSPEED_SPEC choose others.
set -euo pipefail

KIT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ENV_DIR="${1:-$KIT_DIR/.conda-frontier}"
MODULES="${FRONTIER_MODULES:-PrgEnv-gnu/8.7.0 cpe/26.03 miniforge3/23.11.0-0 rocm/7.1.1 craype-accel-amd-gfx90a}"
TORCH_INDEX=https://download.pytorch.org/whl/rocm7.1
TORCH_SPEC="${TORCH_SPEC:-torch==2.10.0 torchvision==0.25.0}"
DEEPSPEED_SPEC="${DEEPSPEED_SPEC:-deepspeed}"
say() { printf '[setup-frontier] %s\n' "$*"; }

if ! command -v module > /dev/null 2>&1; then
    say "no \`module\` command: run this on a Frontier login node, in a login shell (bash -l)"
    exit 2
fi
read -ra modules <<< "$MODULES"
set +u  # Lmod and conda read unset variables
for name in "${modules[@]}"; do
    if ! module load "$name"; then
        say "\`module load $name\` failed; \`module avail ${name%%/*}\` lists what Frontier has (set FRONTIER_MODULES)"
        exit 2
    fi
done
# The guide, for a non-default CPE: Cray's libraries before the ones the modules put first.
export LD_LIBRARY_PATH="${CRAY_LD_LIBRARY_PATH:-}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ ! -x "$ENV_DIR/bin/python" ]]; then
    say "creating $ENV_DIR (Python 3.12 from conda-forge)"
    conda create -y -p "$ENV_DIR" python=3.12 -c conda-forge
fi
conda activate "$ENV_DIR"
set -u
pip=(python -m pip install --disable-pip-version-check)
read -ra torch_spec <<< "$TORCH_SPEC"
say "torch and torchvision from $TORCH_INDEX"
"${pip[@]}" "${torch_spec[@]}" --index-url "$TORCH_INDEX"
"${pip[@]}" "$DEEPSPEED_SPEC"
# mpi4py against Cray MPICH. The guide unloads ROCm for the build (a non-GPU-aware MPI: the kit
# passes no GPU buffers to MPI) and the job loads it again; `cc` is the PE's compiler wrapper.
set +u
module unload craype-accel-amd-gfx90a
module unload rocm
set -u
say "mpi4py built against Cray MPICH (MPICC=\"cc -shared\")"
MPICC="cc -shared" "${pip[@]}" --no-cache-dir --no-binary=mpi4py mpi4py
# The kit last: torch and torchvision are already there, so pip keeps the ROCm wheels.
"${pip[@]}" -e "$KIT_DIR"
say "done: $ENV_DIR; the job activates it (PYTHON_ENV=conda, CONDA_ENV=$ENV_DIR)"
