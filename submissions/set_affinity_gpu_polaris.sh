#!/bin/bash
# GPU affinity on Polaris, run by every rank in front of its program (mpiexec ... set_affinity_gpu_polaris.sh
# python ...): each rank sees one GPU, chosen from its node-local rank as ALCF does, in reverse
# order (the CPU cores --cpu-bind depth gives low local ranks sit closest to the highest-numbered
# GPU): gpu = GPUS_PER_NODE - 1 - (PMI_LOCAL_RANK / PROCS_PER_GPU) % GPUS_PER_NODE. With
# PROCS_PER_GPU = K, K consecutive local ranks share a GPU (under MPS). Without GPUs
# (GPUS_PER_NODE=0) it changes nothing.
set -euo pipefail

gpus="${GPUS_PER_NODE:-4}"
procs_per_gpu="${PROCS_PER_GPU:-1}"
if ((gpus > 0)); then
    local_rank="${PMI_LOCAL_RANK:-${PALS_LOCAL_RANKID:?run me under mpiexec: PMI_LOCAL_RANK is not set}}"
    CUDA_VISIBLE_DEVICES=$((gpus - 1 - (local_rank / procs_per_gpu) % gpus))
    export CUDA_VISIBLE_DEVICES
fi
exec "$@"
