#!/bin/bash
# One rank of the emulated PALS mpiexec: turns OpenMPI's rank variables into the ones Cray PALS
# sets, removes OpenMPI's (OMPI_COMM_WORLD_*) so that discovery sees PALS's only, and keeps
# PMIX_* and OMPI_MCA_* so that MPI itself still starts. Ranks fill nodes --ppn at a time.
set -euo pipefail

rank="$OMPI_COMM_WORLD_RANK"
size="$OMPI_COMM_WORLD_SIZE"
ppn="$PALS_PPN"
node=$((rank / ppn))
on_this_node=$((size - node * ppn))
export PMI_RANK="$rank" PMI_SIZE="$size" PMI_LOCAL_RANK=$((rank % ppn))
export PMI_LOCAL_SIZE=$((on_this_node < ppn ? on_this_node : ppn))
export PALS_RANKID="$rank" PALS_LOCAL_RANKID="$PMI_LOCAL_RANK" PALS_NODEID="$node" PALS_LOCAL_SIZE="$PMI_LOCAL_SIZE"
while read -r name; do
    unset "$name"
done < <(compgen -e OMPI_COMM_WORLD_)
exec "$@"
