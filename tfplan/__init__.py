"""tfplan: declarative, Terraform-style plan/apply for distributed TensorFlow."""

from tfplan.plan import Action, Change, Plan, Role, Task

__all__ = ["Action", "Change", "Plan", "Role", "Task", "__version__"]

__version__ = "0.1.0"
