"""Transports: how tfplan runs POSIX sh scripts and detached processes on one machine, locally
(``subprocess``) or over SSH (Fabric). The process backend runs tasks through them on its hosts;
the Slurm backend runs its ``srun`` clients through the local one."""
