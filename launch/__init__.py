"""Launchers: one node, hostfile multi-node, Slurm (sbatch generation, arrays, preemption requeue)."""
