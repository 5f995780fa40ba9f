"""``cluster.firewall`` on the listed hosts: the rules each host gets (shown at plan time),
whether a host can take them (preflight), installing them at allocate, removing them at release.

The rules themselves, and the scripts that detect, install and remove them, are the shared
:mod:`tfplan.backends.firewall`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tfplan.backends.api import Say
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.firewall import (
    HostFirewall,
    cluster_firewalls,
    detect_script,
    install_script,
    parse_detect,
    remove_script,
)
from tfplan.backends.process.shell import run_on_host
from tfplan.backends.transports.pool import TransportPool
from tfplan.errors import BackendError
from tfplan.planning.plan import Plan
from tfplan.planning.state import Allocation

__all__ = ["dryrun_lines", "host_rules", "install", "remove", "support_problem"]


def host_rules(plan: Plan) -> dict[str, HostFirewall]:
    """Each host's rules: the ports of its own tasks, open to every host of the cluster.

    Raises:
        ConfigError: a host's address is not an IP address (rules need addresses).
    """
    tasks = [(t.host, plan.address_of(t) or t.host, t.port) for t in plan.tasks]
    return cluster_firewalls(plan.experiment_id, tasks)


def dryrun_lines(plan: Plan) -> tuple[str, ...]:
    """With ``cluster.firewall``: the rules each host will get."""
    if not plan.backend.config.get("firewall"):
        return ()
    return tuple(f"firewall: {fw.describe()}" for fw in host_rules(plan).values() if fw.ports)


def support_problem(pool: TransportPool, host: str) -> str | None:
    """Why ``host`` cannot take the rules (no firewall tool, no permission), or None."""
    return parse_detect(run_on_host(pool, host, detect_script(), "detect")).problem


def install(
    pool: TransportPool,
    plan: Plan,
    allocation: Allocation,
    say: Say,
    submitted: Callable[[Allocation], None],
) -> Allocation:
    """The rules on every host of the plan, replacing what an earlier apply installed; the
    allocation records them (and is submitted) before any is installed.

    Raises:
        BackendError: a host could not take them, naming each.
    """
    firewalls = host_rules(plan)
    data = {**allocation.data, "firewall": sorted(firewalls), "experiment": plan.experiment_id}
    allocation = replace(allocation, data=data)
    submitted(allocation)  # recorded before installing: a failure part-way is removed again

    def install_on(host: str) -> str:
        support = parse_detect(run_on_host(pool, host, detect_script(), "detect"))
        if support.backend is None:
            raise BackendError(support.problem or "no firewall tool")
        run_on_host(pool, host, install_script(firewalls[host], support.backend), "firewall")
        return support.backend

    done = run_on_hosts({h: h for h in firewalls}, install_on)
    failed = done.failed
    if failed:
        detail = "; ".join(f"{h}: {e}" for h, e in sorted(failed.items()))
        raise BackendError(f"could not install the firewall rules: {detail}")
    say(
        "firewall: only the cluster's addresses reach its ports on "
        + ", ".join(f"{h} ({kind})" for h, kind in sorted(done.succeeded.items()))
    )
    return allocation


def remove(pool: TransportPool, allocation: Allocation) -> dict[str, str]:
    """Remove the rules the allocation records (idempotent): each host's that could not be
    confirmed gone, and why."""
    hosts = allocation.data.get("firewall") or []
    experiment = str(allocation.data.get("experiment", ""))
    if not (hosts and experiment):
        return {}
    script = remove_script(experiment)
    failed = run_on_hosts(
        {h: h for h in hosts}, lambda h: run_on_host(pool, h, script, "firewall")
    ).failed
    return {h: f"firewall rules: {e}" for h, e in failed.items()}
