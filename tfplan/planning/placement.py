"""Pure: which host runs which task, on which port and devices.

Deterministic: the same config and the same held ports always give the same placement.
Parameter servers are spread first (round-robin over the hosts; a full host passes its ps to
the least used host with a free slot), then the chief, the workers and
the evaluator each go to the host with the fewest tasks so far (ties to the earlier host), within
each host's ``cpu_slots`` and among the hosts that take the task's role (``Place.roles``: a Spark
application's ps executors take only ps tasks). Workers on a host with GPUs take that host's next free GPU. Where the
hosts may not share the output folder, the evaluator goes to the chief's host instead: it reads
the chief's checkpoints there (docs/per_host_output.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfplan.errors import PlanError
from tfplan.planning.plan import Role
from tfplan.planning.roles import RoleCounts
from tfplan.planning.topology import Place

__all__ = ["PortRange", "Slot", "place", "allocate_ports"]


@dataclass(frozen=True)
class Slot:
    """One task's place: role, index, host (by position in the places) and GPUs."""

    role: Role
    index: int
    host: int
    devices: tuple[str, ...]


@dataclass(frozen=True)
class PortRange:
    """The ports tfplan may use on each place: [base + offset, base + offset + size)."""

    base: int
    size: int
    offset: int = 0


class _Hosts:
    def __init__(self, hosts: Sequence[Place], keys: tuple[str, str]) -> None:
        self.hosts = hosts
        self.keys = keys
        self.used = [0] * len(hosts)
        self.next_gpu = [0] * len(hosts)
        # (tasks so far, position) of every host with a free slot, so the least used host is
        # found in O(log hosts), not by a scan of every host for every task (9,000 tasks on
        # 1,000 hosts took 15 s that way). Entries go stale when a host takes a task; they are
        # dropped when they reach the top. The list is sorted, hence already a heap.
        self._free = [(0, i) for i, h in enumerate(hosts) if h.cpu_slots > 0]
        self._by_role = any(h.roles for h in hosts)

    def _least_used(self, role: Role) -> int | None:
        if self._by_role:  # a few places, each for some roles: a scan
            free = [
                (self.used[i], i)
                for i, h in enumerate(self.hosts)
                if h.takes(role.value) and self.used[i] < h.cpu_slots
            ]
            return min(free)[1] if free else None
        while self._free:
            used, i = self._free[0]
            if used == self.used[i] and used < self.hosts[i].cpu_slots:
                return i
            heapq.heappop(self._free)
        return None

    def take(self, role: Role, index: int, host: int | None = None, fallback: bool = False) -> Slot:
        """A slot on ``host``, or on the least used host with a free slot (ties to the earlier
        host) when ``host`` is None, or when it is full and ``fallback`` is set."""
        if (
            host is not None
            and fallback
            and (
                self.used[host] >= self.hosts[host].cpu_slots
                or not self.hosts[host].takes(role.value)
            )
        ):
            host = None
        if host is None:
            host = self._least_used(role)
            if host is None:
                raise self._full(role, index)
        elif self.used[host] >= self.hosts[host].cpu_slots:
            raise self._full(role, index)
        self.used[host] += 1
        if self.used[host] < self.hosts[host].cpu_slots:
            heapq.heappush(self._free, (self.used[host], host))
        devices: tuple[str, ...] = ()
        if role in (Role.WORKER, Role.CHIEF) and self.next_gpu[host] < self.hosts[host].gpus:
            devices = (str(self.next_gpu[host]),)
            self.next_gpu[host] += 1
        return Slot(role=role, index=index, host=host, devices=devices)

    def _full(self, role: Role, index: int) -> PlanError:
        total = sum(h.cpu_slots for h in self.hosts)
        if self._by_role:
            mine = [h for h in self.hosts if h.takes(role.value)]
            if not mine:
                return PlanError(
                    f"{self.keys[0]}: no place takes {role.value} tasks: add places for "
                    f"{role.value} tasks, or places that take any role"
                )
            return PlanError(
                f"{self.keys[0]}: no free slot for {role.value}/{index}: the places that take "
                f"{role.value} tasks have {sum(h.cpu_slots for h in mine)} slots in all; raise "
                f"{self.keys[1]}, add more, or ask for fewer tasks"
            )
        return PlanError(
            f"{self.keys[0]}: no free slot for {role.value}/{index}: the cluster has {total} "
            f"slots in all; raise {self.keys[1]}, add more, or ask for fewer tasks"
        )


