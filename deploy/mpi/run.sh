#!/usr/bin/env bash
# k3 serve with its experts spread over the hosts of deploy/mpi/hosts (docs/SCALE.md, "Several
# machines (MPI)"). Every host needs the same k3 build (Open MPI found at build time), the
# checkpoint at MODEL (the same path on each) and passwordless ssh from this one; the
# activations go over the transport Open MPI picks (TCP, shared memory, UCX/RDMA).
#   deploy/mpi/run.sh [HOSTFILE] [MODEL] [k3 serve flags...]
set -euo pipefail
hosts=${1:-"$(dirname "$0")/hosts"}
model=${2:-/mnt/nvme/kimi-k3}
shift $(($# < 2 ? $# : 2))
ranks=$(grep -cEv '^[[:space:]]*(#|$)' "$hosts")
# --map-by node: one rank a host, in the hostfile's order (rank 0 on its first line).
# --bind-to none: each rank starts its own compute threads over all of its host's cores.
exec mpirun -np "$ranks" --hostfile "$hosts" --map-by node --bind-to none \
  k3 serve --model "$model" --host 0.0.0.0 --port 8000 --ram-gb 400 "$@"
