"""The process backend: every task is a process on a host tfplan reaches itself.

Hosts are listed in the cluster config (``cluster.hosts``). Loopback hosts use the local
transport (``subprocess``), the others SSH (Fabric); both run the same POSIX scripts, so tasks
start detached in their own process group, record their exit code in their workdir, and are
stopped by process group, never by name.

Handle: ``{"pid": ..., "pgid": ...}`` of the task's wrapper, the leader of its process group;
a warm standby's (and a task that was one) adds ``"exit_file"``, its own exit record in the
task's workdir; a task forked from a warm seed (:mod:`tfplan.backends.transports.seeds`, a sweep's) adds
``"forked": true``: its PID is the program's own; it records its exit status itself (the seed
when a signal ended it).

Every process of a task is in its group: a stop signals the group, so it reaches the program
whichever of the wrapper and the program died first. A wrapper that died while its program runs
on is reported as ``failed`` with ``detail`` saying how many processes are left.
"""

from __future__ import annotations

import io
import os
import posixpath
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tfplan.backends.api import (
    Backend,
    CancelResult,
    Capabilities,
    Launched,
    LaunchRequest,
    LogStream,
    OutputPlace,
    Say,
    TaskInfo,
    TaskPhase,
)
from tfplan.backends.delivery import deliver, shell_bytes
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.firewall import (
    HostFirewall,
    cluster_firewalls,
    detect_script,
    install_script,
    parse_detect,
    remove_script,
)
from tfplan.backends.staging import run_yaml, ship_code
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.preflight import (
    PreflightRequest,
    PreflightResult,
    output_sharing,
    raise_for_preflight,
)
from tfplan.backends.transports.scripts import (
    LISTENING_SCRIPT,
    SHARED_MARKER,
    fork_script,
    handle_exit_file,
    listening_ports,
    q,
    standby_exit_file,
)
from tfplan.backends.transports.scripts import exit_file as exit_file_of
from tfplan.backends.transports.seeds import (
    AGENT_SOURCE,
    PRELOAD,
    WarmSeed,
    fork_request,
    forkable,
    runs_python_code,
    seed_env,
)
from tfplan.backends.transports.specs import (
    HostTarget,
    LaunchSpec,
    ProcessInfo,
    StopResult,
    is_loopback,
)
from tfplan.errors import BackendError, ConfigError, PreflightError
from tfplan.files import write_atomic
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord
from tfplan.planning.topology import Place, Target, Topology

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig, HostConfig
    from tfplan.planning.context import PlanContext

__all__ = ["ProcessBackend", "host_name"]

TRANSPORT_KINDS = ("auto", "local", "ssh")
LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
# starts at once: over SSH each is a round trip of a few ms; locally a fork+exec
LAUNCH_FANOUT = 16
# how long a fork request waits for the seed's answer (it answers within milliseconds once its
# imports are done; a seed still importing makes the task wait, never longer than a cold start)
FORK_WAIT_SECS = 30.0
SEED_STOP_GRACE_SECS = 1.0  # a seed holds nothing: SIGTERM ends it at once
SEEDS_KEY = "seeds"  # the allocation's record of an apply's warm seeds


def allocation_seeds(allocation: Allocation | None) -> dict[str, WarmSeed]:
    """The warm seeds an apply recorded in its allocation, by host."""
    if allocation is None:
        return {}
    seeds = [WarmSeed.from_dict(s) for s in allocation.data.get(SEEDS_KEY) or []]
    return {s.host: s for s in seeds}


def _safe(host: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in host) or "host"


def host_name(host: HostConfig) -> str:
    return host.name or host.address


