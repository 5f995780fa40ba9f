"""The engine: apply a plan through its backend, supervise the tasks, keep the state and the
experiment's record. Knows backends only through :mod:`tfplan.backends.api`."""
