#!/bin/bash -l
#PBS -A YOUR_PROJECT
#PBS -l select=2:system=polaris
#PBS -l place=scatter
#PBS -l walltime=01:00:00
#PBS -l filesystems=home:eagle
#PBS -q debug
#PBS -N harness-scaling
#PBS -k doe
#PBS -j oe
# A scaling study of the harness's backends on ALCF Polaris (PBS Pro, Cray PALS mpiexec, 4 A100 per
# node): every backend x node count in one allocation, through `harness sweep`, with everything the
# job produces in one directory (see submissions/common.sh for the layout). Submit from the kit:
#
#   qsub -A <project> submissions/polaris.sc                        # 1 and 2 nodes, weak scaling
#   qsub -A <project> -q debug-scaling -l select=8:system=polaris -l walltime=2:00:00 \
#        -v BACKENDS="ddp horovod",SCALING=strong,STEPS=500 submissions/polaris.sc
#
# Every #PBS line above can be overridden on qsub's command line. Settings go in with -v
# NAME=VALUE,NAME=VALUE (PBS splits -v at commas: separate list items with spaces). Defaults:
#   BACKENDS="ddp horovod deepspeed"   backends to compare (none = the 1-GPU baseline)
#   NODES="1 2 4 ..."                   node counts: powers of two up to the job's nodes, and all of them
#   RANKS=                              total rank counts instead (default: NODES x RANKS_PER_NODE)
#   SCALING=weak                        weak: BATCH_SIZE per GPU fixed; strong: GLOBAL_BATCH fixed
#   MODEL=resnet50 DATASET=synthetic    any `harness train --model/--dataset` (DATA_DIR for files)
#   BATCH_SIZE=256 GLOBAL_BATCH=        per rank (weak); global (strong, default BATCH_SIZE)
#   STEPS=300 EPOCHS=1000               optimizer steps per run (the epochs only bound them)
#   PRECISION=bf16 REPEATS=1            `--precision`; runs per configuration, interleaved
#   CHECKPOINT_EVERY=100                steps between checkpoints (and on the preemption signal)
#   TRAIN_ARGS="--channels-last"        any other `harness train` flags, for every run
#   TRACE_STEPS=10                      steps of each run whose per-rank timeline is recorded (notebook 03; 0: none)
#   PROCS_PER_GPU=1                     K > 1: K ranks per GPU (AccDP) under NVIDIA MPS
#   GPUS_PER_NODE=<nvidia-smi -L>       RANKS_PER_NODE=GPUS_PER_NODE x PROCS_PER_GPU
#   CORES_PER_NODE=32 DEPTH=            cores per rank for --depth/--cpu-bind depth (default 32 / ranks per node)
#   THREADS=DEPTH                       CPU threads per rank (OMP_NUM_THREADS and --threads)
#   PYTHON_ENV=site                     site: ALCF's conda module; venv: the kit's .venv (on top of it)
#   JOB_DIR=runs/polaris-<job id>       the job's directory; SWEEP_ID=<its name> tags the records
#   STOP_BEFORE_WALLTIME=300            seconds before the walltime at which the runs checkpoint
#   RESUBMIT=1 MAX_RESUBMISSIONS=10     then the job resubmits itself for the same JOB_DIR
#   RUN_TIMEOUT=3600 KIT_DIR=$PBS_O_WORKDIR
set -euo pipefail

cd "$PBS_O_WORKDIR"
KIT_DIR="${KIT_DIR:-$PBS_O_WORKDIR}"
if [[ ! -f "$KIT_DIR/submissions/common.sh" ]]; then
    echo "job: error: $KIT_DIR is not the kit's directory; qsub from it or pass -v KIT_DIR=/path/to/kit" >&2
    exit 2