def place(
    places: Sequence[Place],
    counts: RoleCounts,
    keys: tuple[str, str] = ("cluster.hosts", "cluster.hosts[i].cpu_slots"),
    evaluator_with_chief: str = "",
) -> tuple[Slot, ...]:
    """Every task's slot, in start order: ps, chief, workers, evaluator.

    Args:
        places: where tasks can go.
        counts: how many of each role.
        keys: the config keys of the places and of their slots, for the error message.
        evaluator_with_chief: "" (the evaluator goes where there is most room), "prefer" (on
            the chief's host while it has a free slot) or "require" (on the chief's host, or
            a PlanError).

    Raises:
        PlanError: the places have too few slots for the tasks asked for, or (``require``)
            the chief's host has no slot left for the evaluator.
    """
    hosts = _Hosts(places, keys)
    slots: list[Slot] = []
    for index in range(counts.ps):
        # round-robin over the hosts; a full host passes its ps on to the least used one
        slots.append(hosts.take(Role.PS, index, host=index % len(places), fallback=True))
    if counts.chief:
        # One training replica per GPU: a separate chief is one of them, on the first GPU.
        first_gpu_host = next(
            (i for i, h in enumerate(places) if h.gpus > 0 and h.takes(Role.CHIEF.value)), None
        )
        slots.append(hosts.take(Role.CHIEF, 0, host=first_gpu_host if counts.per_gpu else None))
    if counts.per_gpu:
        index = 0
        for position, host in enumerate(places):
            if not host.takes(Role.WORKER.value):
                continue
            for _ in range(host.gpus - hosts.next_gpu[position]):
                slots.append(hosts.take(Role.WORKER, index, host=position))
                index += 1
    else:
        for index in range(counts.workers):
            slots.append(hosts.take(Role.WORKER, index))
    if counts.evaluator:
        chief = next((s for s in slots if s.role is Role.CHIEF), None) or next(
            (s for s in slots if s.role is Role.WORKER and s.index == 0), None
        )
        if not evaluator_with_chief or chief is None:
            slots.append(hosts.take(Role.EVALUATOR, 0))
        elif evaluator_with_chief == "prefer":
            slots.append(hosts.take(Role.EVALUATOR, 0, host=chief.host, fallback=True))
        else:
            if hosts.used[chief.host] >= places[chief.host].cpu_slots:
                name = places[chief.host].name
                raise PlanError(
                    f"{keys[1].replace('[i]', f'[{chief.host}]')}: no free slot for evaluator/0 "
                    f"on {name}, the chief's host: with cluster.output_mode=per_host the "
                    f"evaluator reads the chief's checkpoints there; give {name} one more slot"
                )
            slots.append(hosts.take(Role.EVALUATOR, 0, host=chief.host))
    return tuple(slots)


def allocate_ports(
    places: Sequence[Place],
    ports: PortRange,
    slots: tuple[Slot, ...],
    preferred: Mapping[tuple[str, int], int],
    held: Mapping[int, frozenset[int]],
) -> dict[tuple[Role, int], int]:
    """A port for every task in the cluster spec (the evaluator has none).

    Args:
        places: where the slots are.
        ports: the port range on each place (a place's own port_base overrides the base).
        slots: the placement.
        preferred: (task name, host position) -> the port it holds now; kept when still free,
            so an unchanged task keeps its address.
        held: host position -> ports held by running tasks that are not being planned here.

    Raises:
        PlanError: a host's port range is too small for its tasks.
    """
    taken: dict[int, set[int]] = {i: set(held.get(i, frozenset())) for i in range(len(places))}
    chosen: dict[tuple[Role, int], int] = {}
    networked = [s for s in slots if s.role is not Role.EVALUATOR]
    for slot in networked:
        port = preferred.get((f"{slot.role.value}/{slot.index}", slot.host))
        window = _range(places[slot.host], ports)
        if port is not None and port not in taken[slot.host] and port in window:
            taken[slot.host].add(port)
            chosen[(slot.role, slot.index)] = port
    for slot in networked:
        if (slot.role, slot.index) in chosen:
            continue
        port = _first_free(places[slot.host], ports, taken[slot.host])
        taken[slot.host].add(port)
        chosen[(slot.role, slot.index)] = port
    return chosen


def _range(place: Place, ports: PortRange) -> range:
    base = place.port_base if place.port_base is not None else ports.base
    start = base + ports.offset
    return range(start, start + ports.size)


def _first_free(place: Place, ports: PortRange, taken: set[int]) -> int:
    window = _range(place, ports)
    for port in window:
        if port not in taken:
            return port
    raise PlanError(
        f"cluster.port_range: host {place.name} has no free port in "
        f"{window.start}-{window.stop - 1}; raise cluster.port_range or change cluster.port_offset"
    )
