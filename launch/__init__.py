"""Launchers: one node, hostfile multi-node, Slurm (sbatch generation, arrays, preemption requeue), and the whole
pipeline as one command (`make demo`; the data path on Slurm arrays or a Ray cluster)."""