fi
# shellcheck source=submissions/common.sh
source "$KIT_DIR/submissions/common.sh"
JOB_SCRIPT="${JOB_SCRIPT:-$KIT_DIR/submissions/polaris.sc}"
STUDY_SETTINGS+=(CORES_PER_NODE DEPTH STOP_BEFORE_WALLTIME)
job_begin pbs

# The site's software: ALCF's conda module brings CUDA, NCCL, torch, Horovod, DeepSpeed and mpi4py.
: "${PYTHON_ENV:=site}"
set +u  # Lmod and conda read unset variables
module use /soft/modulefiles
module load conda
if [[ "$PYTHON_ENV" == site ]]; then conda activate; fi
set -u
activate_python

# NCCL over Slingshot as ALCF recommends (recent conda modules set these already; values set
# before win). NCCL_NET names the aws-ofi-nccl plugin only where it is installed: NCCL refuses to
# start when the network it is told to use is missing.
export NCCL_NET_GDR_LEVEL="${NCCL_NET_GDR_LEVEL:-PHB}" NCCL_CROSS_NIC="${NCCL_CROSS_NIC:-1}"
export NCCL_COLLNET_ENABLE="${NCCL_COLLNET_ENABLE:-1}" FI_CXI_DISABLE_HOST_REGISTER="${FI_CXI_DISABLE_HOST_REGISTER:-1}"
export FI_MR_CACHE_MONITOR="${FI_MR_CACHE_MONITOR:-userfaultfd}" FI_CXI_DEFAULT_CQ_SIZE="${FI_CXI_DEFAULT_CQ_SIZE:-131072}"
AWS_OFI_NCCL_DIR="${AWS_OFI_NCCL_DIR:-/soft/libraries/aws-ofi-nccl/v1.9.1-aws}"
if [[ -d "$AWS_OFI_NCCL_DIR/lib" ]]; then
    export LD_LIBRARY_PATH="$AWS_OFI_NCCL_DIR/lib:/soft/libraries/hwloc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export NCCL_NET="${NCCL_NET:-AWS Libfabric}"
fi

: "${BACKENDS:=ddp horovod deepspeed}" "${MODEL:=resnet50}" "${DATASET:=synthetic}" "${BATCH_SIZE:=256}"
: "${STEPS:=300}" "${PRECISION:=bf16}" "${CHECKPOINT_EVERY:=100}" "${TRAIN_ARGS:=--channels-last}"
: "${PROCS_PER_GPU:=1}" "${GPUS_PER_NODE:=$(gpus_on_this_node)}" "${CORES_PER_NODE:=32}" "${STOP_BEFORE_WALLTIME:=300}"
if [[ -z "${RANKS_PER_NODE:-}" ]]; then
    ((GPUS_PER_NODE > 0)) || job_fail "no GPUs on this node (no nvidia-smi); pass -v RANKS_PER_NODE=N (and GPUS_PER_NODE=0) for a CPU run"
    RANKS_PER_NODE=$((GPUS_PER_NODE * PROCS_PER_GPU))
fi
: "${DEPTH:=$((CORES_PER_NODE / RANKS_PER_NODE > 0 ? CORES_PER_NODE / RANKS_PER_NODE : 1))}"
: "${THREADS:=$DEPTH}"

site_launch() {  # RANKS PPN NODES: PALS mpiexec, DEPTH cores per rank, one GPU per rank (reversed)
    LAUNCH=(mpiexec -n "$1" --ppn "$2" --depth "$DEPTH" --cpu-bind depth --env "OMP_NUM_THREADS=$THREADS"
            "$KIT_DIR/submissions/set_affinity_gpu_polaris.sh")
}

start_mps() {  # one daemon per node, for the whole study (PALS leaves it running after mpiexec ends)
    mpiexec -n "$ALLOCATED_NODES" --ppn 1 "$KIT_DIR/submissions/mps.sh" start
}

stop_mps() {
    mpiexec -n "$ALLOCATED_NODES" --ppn 1 "$KIT_DIR/submissions/mps.sh" stop
}

run_study
