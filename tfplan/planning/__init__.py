"""Pure planning: placement, ports, TF_CONFIG, validation, the diff; the Plan and State data.

Nothing here does I/O or imports a backend: the caller passes the backend's
:class:`~tfplan.planning.topology.Target` to :func:`tfplan.planning.planner.plan`. This package's
``__init__`` imports nothing, so that reading a plan or a state never loads Hydra.
"""
