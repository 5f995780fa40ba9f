"""Placement and port allocation (tfplan.placement): properties over many generated clusters."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from tfplan.config.schema import ChiefMode, ClusterConfig, HostConfig
from tfplan.errors import PlanError
from tfplan.planning import placement
from tfplan.planning.placement import PortRange, Slot
from tfplan.planning.plan import Role
from tfplan.planning.roles import RoleCounts, role_counts
from tfplan.planning.topology import Place, Topology


# The placement works on the places a backend offers; these tests describe clusters as the
# process backend's host lists, so they map each HostConfig to its Place.
def _topology(cluster: ClusterConfig) -> Topology:
    return Topology(
        places=tuple(
            Place(h.name or h.address, h.address, h.cpu_slots, h.gpus, h.port_base)
            for h in cluster.hosts
        )
    )


def count_ps(cluster: ClusterConfig) -> int:
    return role_counts(cluster, _topology(cluster)).ps


def count_workers(cluster: ClusterConfig) -> int:
    return role_counts(cluster, _topology(cluster)).workers


def place(cluster: ClusterConfig) -> tuple[Slot, ...]:
    topology = _topology(cluster)
    return placement.place(topology.places, role_counts(cluster, topology))


def allocate_ports(
    cluster: ClusterConfig,
    slots: tuple[Slot, ...],
    preferred: dict[tuple[str, int], int],
    held: dict[int, frozenset[int]],
) -> dict[tuple[Role, int], int]:
    ports = PortRange(cluster.port_base, cluster.port_range, cluster.port_offset)
    return placement.allocate_ports(_topology(cluster).places, ports, slots, preferred, held)


def _cluster(
    slots: list[int],
    gpus: list[int] | None = None,
    *,
    ps: int | str = 1,
    workers: int | str = 2,
    chief: ChiefMode = ChiefMode.worker0,
    evaluator: bool = False,
    port_offset: int = 0,
    port_range: int = 100,
) -> ClusterConfig:
    gpus = gpus or [0] * len(slots)
    hosts = [
        HostConfig(address=f"10.0.0.{i + 1}", name=f"n{i}", cpu_slots=s, gpus=g)
        for i, (s, g) in enumerate(zip(slots, gpus, strict=True))
    ]
    return ClusterConfig(
        name="t",
        hosts=hosts,
        ps=ps,
        workers=workers,
        chief=chief,
        evaluator=evaluator,
        port_offset=port_offset,
        port_range=port_range,
    )


def _random_clusters(count: int, seed: int = 7) -> list[ClusterConfig]:
    """Clusters that fit: random hosts, slots, GPUs and roles (deterministic by seed)."""
    rng = random.Random(seed)
    clusters: list[ClusterConfig] = []
    while len(clusters) < count:
        n = rng.randint(1, 6)
        slots = [rng.randint(1, 8) for _ in range(n)]
        gpus = [rng.choice([0, 0, 1, 2, 4]) for _ in range(n)]
        ps: int | str = "per_host" if rng.random() < 0.5 else rng.randint(1, 4)
        workers: int | str = "per_gpu" if rng.random() < 0.5 else rng.randint(1, 8)
        chief = rng.choice(list(ChiefMode))
        cluster = _cluster(
            slots,
            gpus,
            ps=ps,
            workers=workers,
            chief=chief,
            evaluator=rng.random() < 0.5,
            port_offset=rng.choice([0, 100, 1000]),
        )
        wanted = count_ps(cluster) + count_workers(cluster) + int(cluster.evaluator)
        wanted += int(chief is ChiefMode.separate)
        if count_workers(cluster) >= 1 and wanted <= sum(slots):
            try:
                place(cluster)
            except PlanError:  # per_gpu workers pinned to a host with too few slots
                continue
            clusters.append(cluster)
    return clusters


CLUSTERS = _random_clusters(150)


def _expected_names(cluster: ClusterConfig) -> list[str]:
    names = [f"ps/{i}" for i in range(count_ps(cluster))]
    if cluster.chief is ChiefMode.separate:
        names.append("chief/0")
    names += [f"worker/{i}" for i in range(count_workers(cluster))]
    if cluster.evaluator:
        names.append("evaluator/0")
    return names


@pytest.mark.parametrize("cluster", CLUSTERS[:60])
def test_every_task_placed_once_within_slots(cluster: ClusterConfig) -> None:
    slots = place(cluster)
    assert [f"{s.role.value}/{s.index}" for s in slots] == _expected_names(cluster)
    per_host = Counter(s.host for s in slots)
    for position, used in per_host.items():
        assert used <= cluster.hosts[position].cpu_slots


def test_properties_hold_for_every_generated_cluster() -> None:
    for cluster in CLUSTERS:
        slots = place(cluster)
        assert place(cluster) == slots  # deterministic
        ports = allocate_ports(cluster, slots, preferred={}, held={})
        # every networked task has a port; none clash on a host; all inside the host's range
        networked = [s for s in slots if s.role is not Role.EVALUATOR]
        assert set(ports) == {(s.role, s.index) for s in networked}
        endpoints = [(s.host, ports[(s.role, s.index)]) for s in networked]
        assert len(set(endpoints)) == len(endpoints)
        start = cluster.port_base + cluster.port_offset
        assert all(start <= port < start + cluster.port_range for _, port in endpoints)
        # GPUs: a device at most once per host, never beyond the host's count, only for trainers
        for position, host in enumerate(cluster.hosts):
            devices = [d for s in slots if s.host == position for d in s.devices]
            assert len(devices) == len(set(devices))
            assert all(int(d) < host.gpus for d in devices)
        assert all(not s.devices for s in slots if s.role in (Role.PS, Role.EVALUATOR))
        # per_gpu: every worker sits on a host with a GPU and, with chief=worker0, owns one
        if cluster.workers == "per_gpu" and cluster.chief is ChiefMode.worker0:
            assert all(len(s.devices) == 1 for s in slots if s.role is Role.WORKER)


def test_ps_spread_round_robin_over_hosts() -> None:
    slots = place(_cluster([4, 4, 4], ps=5, workers=3))
    assert [s.host for s in slots if s.role is Role.PS] == [0, 1, 2, 0, 1]
    per_host = place(_cluster([2, 2, 2, 2], ps="per_host", workers=4))
    assert sorted(s.host for s in per_host if s.role is Role.PS) == [0, 1, 2, 3]


def test_workers_go_to_the_least_used_host_ties_to_the_earlier() -> None:
    slots = place(_cluster([4, 4, 4], ps=1, workers=5, evaluator=True))
    hosts = {f"{s.role.value}/{s.index}": s.host for s in slots}
    # after ps/0 on n0: n1, n2 are emptier; then round by load
    assert [hosts[f"worker/{i}"] for i in range(5)] == [1, 2, 0, 1, 2]
    assert hosts["evaluator/0"] == 0


def test_a_full_host_passes_its_ps_on() -> None:
    # 3 ps + 2 workers = 5 tasks in 5 slots; round-robin alone would put ps/2 on the full n0
    slots = place(_cluster([1, 4], ps=3, workers=2))
    assert [(s.role, s.host) for s in slots] == [
        (Role.PS, 0),
        (Role.PS, 1),
        (Role.PS, 1),
        (Role.WORKER, 1),
        (Role.WORKER, 1),
    ]


def test_too_many_tasks_for_the_slots_is_refused() -> None:
    with pytest.raises(PlanError, match=r"cluster.hosts: no free slot for worker/5.*6 slots"):
        place(_cluster([3, 3], ps=1, workers=6))


def test_per_gpu_worker_on_a_full_host_is_refused() -> None:
    # per_gpu pins each worker to its GPU's host; 1 ps + 4 workers do not fit in 4 slots
    with pytest.raises(PlanError, match="no free slot"):
        place(_cluster([4], [4], ps=1, workers="per_gpu"))


def test_places_for_some_roles_take_only_those_roles() -> None:
    # a Spark application's executors of their own per role: 2 ps places, 2 for the rest
    places = (
        Place("ps-executor-0", None, 2, roles=("ps",)),
        Place("ps-executor-1", None, 2, roles=("ps",)),
        Place("executor-0", None, 3, roles=("chief", "worker", "evaluator")),
        Place("executor-1", None, 3, roles=("chief", "worker", "evaluator")),
    )
    counts = RoleCounts(ps=3, workers=4, chief=True, evaluator=True, per_gpu=False)
    slots = placement.place(places, counts)
    by_role: dict[Role, list[int]] = {}
    for s in slots:
        by_role.setdefault(s.role, []).append(s.host)
    assert by_role[Role.PS] == [0, 1, 0]  # round-robin over the ps places only
    assert by_role[Role.CHIEF] == [2]
    assert by_role[Role.WORKER] == [3, 2, 3, 2]
    assert by_role[Role.EVALUATOR] == [3]


def test_a_role_no_place_takes_is_refused_naming_it() -> None:
    places = (Place("ps-executor-0", None, 2, roles=("ps",)),)
    counts = RoleCounts(ps=1, workers=1, chief=False, evaluator=False, per_gpu=False)
    with pytest.raises(PlanError, match="no place takes worker tasks"):
        placement.place(places, counts)
    roomy = RoleCounts(ps=3, workers=0, chief=False, evaluator=False, per_gpu=False)
    with pytest.raises(PlanError, match="no free slot for ps/2: the places that take ps tasks"):
        placement.place(places, roomy)


def test_per_gpu_workers_skip_gpu_places_for_other_roles() -> None:
    places = (
        Place("ps-0", None, 1, gpus=1, roles=("ps",)),
        Place("w-0", None, 2, gpus=2, roles=("worker",)),
    )
    counts = RoleCounts(ps=1, workers=0, chief=False, evaluator=False, per_gpu=True)
    slots = placement.place(places, counts)
    assert [(s.role, s.host, s.devices) for s in slots] == [
        (Role.PS, 0, ()),
        (Role.WORKER, 1, ("0",)),
        (Role.WORKER, 1, ("1",)),
    ]


def _reference_place(cluster: ClusterConfig) -> tuple[Slot, ...]:
    """The original O(hosts)-scan placement, kept to prove the heap changes nothing."""
    used = [0] * len(cluster.hosts)
    next_gpu = [0] * len(cluster.hosts)

    def take(role: Role, index: int, host: int | None = None) -> Slot:
        if host is None:
            free = [i for i, h in enumerate(cluster.hosts) if used[i] < h.cpu_slots]
            host = min(free, key=lambda i: (used[i], i))
        used[host] += 1
        devices: tuple[str, ...] = ()
        if role in (Role.WORKER, Role.CHIEF) and next_gpu[host] < cluster.hosts[host].gpus:
            devices = (str(next_gpu[host]),)
            next_gpu[host] += 1
        return Slot(role, index, host, devices)

    slots = [take(Role.PS, i, i % len(cluster.hosts)) for i in range(count_ps(cluster))]
    if cluster.chief is ChiefMode.separate:
        gpu_host = next((i for i, h in enumerate(cluster.hosts) if h.gpus > 0), None)
        slots.append(take(Role.CHIEF, 0, gpu_host if cluster.workers == "per_gpu" else None))
    if cluster.workers == "per_gpu":
        index = 0
        for position, host in enumerate(cluster.hosts):
            for _ in range(host.gpus - next_gpu[position]):
                slots.append(take(Role.WORKER, index, position))
                index += 1
    else:
        slots += [take(Role.WORKER, i) for i in range(count_workers(cluster))]
    if cluster.evaluator:
        slots.append(take(Role.EVALUATOR, 0))
    return tuple(slots)


def test_heap_placement_is_identical_to_the_scan() -> None:
    rng = random.Random(3)
    checked = 0
    for cluster in CLUSTERS:
        # the reference has no ps fallback: compare where round-robin ps fit
        ps_hosts = Counter(i % len(cluster.hosts) for i in range(count_ps(cluster)))
        if all(n <= cluster.hosts[h].cpu_slots for h, n in ps_hosts.items()):
            assert place(cluster) == _reference_place(cluster)
            checked += 1
    for _ in range(30):  # bigger, uneven clusters with counted workers
        slots = [rng.randint(1, 12) for _ in range(rng.randint(20, 60))]
        cluster = _cluster(
            slots,
            ps="per_host",
            workers=sum(slots) - len(slots) - 1,
            evaluator=True,
            chief=rng.choice(list(ChiefMode)),
        )
        if cluster.chief is ChiefMode.separate:
            cluster.workers = int(cluster.workers) - 1
        assert place(cluster) == _reference_place(cluster)
        checked += 1
    assert checked > 100


def test_port_offset_shifts_every_port_so_two_clusters_share_hosts() -> None:
    a = _cluster([8, 8], ps=2, workers=4)
    b = _cluster([8, 8], ps=2, workers=4, port_offset=100)
    ports_a = allocate_ports(a, place(a), {}, {})
    ports_b = allocate_ports(b, place(b), {}, {})
    assert {k: v + 100 for k, v in ports_a.items()} == ports_b
    used_a = {(s.host, ports_a[(s.role, s.index)]) for s in place(a)}
    used_b = {(s.host, ports_b[(s.role, s.index)]) for s in place(b)}
    assert not used_a & used_b
    assert min(ports_a.values()) == 2222 and min(ports_b.values()) == 2322


def test_per_host_port_base_overrides_the_cluster_one() -> None:
    cluster = _cluster([4, 4], ps="per_host", workers=2, port_offset=10)
    cluster.hosts[1].port_base = 5000
    slots = place(cluster)
    ports = allocate_ports(cluster, slots, {}, {})
    assert ports[(Role.PS, 0)] == 2232 and ports[(Role.PS, 1)] == 5010


def test_preferred_ports_are_kept_and_held_ports_avoided() -> None:
    cluster = _cluster([8], ps=1, workers=3)
    slots = place(cluster)
    fresh = allocate_ports(cluster, slots, {}, {})
    assert sorted(fresh.values()) == [2222, 2223, 2224, 2225]
    # worker/1 already runs on 2230 and keeps it; 2222 is held by a task being destroyed
    ports = allocate_ports(cluster, slots, {("worker/1", 0): 2230}, held={0: frozenset({2222})})
    assert ports[(Role.WORKER, 1)] == 2230
    assert 2222 not in ports.values()
    assert sorted(ports.values()) == [2223, 2224, 2225, 2230]
    # a preferred port that is held, or out of range, or on another host, is not kept
    held = allocate_ports(cluster, slots, {("worker/1", 0): 2230}, {0: frozenset({2230})})
    assert held[(Role.WORKER, 1)] != 2230
    out = allocate_ports(cluster, slots, {("worker/1", 0): 9999}, {})
    assert out == fresh
    moved = allocate_ports(cluster, slots, {("worker/1", 1): 2230}, {})
    assert moved == fresh


def test_port_range_too_small_is_refused() -> None:
    cluster = _cluster([8], ps=1, workers=4, port_range=3)
    with pytest.raises(PlanError, match=r"cluster.port_range: host n0 has no free port in 2222-22"):
        allocate_ports(cluster, place(cluster), {}, {})


def test_evaluator_gets_no_port_and_no_gpu() -> None:
    cluster = _cluster([4, 4], [2, 2], ps=1, workers="per_gpu", evaluator=True)
    slots = place(cluster)
    ports = allocate_ports(cluster, slots, {}, {})
    evaluator = [s for s in slots if s.role is Role.EVALUATOR]
    assert len(evaluator) == 1 and evaluator[0].devices == ()
    assert (Role.EVALUATOR, 0) not in ports


@pytest.mark.parametrize("chief", [ChiefMode.worker0, ChiefMode.separate])
def test_per_gpu_gives_every_training_replica_its_own_gpu(chief: ChiefMode) -> None:
    cluster = ClusterConfig(
        name="g",
        hosts=[
            HostConfig(address="10.0.0.1", cpu_slots=8, gpus=2),
            HostConfig(address="10.0.0.2", cpu_slots=8, gpus=3),
        ],
        ps="per_host",
        workers="per_gpu",
        chief=chief,
    )
    replicas = [s for s in place(cluster) if s.role in (Role.WORKER, Role.CHIEF)]
    assert len(replicas) == 5
    assert all(len(s.devices) == 1 for s in replicas)
    assert len({(s.host, s.devices) for s in replicas}) == 5
