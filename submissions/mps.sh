#!/bin/bash
# NVIDIA MPS (Multi-Process Service) for several ranks per GPU (PROCS_PER_GPU > 1, AccDP): without
# it, processes sharing a GPU take turns on it instead of running their kernels side by side.
# The job templates export CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY, per job and on the
# node's local disk (pipes do not work on a shared file system), and run:
#
#   mps.sh start        once per node before the runs (Polaris: mpiexec -n NODES --ppn 1 mps.sh start)
#   mps.sh stop         once per node after them (`quit` waits until the daemon's clients are gone)
#   mps.sh wrap CMD...  as every rank's command (Slurm ends a step's processes when the step ends,
#                       so there the daemon lives for one run): the node's local rank 0 starts the
#                       daemon, every rank waits until it answers, runs CMD, and local rank 0 stops it.
set -euo pipefail

: "${CUDA_MPS_PIPE_DIRECTORY:?the job template sets CUDA_MPS_PIPE_DIRECTORY (per job, node-local)}"
: "${CUDA_MPS_LOG_DIRECTORY:?the job template sets CUDA_MPS_LOG_DIRECTORY (per job, node-local)}"
READY_TIMEOUT_S=60

start_daemon() {
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
}

stop_daemon() {
    echo quit | nvidia-cuda-mps-control
}

wait_until_ready() {  # a CUDA process that finds no daemon runs without MPS, silently
    local waited=0
    until echo get_server_list | nvidia-cuda-mps-control > /dev/null 2>&1; do
        ((waited < READY_TIMEOUT_S * 10)) || { echo "mps.sh: the MPS daemon on $(hostname) did not answer within ${READY_TIMEOUT_S} s; see $CUDA_MPS_LOG_DIRECTORY/control.log" >&2; exit 1; }
        sleep 0.1
        waited=$((waited + 1))
    done
}

case "${1:-}" in
    start)
        start_daemon
        wait_until_ready
        echo "mps.sh: MPS daemon running on $(hostname) (pipes in $CUDA_MPS_PIPE_DIRECTORY)" ;;
    stop)
        stop_daemon ;;
    wrap)
        shift
        local_rank="${SLURM_LOCALID:-${PMI_LOCAL_RANK:-${OMPI_COMM_WORLD_LOCAL_RANK:-0}}}"
        if ((local_rank == 0)); then start_daemon; fi
        wait_until_ready
        status=0
        "$@" || status=$?
        if ((local_rank == 0)); then stop_daemon; fi
        exit "$status" ;;
    *)
        echo "usage: mps.sh start | stop | wrap COMMAND..." >&2
        exit 2 ;;
esac