class ProcessBackend(Backend):
    """Tasks as processes on listed hosts, over a local or an SSH transport per host."""

    name = "process"
    capabilities = Capabilities(
        firewall=True,
        replace_lost_hosts=True,
        standby=True,
        signals=True,
        per_host_output=True,
        launch_fanout=LAUNCH_FANOUT,
        warm_starts=True,
    )

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        super().__init__(ref, scratch)
        self.hosts = [HostTarget(**h) for h in ref.config.get("hosts", [])]
        self.firewall = bool(ref.config.get("firewall", False))
        self.pool = TransportPool(self.hosts)
        self._output: dict[tuple[str, str, tuple[str, ...]], OutputPlace] = {}
        self._seeds: dict[str, WarmSeed] = {}  # a sweep's (use_seeds)
        self.warm = bool(ref.config.get("warm", True))

    # ---- plan time -----------------------------------------------------------------------
    @classmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """The listed hosts as places; each host's transport and interpreter resolved.

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
            cls.name,
            {
                "hosts": [asdict(t) for t in targets],
                "firewall": cluster.firewall,
                "warm": cluster.warm,
            },
        )
        return Target(ref, Topology(places=places), resize_in_place=True)

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        """With ``cluster.firewall``: the rules each host will get."""
        if not plan.backend.config.get("firewall"):
            return ()
        return tuple(f"firewall: {fw.describe()}" for fw in _firewalls(plan).values() if fw.ports)

    # ---- apply ---------------------------------------------------------------------------
    def locate_output(self, plan: Plan, tasks: Sequence[Task]) -> OutputPlace:
        """Loopback hosts only: this machine's folder. ``output_mode=per_host``: each host's
        own. Otherwise every host of ``tasks`` writes a marker in ``output_dir`` unless one is
        there and reads it back (:func:`output_sharing` decides); this machine only looks.
        Asked once per plan, hosts and backend (preflight asks too).

        Raises:
            PreflightError: a host cannot be reached or cannot create the folder, or the
                hosts share it in a way the mode does not allow.
        """
        hosts = tuple(sorted({t.host for t in tasks}))
        key = (plan.output_dir, plan.output_mode, hosts)
        if key in self._output:
            return self._output[key]
        chief = next((t for t in plan.tasks if t.is_chief), None)
        if all(self.pool.targets[h].kind == "local" for h in hosts):
            found = OutputPlace(per_host=False, launcher_sees=True)
        elif plan.output_mode == "per_host":
            found = OutputPlace(
                per_host=True,
                launcher_sees=False,
                detail=f"output_dir {plan.output_dir}: per-host output (cluster.output_mode="
                "per_host)",
            )
        else:
            token = uuid.uuid4().hex
            read = run_on_hosts(
                {h: h for h in hosts}, lambda h: self.pool[h].shared_marker(plan.output_dir, token)
            )
            if read.failed:
                raise PreflightError({h: str(e) for h, e in read.failed.items()})
            local = Path(plan.output_dir) / f"{SHARED_MARKER}{token}"
            try:
                mine: str | None = local.read_text().strip()
            except OSError:
                mine = None
            # Every host has read it: the markers can go (one round trip; a failure is harmless).
            marker = posixpath.join(plan.output_dir, f"{SHARED_MARKER}{token}")
            run_on_hosts(
                {h: h for h in hosts},
                lambda h: self.pool[h].run_script(f"rm -f {q(marker)}", f"remove {marker}"),
            )
            sharing = output_sharing(plan.output_mode, plan.output_dir, read.succeeded, mine)
            found = OutputPlace(sharing.per_host, sharing.launcher_sees, sharing.detail)
        if found.per_host and chief is not None:
            _check_evaluator_beside(plan, chief)
            found = replace(
                found,
                detail=f"{found.detail}: checkpoints stay on the chief's host {chief.host}"
                + (
                    ", where the evaluator runs"
                    if any(t.role.value == "evaluator" for t in plan.tasks)
                    else ""
                ),
            )
        self._output[key] = found
        return found

    def fetch_outputs(self, folder: str, near: str | None, dest: Path) -> int:
        """One gzipped tar of ``folder`` on ``near`` (checkpoints, markers, the ``tfplan``
        record and files of 64 MiB or more left out), unpacked into ``dest``.

        Raises:
            BackendError: the host could not be read.
        """
        host = near if near in self.pool.targets else self.hosts[0].name
        data = self.pool[host].get_tree(
            folder, skip=FETCH_SKIP, prune=("tfplan",), max_kib=FETCH_MAX_KIB
        )
        return unpack_tree(data, dest) if data else 0

    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> list[PreflightResult]:
        """Per host: python, TensorFlow (built-in recipes), free ports, writable folders; and
        whether the hosts share the output folder as ``cluster.output_mode`` requires
        (:meth:`locate_output`). Returns each host's answer.

        Raises:
            PreflightError: every host's problems, in one line.
        """
        self.locate_output(plan, tasks)

        def check(name: str) -> PreflightResult:
            mine = [t for t in tasks if t.host == name]
            request = PreflightRequest(
                tf_version=plan.tf_version if plan.builtin_recipes else None,
                ports=tuple(t.port for t in mine if t.port is not None),
                writable_dirs=(*(t.workdir for t in mine), plan.code_dir, plan.output_dir),
                legacy_keras=any(t.env.get("TF_USE_LEGACY_KERAS") == "1" for t in mine),
                gpus=len({d for t in mine for d in t.devices}),
            )
            result = self.pool[name].preflight(request)
            if self.firewall:
                support = parse_detect(self.run_on_host(name, detect_script(), "detect"))
                if support.problem:
                    result = replace(result, problems=(*result.problems, support.problem))
            return result

        hosts = sorted({t.host for t in tasks})
        firewall_hosts = sorted({t.host for t in plan.tasks}) if self.firewall else []
        every = {h: h for h in sorted({*hosts, *firewall_hosts})}
        return raise_for_preflight(run_on_hosts(every, check))

    def allocate(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        current: Allocation | None,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """The hosts are the planned ones. With ``cluster.firewall``, install the rules on every
        host of the plan (replacing what an earlier apply installed) before any task starts;
        with ``cluster.warm`` (the default), start a warm seed on each host of ``tasks`` that
        runs Python tasks (:mod:`tfplan.backends.transports.seeds`): it imports TensorFlow
        while tfplan stages the code, and the tasks fork from it. Both are recorded in the
        allocation as soon as they start, and :meth:`release` stops them."""
        allocation = current or Allocation()
        if self.firewall:
            allocation = self._install_firewall(plan, allocation, say, submitted)
        if self.warm and not self._seeds:  # a sweep's own seeds come first
            allocation = self._start_seeds(plan, tasks, allocation, say, submitted)
        return allocation

    def _install_firewall(
        self,
        plan: Plan,
        allocation: Allocation,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        firewalls = _firewalls(plan)
        data = {**allocation.data, "firewall": sorted(firewalls), "experiment": plan.experiment_id}
        allocation = replace(allocation, data=data)
        submitted(allocation)  # recorded before installing: a failure part-way is removed again

        def install(host: str) -> str:
            support = parse_detect(self.run_on_host(host, detect_script(), "detect"))
            if support.backend is None:
                raise BackendError(support.problem or "no firewall tool")
            self.run_on_host(host, install_script(firewalls[host], support.backend), "firewall")
            return support.backend

        done = run_on_hosts({h: h for h in firewalls}, install)
        failed = done.failed
        if failed:
            detail = "; ".join(f"{h}: {e}" for h, e in sorted(failed.items()))
            raise BackendError(f"could not install the firewall rules: {detail}")
        say(
            "firewall: only the cluster's addresses reach its ports on "
            + ", ".join(f"{h} ({kind})" for h, kind in sorted(done.succeeded.items()))
        )
        return allocation

    def _start_seeds(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        allocation: Allocation,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """A warm seed on each host of ``tasks`` that has Python tasks and no live seed that
        can fork them; one that cannot start is said, and that host's tasks start cold."""
        seeds = allocation_seeds(allocation)
        alive = self._seeds_alive(list(seeds.values()))
        wanted: dict[str, Task] = {}
        for task in tasks:
            if task.host in wanted or not runs_python_code(task.command):
                continue
            seed = seeds.get(task.host)
            if seed is not None and alive.get(seed.host) and forkable(seed, task.command, task.env):
                continue
            wanted[task.host] = task
        if not wanted:
            return allocation
        stale = [seeds[h] for h in wanted if h in seeds]
        if stale:
            run_on_hosts({s.host: s for s in stale}, lambda s: self.stop_seed(s, 1.0))
        root = posixpath.join(posixpath.dirname(plan.code_dir), "_seed")

        def start(task: Task) -> WarmSeed:
            folder = posixpath.join(root, _safe(task.host))
            return self.start_seed(
                task.host, folder, task.command[0], seed_env(task.command, task.env)
            )

        done = run_on_hosts(wanted, start)
        for host, error in sorted(done.failed.items()):
            say(f"warm seed on {host} could not start ({error}); its tasks start cold")
        seeds.update(done.succeeded)
        allocation = replace(
            allocation,
            data={**allocation.data, SEEDS_KEY: [s.to_dict() for s in seeds.values()]},
        )
        submitted(allocation)
        return allocation

    def _seeds_alive(self, seeds: Sequence[WarmSeed]) -> dict[str, bool]:
        if not seeds:
            return {}

        def look(seed: WarmSeed) -> bool:
            info = self.pool[seed.host].status([seed.pid]).get(seed.pid)
            return info is not None and info.alive

        looked = run_on_hosts({s.host: s for s in seeds}, look)
        return {h: bool(v) for h, v in looked.succeeded.items()}

    def release(self, allocation: Allocation) -> None:
        """Stop the experiment's warm seeds and remove the firewall rules it installed
        (idempotent; the tasks the seeds forked have ended already).

        Raises:
            BackendError: a seed or a host's rules could not be confirmed gone.
        """
        problems: dict[str, str] = {}
        seeds = allocation_seeds(allocation)
        if seeds:
            stopped = run_on_hosts(seeds, lambda s: self.stop_seed(s, SEED_STOP_GRACE_SECS))
            problems.update({h: f"warm seed: {e}" for h, e in stopped.failed.items()})
        hosts = allocation.data.get("firewall") or []
        experiment = str(allocation.data.get("experiment", ""))
        if hosts and experiment:
            script = remove_script(experiment)
            failed = run_on_hosts(
                {h: h for h in hosts}, lambda h: self.run_on_host(h, script, "firewall")
            ).failed
            problems.update({h: f"firewall rules: {e}" for h, e in failed.items()})
        if problems:
            detail = "; ".join(f"{h}: {e}" for h, e in sorted(problems.items()))
            raise BackendError(f"could not release everything: {detail}")

    def stage(self, plan: Plan, tasks: Sequence[Task], allocation: Allocation) -> None:
        """Copy the recipes package to every host (built-in recipes), and each task's run.yaml
        to its workdir.

        Raises:
            BackendError: a host could not be written, naming each.
        """
        config = run_yaml(plan)
        hosts = sorted({t.host for t in tasks})

        def ship(name: str) -> None:
            transport = self.pool[name]
            ship_code(plan, transport)
            for task in (t for t in tasks if t.host == name):
                transport.write_file(posixpath.join(task.workdir, "run.yaml"), config)

        failures = run_on_hosts({h: h for h in hosts}, ship).failed
        if failures:
            detail = "; ".join(f"{h}: {why}" for h, why in sorted(failures.items()))
            raise BackendError(f"could not copy the code and run config: {detail}")

    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        transport = self.pool[request.host]
        if request.keep_log_as:
            transport.move(request.log_path, request.keep_log_as)
        # SSH sends the whole environment inside one `sh -c` script: TF_CONFIG shares its limit
        ssh = transport.target.kind == "ssh"
        delivery = deliver(
            request, overhead=shell_bytes(request.command, request.env) if ssh else 0
        )
        for path, text in delivery.files.items():
            transport.write_file(path, text.encode())
        exit_file = standby_exit_file(request.workdir, request.attempt) if request.standby else None
        seed = self._seeds.get(request.host) or allocation_seeds(allocation).get(request.host)
        env = {**request.env, "TF_CONFIG": request.tf_config} if request.tf_config else request.env
        note = ""
        if seed is not None and forkable(seed, request.command, env):
            forked = self._fork(seed, request, env, exit_file)
            if isinstance(forked, Launched):
                return forked
            note = f"a cold start: the warm seed on {request.host} {forked}"
        started = transport.start(
            LaunchSpec(
                name=request.name,
                command=delivery.command,
                env=delivery.env,
                workdir=request.workdir,
                log_path=request.log_path,
                exit_file=exit_file,
            )
        )
        handle: dict[str, object] = {"pid": started.pid, "pgid": started.pgid}
        if exit_file is not None:
            handle["exit_file"] = exit_file
        return Launched(
            handle=handle,
            host=request.host,
            address=transport.target.address,
            started_at=started.started_at,
            note=note,
        )

    # ---- warm seeds (a sweep's; docs/sweeps.md) ---------------------------------------------
    def start_seed(self, host: str, folder: str, python: str, env: dict[str, str]) -> WarmSeed:
        """Start a warm seed on ``host`` (it imports :data:`PRELOAD`, then waits for requests).

        Raises:
            BackendError: the host could not start it.
        """
        transport = self.pool[host]
        seed = WarmSeed(host, 0, 0, folder, python, dict(env))
        transport.write_file(seed.agent_path, AGENT_SOURCE.encode())
        started = transport.start(
            LaunchSpec(
                name="seed",
                command=(python, seed.agent_path, folder, *PRELOAD),
                env=dict(env),
                workdir=folder,
                log_path=seed.log_path,
            )
        )
        return replace(seed, pid=started.pid, pgid=started.pgid)

    def seed_ready(self, seed: WarmSeed) -> bool:
        """Whether the seed has imported what it preloads (it answers requests from then on)."""
        data, _ = self.pool[seed.host].read_log(seed.ready_path)  # missing: not yet
        return bool(data)

    def stop_seed(self, seed: WarmSeed, grace_secs: float = 5.0) -> None:
        """Stop a seed by its process group (the tasks it forked have groups of their own).

        Raises:
            BackendError: the group survived SIGKILL or the host is unreachable.
        """
        self.pool[seed.host].stop(seed.pid, seed.pgid, grace_secs)

    def use_seeds(self, seeds: Sequence[WarmSeed]) -> None:
        """Fork the tasks this backend launches from these seeds, where they can start them."""
        self._seeds = {seed.host: seed for seed in seeds}

    def free_bytes(self, host: str, folder: str) -> int | None:
        """This machine's free space for a local host, ``df`` over SSH for another."""
        if host not in self.pool.targets:
            return None
        if self.pool.targets[host].kind == "local":
            path = folder
            while path and not os.path.exists(path) and os.path.dirname(path) != path:
                path = os.path.dirname(path)  # a folder removed since: its disk is its parent's
            try:
                return shutil.disk_usage(path).free
            except OSError:
                return None
        try:
            out = self.run_on_host(host, f"df -Pk {q(folder)} | tail -n 1", "df")
            return int(out.split()[3]) * 1024
        except (BackendError, ValueError, IndexError):
            return None

    @classmethod
    def runs_here(cls, plan: Plan) -> bool:
        return all(h.address in LOCAL_ADDRESSES for h in plan.hosts)

    def starts_warm(self, host: str, allocation: Allocation | None = None) -> bool:
        return host in self._seeds or (
            allocation is not None and host in allocation_seeds(allocation)
        )

    def _fork(
        self, seed: WarmSeed, request: LaunchRequest, env: dict[str, str], exit_file: str | None
    ) -> Launched | str:
        """``request`` forked from ``seed``, or why it could not be (the seed is gone, did not
        answer within the wait, or failed to fork): the caller starts it the usual way."""
        transport = self.pool[request.host]
        began = time.time()
        exit_path = exit_file or exit_file_of(request.workdir)
        token = f"{request.name.replace('/', '-')}-{uuid.uuid4().hex[:8]}"
        payload = fork_request(request.command, env, request.workdir, request.log_path, exit_path)
        try:
            answer = transport.run_script(
                fork_script(seed.requests, token, seed.pgid, FORK_WAIT_SECS),
                f"fork {request.name} from the warm seed",
                stdin=payload,
                timeout=FORK_WAIT_SECS + 30.0,
            )
        except BackendError as error:  # the script says why last: "is gone", "did not answer"
            return str(error).rsplit(" failed: ", 1)[-1]
        text = answer.stdout.decode().strip()
        if not text.isdigit():
            return f"could not fork it ({text or 'no answer'})"
        pid = int(text)
        handle: dict[str, object] = {"pid": pid, "pgid": pid, "forked": True}
        if exit_file is not None:
            handle["exit_file"] = exit_file
        return Launched(
            handle=handle, host=request.host, address=transport.target.address, started_at=began
        )

    # ---- observe and control -------------------------------------------------------------
    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        """What each host's watcher reported where it can answer; otherwise one ``ps`` per
        host for all of its tasks, every host at once."""
        by_host = _by_host(tasks)

        def ask(mine: list[TaskRecord]) -> dict[int, ProcessInfo]:
            return self.pool[mine[0].host].status(
                [_pid(t) for t in mine],
                exit_files=[handle_exit_file(t.handle, t.workdir) for t in mine],
            )

        out: dict[str, TaskInfo] = {}
        # what the hosts' watchers reported needs no round trip (nor a thread)
        for host in list(by_host):
            mine = by_host[host]
            heard = self.pool[host].heard_status(
                [_pid(t) for t in mine], [handle_exit_file(t.handle, t.workdir) for t in mine]
            )
            if heard is not None:
                for task in by_host.pop(host):
                    out[task.name] = _info(heard.get(_pid(task)), host)
        for host, result in run_on_hosts(by_host, ask).items():
            for task in by_host[host]:
                if isinstance(result, Exception):
                    out[task.name] = TaskInfo(TaskPhase.UNREACHABLE, host=host, error=str(result))
                else:
                    out[task.name] = _info(result.get(_pid(task)), host)
        return out

    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """One script per host stops all of that host's tasks; every host at once."""
        by_host = _by_host(tasks)

        def stop(mine: list[TaskRecord]) -> dict[int, object]:
            groups = [(_pid(t), int(t.handle["pgid"])) for t in mine]
            return dict(self.pool[mine[0].host].stop_groups(groups, grace_secs))

        out: dict[str, CancelResult | Exception] = {}
        for host, result in run_on_hosts(by_host, stop).items():
            for task in by_host[host]:
                got = result if isinstance(result, Exception) else result[int(task.handle["pgid"])]
                if isinstance(got, Exception):
                    out[task.name] = got
                else:
                    assert isinstance(got, StopResult)
                    out[task.name] = CancelResult(got.outcome, got.elapsed_secs)
        return out

    def signal(self, task: TaskRecord, name: str) -> None:
        """``kill -NAME -PGID`` on the task's host: the program gets it; the wrapper traps it."""
        self.pool[task.host].signal(int(task.handle["pgid"]), name)

    def move_logs(self, task: TaskRecord, moves: Sequence[tuple[str, str]]) -> None:
        self.pool[task.host].move_all(moves)

    def stream_log(self, task: TaskRecord, on_line: Callable[[str], None]) -> LogStream:
        return self.pool[task.host].stream_log(
            task.log_path,
            _pid(task),
            on_line,
            exit_file=handle_exit_file(task.handle, task.workdir),
            pgid=int(task.handle["pgid"]),
        )

    def read_log(self, task: TaskRecord, offset: int = 0, max_bytes: int = 16 << 20) -> bytes:
        data, _ = self.pool[task.host].read_log(task.log_path, offset, max_bytes)
        return data

    def oom_kills(self, task: TaskRecord) -> list[dict[str, object]]:
        """From the host's kernel log (root, or ``kernel.dmesg_restrict=0``)."""
        return self.pool[task.host].oom_kills(task.started_at)

    def tell(self, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
        """One write per task, every host at once."""
        by_host = _by_host(tasks)

        def write(mine: list[TaskRecord]) -> None:
            for task in mine:
                self.pool[task.host].write_file(posixpath.join(task.workdir, name), data)

        for host, result in run_on_hosts(by_host, write).items():
            if isinstance(result, BaseException):
                raise BackendError(f"could not write {name} on {host}: {result}")

    def listening(self, tasks: Sequence[TaskRecord]) -> set[str] | None:
        """The kernel's table of listening TCP sockets, read once per host, every host at
        once; a host that cannot be read counts as unknown (its tasks are left out)."""
        by_host = _by_host([t for t in tasks if t.port is not None])

        def look(mine: list[TaskRecord]) -> set[int]:
            return listening_ports(self.run_on_host(mine[0].host, LISTENING_SCRIPT, "listening"))

        seen: set[str] = set()
        for host, result in run_on_hosts(by_host, look).items():
            if not isinstance(result, BaseException):
                seen.update(t.name for t in by_host[host] if t.port in result)
        return seen

    def read_log_tails(
        self, tasks: Sequence[TaskRecord], max_bytes: int
    ) -> dict[str, bytes | Exception]:
        """One round trip per host for all of its tasks' logs, every host at once."""
        by_host = _by_host(tasks)

        def read(mine: list[TaskRecord]) -> list[bytes]:
            return self.pool[mine[0].host].read_tails([t.log_path for t in mine], max_bytes)

        out: dict[str, bytes | Exception] = {}
        for host, result in run_on_hosts(by_host, read).items():
            for i, task in enumerate(by_host[host]):
                out[task.name] = result if isinstance(result, Exception) else result[i]
        return out

    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        host = near if near in self.pool.targets else self.hosts[0].name
        data, _ = self.pool[host].read_log(path, 0)
        return data or None

    def handle_text(self, task: TaskRecord) -> str:
        return f"pid {task.handle.get('pid')}"

    def close(self) -> None:
        self.pool.close()

    # ---- for the firewall and other host-level features ----------------------------------
    def run_on_host(self, host: str, script: str, what: str) -> str:
        """Run a POSIX sh script on one host; its stdout. Raises BackendError on failure."""
        return self.pool[host].run_script(script, what).stdout.decode(errors="replace")


# What fetch_outputs leaves on the host: checkpoints (TF1 and TF2 names, whatever the prefix),
# the shared-folder markers, files being written, and anything of FETCH_MAX_KIB or more.
FETCH_SKIP = (
    "checkpoint",
    "*.ckpt-*",
    "*.data-?????-of-?????",
    "*.index",
    "*.meta",
    f"{SHARED_MARKER}*",
    "*.tmp.*",
)
FETCH_MAX_KIB = 64 * 1024


def unpack_tree(data: bytes, dest: Path) -> int:
    """Unpack a gzipped tar of plain files into ``dest`` (nothing outside it); how many files."""
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in tar.getmembers():
            target = (dest / member.name).resolve()
            if not member.isfile() or not target.is_relative_to(dest.resolve()):
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, source.read())
            count += 1
    return count


