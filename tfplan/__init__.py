"""tfplan: Terraform-style plan/apply for distributed TensorFlow.

Layers, each importing only those before it::

    config      Hydra schemas, composition, the algorithm list
    planning    pure: placement, ports, TF_CONFIG, validation, the Plan data model
    backends    where tasks run: the Backend interface; process (local/SSH), Slurm, Kubernetes
    engine      apply a plan through a backend, supervise it, keep the state
    sweeps      Hydra multirun: every point a whole cluster
    cli         the `tfplan` command
"""

from tfplan.planning.plan import Action, Change, Plan, Role, Task

__version__ = "0.2.0"

__all__ = ["Action", "Change", "Plan", "Role", "Task", "__version__"]
