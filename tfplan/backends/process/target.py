"""Plan time, pure: ``cluster.hosts`` checked, and resolved into the plan's places and each
host's transport (local or SSH) and interpreter."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

from tfplan.backends.transports.specs import HostTarget, is_loopback
from tfplan.errors import ConfigError
from tfplan.planning.plan import BackendRef
from tfplan.planning.topology import Place, Target, Topology

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig, HostConfig
    from tfplan.planning.context import PlanContext

__all__ = ["LOCAL_ADDRESSES", "TRANSPORT_KINDS", "host_name", "plan_target"]

TRANSPORT_KINDS = ("auto", "local", "ssh")
LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")


def host_name(host: HostConfig) -> str:
    return host.name or host.address


def plan_target(backend: str, cluster: ClusterConfig, ctx: PlanContext) -> Target:
    """The listed hosts as places; each host's transport and interpreter resolved, recorded in
    a reference to the backend named ``backend``.

    Raises:
        ConfigError: no hosts, duplicate names/addresses, bad slots, ports or transport, or
            relative folders on a cluster with remote hosts.
    """
    if cluster.options:
        raise ConfigError(
            "cluster.options",
            f"the process backend has no options (got {', '.join(sorted(cluster.options))})",
            "remove them, or set cluster.backend to the backend they belong to",
        )
    _check_hosts(cluster)
    targets = [_host_target(cluster, h, ctx) for h in cluster.hosts]
    places = tuple(
        Place(
            name=t.name,
            address=t.address,
            cpu_slots=h.cpu_slots,
            gpus=h.gpus,
            port_base=h.port_base,
            python=t.python or "python3",
        )
        for t, h in zip(targets, cluster.hosts, strict=True)
    )
    ref = BackendRef(
        backend,
        {
            "hosts": [asdict(t) for t in targets],
            "firewall": cluster.firewall,
            "warm": cluster.warm,
            **(
                {"warm_keep_secs": cluster.warm_keep_secs}
                if cluster.warm_keep_secs is not None
                else {}
            ),
        },
    )
    return Target(ref, Topology(places=places), resize_in_place=True)


def _host_target(cluster: ClusterConfig, host: HostConfig, ctx: PlanContext) -> HostTarget:
    local = host.executor == "local" or (
        host.executor == "auto" and is_loopback(host.address) and host.ssh_port is None
    )
    return HostTarget(
        name=host_name(host),
        address=host.address,
        ssh_user=host.ssh_user,
        ssh_port=host.ssh_port,
        ssh_key=host.ssh_key,
        python=host.python or cluster.python or (ctx.local_python if local else "python3"),
        accept_new_host_keys=cluster.ssh_accept_new_host_keys,
        known_hosts=cluster.ssh_known_hosts,
        kind="local" if local else "ssh",
    )


def _require(ok: bool, key: str, problem: str, fix: str) -> None:
    if not ok:
        raise ConfigError(key, problem, fix)


def _check_hosts(cluster: ClusterConfig) -> None:
    hosts = cluster.hosts
    _require(
        len(hosts) > 0,
        "cluster.hosts",
        "no hosts",
        "add at least one host (cluster=local uses 127.0.0.1)",
    )
    names: set[str] = set()
    endpoints: set[tuple[str, int | None]] = set()
    for i, host in enumerate(hosts):
        key = f"cluster.hosts[{i}]"
        _check_host(host, key, names, endpoints)
    if any(not is_loopback(h.address) for h in hosts):
        for field, what in (("output_dir", "that every host shares"), ("workdir", "on each host")):
            value = getattr(cluster, field)
            _require(
                value.startswith("/"),
                f"cluster.{field}",
                f"relative path {value!r} on a cluster with remote hosts",
                f"use an absolute folder {what}",
            )


def _check_host(
    host: HostConfig, key: str, names: set[str], endpoints: set[tuple[str, int | None]]
) -> None:
    _require(bool(host.address.strip()), f"{key}.address", "is empty", "set the host's address")
    name = host_name(host)
    _require(
        name not in names,
        f"{key}.name",
        f"host {name!r} appears twice",
        "give each host a unique name",
    )
    names.add(name)
    endpoint = (host.address, host.ssh_port)
    _require(
        endpoint not in endpoints,
        f"{key}.address",
        f"{host.address} (ssh port {host.ssh_port}) appears twice",
        "list each machine once and raise its cpu_slots instead",
    )
    endpoints.add(endpoint)
    _require(
        host.cpu_slots >= 1,
        f"{key}.cpu_slots",
        f"{host.cpu_slots} < 1",
        "give every host at least one slot",
    )
    _require(host.gpus >= 0, f"{key}.gpus", f"{host.gpus} < 0", "use 0 for a CPU-only host")
    _require(
        host.executor in TRANSPORT_KINDS,
        f"{key}.executor",
        f"{host.executor!r} is not one of {', '.join(TRANSPORT_KINDS)}",
        "use auto unless you need to force one",
    )
    if host.executor == "local":
        _require(
            is_loopback(host.address),
            f"{key}.executor",
            f"executor=local (the local transport) for non-loopback address {host.address}",
            "use executor=ssh (or auto) for other machines",
        )
    if host.ssh_port is not None:
        _require(
            0 < host.ssh_port < 65536,
            f"{key}.ssh_port",
            f"{host.ssh_port} out of range",
            "use 1-65535",
        )
