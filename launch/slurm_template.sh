#!/bin/bash
# hybrid_jax on a SLURM GPU cluster: one task per node, each task drives that node's GPUs.
# jax.distributed reads SLURM's variables (coordinator = first node, process id = task rank), so the command
# carries no coordinator flags. Filled in and printed by `python launch/gpu.py slurm ... --dry-run`.
#SBATCH --job-name={job_name}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={gpus_per_node}
#SBATCH --cpus-per-task={cpus_per_task}
#SBATCH --time={time}
#SBATCH --output={log_dir}/%x-%j.out
{partition_line}
set -euo pipefail
cd {project_dir}
source .venv/bin/activate
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.9
srun python -m hybrid_jax {command}
