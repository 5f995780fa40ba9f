"""The Slurm backend: one job holds the allocation, every task is a step in it (``srun``)."""

from tfplan.backends.slurm.backend import SlurmBackend

__all__ = ["SlurmBackend"]
