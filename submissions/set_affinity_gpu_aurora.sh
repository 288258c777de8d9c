#!/bin/bash
# GPU affinity on Aurora, run by every rank in front of its program (mpiexec ... set_affinity_gpu_aurora.sh
# python ...): each rank sees one GPU tile. ALCF's frameworks module exposes the 12 tiles of a node
# as devices (ZE_FLAT_DEVICE_HIERARCHY=FLAT), so the mask is a tile index, in natural order: the
# --cpu-bind list puts local ranks 0-5 on socket 0, next to GPUs 0-2 (tiles 0-5).
# tile = (PALS_LOCAL_RANKID / PROCS_PER_GPU) % GPUS_PER_NODE; without GPUs (GPUS_PER_NODE=0) it
# changes nothing.
set -euo pipefail

tiles="${GPUS_PER_NODE:-12}"
procs_per_gpu="${PROCS_PER_GPU:-1}"
if ((tiles > 0)); then
    local_rank="${PALS_LOCAL_RANKID:-${PMI_LOCAL_RANK:?run me under mpiexec: PALS_LOCAL_RANKID is not set}}"
    ZE_AFFINITY_MASK=$(((local_rank / procs_per_gpu) % tiles))
    export ZE_AFFINITY_MASK
fi
exec "$@"
