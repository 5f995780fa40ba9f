"""``cluster.memory`` on the listed hosts: each limited task in a memory cgroup of its own.

Whether a host can make one (preflight), which group a task enters (launch: the cold start's
wrapper or the warm seed makes it, :mod:`tfplan.backends.transports.cgroups`), the groups
recorded in the allocation as tasks are about to start (allocate), and removed at release.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from tfplan.backends.api import LaunchRequest
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.process.shell import run_on_host
from tfplan.backends.transports.cgroups import cgroup_name, probe_script, remove_script
from tfplan.backends.transports.pool import TransportPool
from tfplan.planning.memory import limit_text
from tfplan.planning.plan import Plan, Task
from tfplan.planning.state import Allocation

__all__ = [
    "CGROUPS_KEY",
    "group_of",
    "problem_line",
    "record",
    "recorded",
    "remove",
    "support_problem",
]

CGROUPS_KEY = "cgroups"  # an allocation's record: plan host -> the groups made there


def group_of(request: LaunchRequest) -> str:
    """The memory cgroup ``request`` runs in; a warm standby's is its own (it runs beside its
    task)."""
    return cgroup_name(
        request.experiment,
        request.role,
        request.index,
        request.attempt if request.standby else None,
    )


def support_problem(
    pool: TransportPool, host: str, plan: Plan, tasks: Sequence[Task]
) -> str | None:
    """Why ``host`` cannot make its limited tasks' memory cgroups (tried as a task would make
    one, then removed), or None; None too when none of its tasks has a limit."""
    limited = [t for t in tasks if t.host == host and t.memory_limit is not None]
    if not limited:
        return None
    probe = cgroup_name(plan.experiment_id, "preflight", 0)
    first = limited[0].memory_limit or 0
    said = run_on_host(pool, host, probe_script(probe, first), "make a memory cgroup").strip()
    return None if said.endswith("ok") else problem_line(limited, said)


def problem_line(limited: Sequence[Task], said: str) -> str:
    """Preflight's line for a host that cannot make the groups of ``limited``: the probe
    ``said`` why (the kernel's word, or the shell's)."""
    names = ", ".join(f"{t.name} ({limit_text(t.memory_limit)})" for t in limited[:3])
    more = f" and {len(limited) - 3} more" if len(limited) > 3 else ""
    why = said.splitlines()[-1] if said else "no answer"
    return (
        f"cluster.memory gives {names}{more} a memory cgroup of its own, but this host offers "
        f"none tfplan can make ({why}): run tfplan as root there, delegate a cgroup to its "
        "user, or remove cluster.memory"
    )


def recorded(allocation: Allocation | None) -> dict[str, list[str]]:
    """Plan host -> the memory cgroups the experiment's tasks were given there."""
    if allocation is None:
        return {}
    data = allocation.data.get(CGROUPS_KEY) or {}
    return {str(h): [str(n) for n in names] for h, names in dict(data).items()}


def record(allocation: Allocation, plan: Plan, tasks: Sequence[Task]) -> Allocation:
    """``allocation`` with the groups of ``tasks`` that have a limit, merged with those of
    earlier applies (release removes them all)."""
    merged = recorded(allocation)
    wanted = {
        (t.host, cgroup_name(plan.experiment_id, t.role.value, t.index))
        for t in tasks
        if t.memory_limit is not None
    }
    if all(name in merged.get(host, []) for host, name in wanted):
        return allocation
    for host, name in wanted:
        merged[host] = sorted({*merged.get(host, []), name})
    return replace(allocation, data={**allocation.data, CGROUPS_KEY: merged})


def remove(pool: TransportPool, allocation: Allocation, hosts: Sequence[str]) -> dict[str, str]:
    """Remove the recorded groups on each of ``hosts`` that has some (their tasks have
    ended): each host's that could not be, and why."""
    groups = {h: n for h, n in recorded(allocation).items() if h in hosts and n}

    def clear(host: str) -> list[str]:
        out = run_on_host(pool, host, remove_script(groups[host]), "remove memory cgroups")
        return [line[len("left ") :] for line in out.splitlines() if line.startswith("left ")]

    done = run_on_hosts({h: h for h in groups}, clear)
    problems = {h: f"memory cgroups: {e}" for h, e in done.failed.items()}
    for host, left in done.succeeded.items():
        if left:
            problems[host] = f"memory cgroups still hold processes, left: {', '.join(left)}"
    return problems