def _check_evaluator_beside(plan: Plan, chief: Task) -> None:
    """Per-host output: the evaluator reads the chief's checkpoints, so it must run on the
    chief's host (the planner put it there unless that host was full).

    Raises:
        PreflightError: it was planned elsewhere.
    """
    for task in plan.tasks:
        if task.role.value == "evaluator" and task.host != chief.host:
            raise PreflightError(
                {
                    task.host: f"{task.name} is planned here and {chief.name} on "
                    f"{chief.host}, but the hosts share no output folder and the evaluator "
                    f"reads the chief's checkpoints: give {chief.host} a free cpu slot (it "
                    "then runs there), mount output_dir on every host, or set "
                    "cluster.evaluator=false"
                }
            )


def _firewalls(plan: Plan) -> dict[str, HostFirewall]:
    """Each host's rules: the ports of its own tasks, open to every host of the cluster.

    Raises:
        ConfigError: a host's address is not an IP address (rules need addresses).
    """
    tasks = [(t.host, plan.address_of(t) or t.host, t.port) for t in plan.tasks]
    return cluster_firewalls(plan.experiment_id, tasks)


def _by_host(tasks: Sequence[TaskRecord]) -> dict[str, list[TaskRecord]]:
    """The tasks of each host, in order: what one round trip per host works on."""
    by_host: dict[str, list[TaskRecord]] = {}
    for task in tasks:
        by_host.setdefault(task.host, []).append(task)
    return by_host


def _pid(task: TaskRecord) -> int:
    return int(task.handle["pid"])


def _info(info: ProcessInfo | None, host: str) -> TaskInfo:
    if info is None:
        return TaskInfo(TaskPhase.FAILED, host=host, detail="missing")
    if not info.alive and info.exit_code is None and info.left:
        # The wrapper died first: no exit code will ever be recorded; the rest of the group
        # (the program) is stopped by group before the task starts again.
        return TaskInfo(
            TaskPhase.FAILED,
            host=host,
            detail=f"wrapper gone, {info.left} process(es) of its group still running",
        )
    if info.alive:
        return TaskInfo(
            TaskPhase.RUNNING,
            host=host,
            detail=info.state,
            cpu_percent=info.cpu_percent,
            rss_bytes=info.rss_bytes,
        )
    phase = TaskPhase.SUCCEEDED if info.exit_code == 0 else TaskPhase.FAILED
    return TaskInfo(phase, exit_code=info.exit_code, host=host, detail=info.state)


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
