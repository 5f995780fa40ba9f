"""Pure: which host runs which task, on which port and devices.

Deterministic: the same config and the same held ports always give the same placement.
Parameter servers are spread first (round-robin over the hosts; a full host passes its ps to
the least used host with a free slot), then the chief, the workers and
the evaluator each go to the host with the fewest tasks so far (ties to the earlier host), within
each host's ``cpu_slots``. Workers on a host with GPUs take that host's next free GPU.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass

from tfplan.config import ChiefMode, ClusterConfig, HostConfig
from tfplan.errors import PlanError
from tfplan.plan import Role
from tfplan.validate import count_ps, count_workers

__all__ = ["Slot", "place", "allocate_ports", "host_name"]


@dataclass(frozen=True)
class Slot:
    """One task's place: role, index, host (by position in cluster.hosts) and GPUs."""

    role: Role
    index: int
    host: int
    devices: tuple[str, ...]


def host_name(host: HostConfig) -> str:
    return host.name or host.address


class _Hosts:
    def __init__(self, hosts: list[HostConfig]) -> None:
        self.hosts = hosts
        self.used = [0] * len(hosts)
        self.next_gpu = [0] * len(hosts)
        # (tasks so far, position) of every host with a free slot, so the least used host is
        # found in O(log hosts), not by a scan of every host for every task (9,000 tasks on
        # 1,000 hosts took 15 s that way). Entries go stale when a host takes a task; they are
        # dropped when they reach the top. The list is sorted, hence already a heap.
        self._free = [(0, i) for i, h in enumerate(hosts) if h.cpu_slots > 0]

    def _least_used(self) -> int | None:
        while self._free:
            used, i = self._free[0]
            if used == self.used[i] and used < self.hosts[i].cpu_slots:
                return i
            heapq.heappop(self._free)
        return None

    def take(self, role: Role, index: int, host: int | None = None, fallback: bool = False) -> Slot:
        """A slot on ``host``, or on the least used host with a free slot (ties to the earlier
        host) when ``host`` is None, or when it is full and ``fallback`` is set."""
        if host is not None and self.used[host] >= self.hosts[host].cpu_slots and fallback:
            host = None
        if host is None:
            host = self._least_used()
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
        return PlanError(
            f"cluster.hosts: no free slot for {role.value}/{index}: the cluster has {total} "
            f"cpu_slots in all; raise cluster.hosts[i].cpu_slots, add hosts, or ask for fewer tasks"
        )


def place(cluster: ClusterConfig) -> tuple[Slot, ...]:
    """Every task's slot, in start order: ps, chief, workers, evaluator.

    Raises:
        PlanError: the hosts have too few slots for the tasks asked for.
    """
    hosts = _Hosts(list(cluster.hosts))
    slots: list[Slot] = []
    for index in range(count_ps(cluster)):
        # round-robin over the hosts; a full host passes its ps on to the least used one
        slots.append(hosts.take(Role.PS, index, host=index % len(cluster.hosts), fallback=True))
    per_gpu = cluster.workers == "per_gpu"
    if cluster.chief is ChiefMode.separate:
        # One training replica per GPU: a separate chief is one of them, on the first GPU.
        first_gpu_host = next((i for i, h in enumerate(cluster.hosts) if h.gpus > 0), None)
        slots.append(hosts.take(Role.CHIEF, 0, host=first_gpu_host if per_gpu else None))
    if per_gpu:
        index = 0
        for position, host in enumerate(cluster.hosts):
            for _ in range(host.gpus - hosts.next_gpu[position]):
                slots.append(hosts.take(Role.WORKER, index, host=position))
                index += 1
    else:
        for index in range(count_workers(cluster)):
            slots.append(hosts.take(Role.WORKER, index))
    if cluster.evaluator:
        slots.append(hosts.take(Role.EVALUATOR, 0))
    return tuple(slots)


def allocate_ports(
    cluster: ClusterConfig,
    slots: tuple[Slot, ...],
    preferred: Mapping[tuple[str, int], int],
    held: Mapping[int, frozenset[int]],
) -> dict[tuple[Role, int], int]:
    """A port for every task in the cluster spec (the evaluator has none).

    Args:
        cluster: for port_base, port_offset and port_range.
        slots: the placement.
        preferred: (task name, host position) -> the port it holds now; kept when still free,
            so an unchanged task keeps its address.
        held: host position -> ports held by running tasks that are not being planned here.

    Raises:
        PlanError: a host's port range is too small for its tasks.
    """
    taken: dict[int, set[int]] = {
        i: set(held.get(i, frozenset())) for i in range(len(cluster.hosts))
    }
    ports: dict[tuple[Role, int], int] = {}
    networked = [s for s in slots if s.role is not Role.EVALUATOR]
    for slot in networked:
        port = preferred.get((f"{slot.role.value}/{slot.index}", slot.host))
        if (
            port is not None
            and port not in taken[slot.host]
            and _in_range(cluster, slot.host, port)
        ):
            taken[slot.host].add(port)
            ports[(slot.role, slot.index)] = port
    for slot in networked:
        if (slot.role, slot.index) in ports:
            continue
        port = _first_free(cluster, slot.host, taken[slot.host])
        taken[slot.host].add(port)
        ports[(slot.role, slot.index)] = port
    return ports


def _range(cluster: ClusterConfig, host: int) -> range:
    base = cluster.hosts[host].port_base
    start = (base if base is not None else cluster.port_base) + cluster.port_offset
    return range(start, start + cluster.port_range)


def _in_range(cluster: ClusterConfig, host: int, port: int) -> bool:
    return port in _range(cluster, host)


def _first_free(cluster: ClusterConfig, host: int, taken: set[int]) -> int:
    for port in _range(cluster, host):
        if port not in taken:
            return port
    ports = _range(cluster, host)
    raise PlanError(
        f"cluster.port_range: host {host_name(cluster.hosts[host])} has no free port in "
        f"{ports.start}-{ports.stop - 1}; raise cluster.port_range or change cluster.port_offset"
    )
