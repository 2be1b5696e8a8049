#!/usr/bin/env bash
# Per-node launcher: run by `srun` once per node (one task per node); starts torchrun,
# which starts one process per GPU (or $NPROC_PER_NODE processes on CPU nodes).
#
#   srun --ntasks-per-node=1 scripts/slurm/launch.sh train --config mixtral_2gpu
#
# Arguments go to `python -m moe_backend.cli` (train, train-bench, bench, selftest).
# Rendezvous comes from Slurm: the first node of the job hosts torchrun's c10d store on
# $MASTER_PORT (default: 20000 + job id mod 20000, so jobs sharing a node do not collide).
# Environment knobs: NPROC_PER_NODE, MASTER_PORT, PYTHON (default: the repo's .venv),
# MOE_BACKEND_NVSHMEM_PRESET (nvlink | ib | ibgda | efa | none; default nvlink on one
# node, ib on several).
set -euo pipefail
: "${SLURM_JOB_ID:?launch.sh runs inside a Slurm allocation (sbatch/salloc + srun)}"
ROOT=${MOE_BACKEND_ROOT:-${SLURM_SUBMIT_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}}
cd "$ROOT"
PYTHON=${PYTHON:-$ROOT/.venv/bin/python}

nnodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
node_rank=${SLURM_NODEID:-0}
master=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-$(hostname -s)}" | head -n1)
[ "$nnodes" -gt 1 ] || master=127.0.0.1  # one node: no name resolution needed
port=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}

if [ -z "${NPROC_PER_NODE:-}" ]; then
  gpus=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  NPROC_PER_NODE=$(( gpus > 0 ? gpus : 1 ))
fi
if [ -z "${MOE_BACKEND_NVSHMEM_PRESET:-}" ]; then
  MOE_BACKEND_NVSHMEM_PRESET=$([ "$nnodes" -gt 1 ] && echo ib || echo nvlink)
fi
# shellcheck source=scripts/slurm/nvshmem_env.sh
source "$ROOT/scripts/slurm/nvshmem_env.sh" "$MOE_BACKEND_NVSHMEM_PRESET"

echo "[launch] job $SLURM_JOB_ID node $node_rank/$nnodes on $(hostname -s): $NPROC_PER_NODE procs," \
     "rendezvous $master:$port, nvshmem preset $MOE_BACKEND_NVSHMEM_PRESET"
exec "$PYTHON" -m torch.distributed.run \
  --nnodes "$nnodes" --node-rank "$node_rank" --nproc-per-node "$NPROC_PER_NODE" \
  --rdzv-backend c10d --rdzv-endpoint "$master:$port" --rdzv-id "$SLURM_JOB_ID" \
  --max-restarts 0 \
  -m moe_backend.cli "$@"
