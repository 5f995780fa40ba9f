"""Pure: what a backend offers the planner to place tasks on.

The planner never imports a backend. The caller asks the backend for a :class:`Target` (its
resolved options and the places tasks can go) and passes it to :func:`tfplan.planning.planner.plan`:

- the process backend: the configured hosts, with their addresses and slots;
- Slurm: N nodes the scheduler will pick (addresses "known after apply");
- Kubernetes: one pod per task, each with a stable DNS name (``per_task``).
"""

from __future__ import annotations

from dataclasses import dataclass

from tfplan.planning.plan import BackendRef

__all__ = ["PerTask", "Place", "Target", "Topology"]


@dataclass(frozen=True)
class Place:
    """A machine (or node) tasks can be placed on."""

    name: str
    address: str | None  # None: the scheduler picks it at apply time
    cpu_slots: int  # tasks it may run
    gpus: int = 0
    port_base: int | None = None  # overrides cluster.port_base here
    python: str = "python3"  # the interpreter that runs the built-in recipes there
    roles: tuple[str, ...] = ()  # the roles whose tasks it takes ("ps", "worker"...); (): any

    def takes(self, role: str) -> bool:
        return not self.roles or role in self.roles


@dataclass(frozen=True)
class PerTask:
    """Every task gets a place of its own, named after it (Kubernetes: a pod per task).

    ``name`` and ``address`` are templates with ``{role}`` and ``{index}``.
    """

    name: str
    address: str
    gpus: int = 0  # per training task
    port: int = 2222  # every task listens on the same port at its own address
    python: str = "python3"


@dataclass(frozen=True)
class Topology:
    places: tuple[Place, ...] = ()
    per_task: PerTask | None = None
    # The config keys that set the places and their capacity, for "does not fit" messages.
    places_key: str = "cluster.hosts"
    slots_key: str = "cluster.hosts[i].cpu_slots"

    @property
    def total_gpus(self) -> int:
        """The GPUs of the places that take training replicas (one per GPU, per_gpu)."""
        return sum(p.gpus for p in self.places if p.takes("worker"))


@dataclass(frozen=True)
class Target:
    """A backend's answer to "where would this cluster run?": its reference and topology."""

    backend: BackendRef
    topology: Topology
    # the backend can add and remove workers of a running job in place (Backend.tell and a
    # signal that reaches the task's program): what an elastic plan needs
    resize_in_place: bool = False
    # the tasks run inside one allocation the backend asks for (a Slurm job): running tasks
    # cannot move to a changed request (``backend.config``), so every task restarts in a new one
    allocates: str | None = None  # what the allocation is called ("Slurm job"), None: none
