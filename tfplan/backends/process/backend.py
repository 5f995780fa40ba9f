""":class:`ProcessBackend`: the tasks' lifecycle on the listed hosts (preflight, allocate,
stage, launch, observe, stop, release), one transport per host. It delegates plan time, the
firewall, warm seeds and the output folder to the package's other modules; its handles are
described in :mod:`tfplan.backends.process`.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from tfplan.backends import leftovers
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
)
from tfplan.backends.delivery import deliver, shell_bytes
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.process import firewall, memory, outputs, running, seeds, shell
from tfplan.backends.process.target import LOCAL_ADDRESSES, plan_target
from tfplan.backends.staging import run_yaml, ship_code
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.preflight import (
    PreflightRequest,
    PreflightResult,
    raise_for_preflight,
)
from tfplan.backends.transports.scripts import handle_exit_file, standby_exit_file
from tfplan.backends.transports.seeds import WarmSeed, forkable, worth_a_seed
from tfplan.backends.transports.specs import HostTarget, LaunchSpec
from tfplan.errors import BackendError
from tfplan.planning.footprint import plan_ps_bytes
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord
from tfplan.planning.topology import Target

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig
    from tfplan.planning.context import PlanContext

__all__ = ["LAUNCH_FANOUT", "ProcessBackend"]

# starts at once: over SSH each is a round trip of a few ms; locally a fork+exec
LAUNCH_FANOUT = 16


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
        sweep_seeds=True,
    )

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        super().__init__(ref, scratch)
        self.hosts = [HostTarget(**h) for h in ref.config.get("hosts", [])]
        self.firewall = bool(ref.config.get("firewall", False))
        self.pool = TransportPool(self.hosts)
        self._output: dict[tuple[str, str, tuple[str, ...]], OutputPlace] = {}
        self._seeds: dict[str, WarmSeed] = {}  # a sweep's (use_seeds)
        self.warm = bool(ref.config.get("warm", True))
        self.warm_keep_secs = seeds.keep_secs(ref.config.get("warm_keep_secs"), os.environ)

    # ---- plan time (tfplan.backends.process.target) --------------------------------------
    @classmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """The listed hosts as places; each host's transport and interpreter resolved.

        Raises:
            ConfigError: no hosts, duplicate names/addresses, bad slots, ports or transport, or
                relative folders on a cluster with remote hosts.
        """
        return plan_target(cls.name, cluster, ctx)

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        """With ``cluster.firewall``: the rules each host will get."""
        return firewall.dryrun_lines(plan)

    # ---- apply ---------------------------------------------------------------------------
    def locate_output(self, plan: Plan, tasks: Sequence[Task]) -> OutputPlace:
        """Loopback hosts only: this machine's folder. ``output_mode=per_host``: each host's
        own. Otherwise every host of ``tasks`` writes a marker in ``output_dir`` unless one is
        there and reads it back (:func:`~tfplan.backends.process.outputs.locate`); this machine
        only looks. Asked once per plan, hosts and backend (preflight asks too).

        Raises:
            PreflightError: a host cannot be reached or cannot create the folder, or the
                hosts share it in a way the mode does not allow.
        """
        hosts = tuple(sorted({t.host for t in tasks}))
        key = (plan.output_dir, plan.output_mode, hosts)
        if key not in self._output:
            self._output[key] = outputs.locate(self.pool, plan, hosts)
        return self._output[key]

    def fetch_outputs(self, folder: str, near: str | None, dest: Path) -> int:
        """One gzipped tar of ``folder`` on ``near`` (checkpoints, markers, the ``tfplan``
        record and files of 64 MiB or more left out), unpacked into ``dest``.

        Raises:
            BackendError: the host could not be read.
        """
        return outputs.fetch(self.pool[self._near(near)], folder, dest)

    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> list[PreflightResult]:
        """Per host: python, TensorFlow (built-in recipes), free ports, writable folders, a
        memory cgroup tfplan can make (where a task has a limit: ``cluster.memory``); and
        whether the hosts share the output folder as ``cluster.output_mode`` requires
        (:meth:`locate_output`). Returns each host's answer.

        Raises:
            PreflightError: every host's problems, in one line.
        """
        self.locate_output(plan, tasks)
        held = plan_ps_bytes(plan)  # what each ps holds at least (its memory is checked)

        def check(name: str) -> PreflightResult:
            mine = [t for t in tasks if t.host == name]
            ps = [t for t in mine if t.role.value == "ps" and t.index < len(held)]
            request = PreflightRequest(
                tf_version=plan.tf_version if plan.builtin_recipes else None,
                ports=tuple(t.port for t in mine if t.port is not None),
                writable_dirs=(*(t.workdir for t in mine), plan.code_dir, plan.output_dir),
                legacy_keras=any(t.env.get("TF_USE_LEGACY_KERAS") == "1" for t in mine),
                gpus=len({d for t in mine for d in t.devices}),
                ps_names=tuple(t.name for t in ps),
                ps_bytes=sum(held[t.index] for t in ps),
            )
            result = self.pool[name].preflight(request)
            problems = [
                memory.support_problem(self.pool, name, plan, tasks) if result.ok else None,
                firewall.support_problem(self.pool, name) if self.firewall else None,
            ]
            if any(problems):
                result = replace(result, problems=(*result.problems, *filter(None, problems)))
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
            allocation = firewall.install(self.pool, plan, allocation, say, submitted)
        if self.warm and not self._seeds:  # a sweep's own seeds come first
            allocation = seeds.start_seeds(
                self.pool, plan, tasks, allocation, say, submitted, self.warm_keep_secs
            )
        kept = memory.record(leftovers.record(allocation, plan), plan, tasks)
        if kept != allocation:
            allocation = kept
            submitted(allocation)
        return allocation

    def release(self, allocation: Allocation) -> None:
        """Stop the experiment's warm seeds, remove the firewall rules it installed, what
        its parameter servers left on their hosts (in-memory snapshots:
        :mod:`tfplan.backends.leftovers`) and its tasks' memory cgroups; idempotent, the tasks
        have ended already.

        Raises:
            BackendError: a seed, a host's rules or a memory cgroup could not be confirmed
                gone (a cgroup that still holds a process is left, and named).
        """
        problems: dict[str, str] = {}
        problems.update(seeds.stop_seeds(self.pool, allocation))
        problems.update(firewall.remove(self.pool, allocation))
        known = {h.name for h in self.hosts}
        for host, problem in memory.remove(self.pool, allocation, sorted(known)).items():
            problems[host] = f"{problems[host]}; {problem}" if host in problems else problem
        left = {h: p for h, p in leftovers.leftovers(allocation).items() if h in known}

        def remove(host: str) -> None:
            self.pool[host].run_script(
                leftovers.remove_script(left[host]), f"remove {', '.join(left[host])}"
            )

        removed = run_on_hosts({h: h for h in left}, remove)
        problems.update({h: f"leftovers: {e}" for h, e in removed.failed.items()})
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
        # a remote start (SSH, a Spark executor's agent) sends the whole environment inside one
        # `sh -c` script: TF_CONFIG shares its limit
        remote = transport.target.resolved_kind() != "local"
        delivery = deliver(
            request, overhead=shell_bytes(request.command, request.env) if remote else 0
        )
        for path, text in delivery.files.items():
            transport.write_file(path, text.encode())
        exit_file = standby_exit_file(request.workdir, request.attempt) if request.standby else None
        seed = self._seeds.get(request.host) or seeds.allocation_seeds(allocation).get(request.host)
        env = {**request.env, "TF_CONFIG": request.tf_config} if request.tf_config else request.env
        note = ""
        cgroup = memory.group_of(request) if request.memory_limit is not None else ""
        if (
            seed is not None
            and forkable(seed, request.command, env)
            and worth_a_seed(request.command, request.workdir)
        ):
            # the delivery's environment: TF_CONFIG, or TF_CONFIG_FILE when it is too large to
            # pass on to what the task starts (the seed reads the file in, as the launcher does)
            forked = seeds.fork(self.pool, seed, request, delivery.env, exit_file, cgroup)
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
                memory_limit=request.memory_limit,
                cgroup=cgroup,
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

    # ---- warm seeds (a sweep's; docs/sweeps.md; tfplan.backends.process.seeds) -------------
    def start_seed(
        self, host: str, folder: str, python: str, env: dict[str, str], keras: bool = True
    ) -> WarmSeed:
        """Start a warm seed on ``host`` (it imports ``PRELOAD``, then waits for requests).

        Raises:
            BackendError: the host could not start it.
        """
        return seeds.start_seed(self.pool, host, folder, python, env, keras)

    def seed_ready(self, seed: WarmSeed) -> bool:
        """Whether the seed has imported what it preloads (it answers requests from then on)."""
        return seeds.seed_ready(self.pool, seed)

    def stop_seed(self, seed: WarmSeed, grace_secs: float = 5.0) -> None:
        """Stop a seed by its process group (the tasks it forked have groups of their own).

        Raises:
            BackendError: the group survived SIGKILL or the host is unreachable.
        """
        seeds.stop_seed(self.pool, seed, grace_secs)

    def use_seeds(self, seeds: Sequence[WarmSeed]) -> None:
        """Fork the tasks this backend launches from these seeds, where they can start them."""
        self._seeds = {seed.host: seed for seed in seeds}

    def allocation_text(self, allocation: Allocation) -> str | None:
        held = seeds.allocation_seeds(allocation)
        if not held:
            return allocation.id
        return "warm seed " + ", ".join(
            f"{h} (pid {s.pid}{', kept' if s.kept else ''})" for h, s in sorted(held.items())
        )

    def starts_warm(self, host: str, allocation: Allocation | None = None) -> bool:
        return host in self._seeds or (
            allocation is not None and host in seeds.allocation_seeds(allocation)
        )

    def free_bytes(self, host: str, folder: str) -> int | None:
        """This machine's free space for a local host, ``df`` over SSH for another."""
        return shell.free_bytes(self.pool, host, folder)

    @classmethod
    def runs_here(cls, plan: Plan) -> bool:
        return all(h.address in LOCAL_ADDRESSES for h in plan.hosts)

    # ---- observe and control (tfplan.backends.process.running) ----------------------------
    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        """What each host's watcher reported where it can answer; otherwise one ``ps`` per
        host for all of its tasks, every host at once."""
        return running.describe(self.pool, tasks)

    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """One script per host stops all of that host's tasks; every host at once."""
        return running.cancel(self.pool, tasks, grace_secs)

    def signal(self, task: TaskRecord, name: str) -> None:
        """``kill -NAME -PGID`` on the task's host: the program gets it; the wrapper traps it."""
        self.pool[task.host].signal(int(task.handle["pgid"]), name)

    def move_logs(self, task: TaskRecord, moves: Sequence[tuple[str, str]]) -> None:
        self.pool[task.host].move_all(moves)

    def stream_log(self, task: TaskRecord, on_line: Callable[[str], None]) -> LogStream:
        return self.pool[task.host].stream_log(
            task.log_path,
            running.pid(task),
            on_line,
            exit_file=handle_exit_file(task.handle, task.workdir),
            pgid=int(task.handle["pgid"]),
            adopt=running.adopts(task),
        )

    def read_log(self, task: TaskRecord, offset: int = 0, max_bytes: int = 16 << 20) -> bytes:
        data, _ = self.pool[task.host].read_log(task.log_path, offset, max_bytes)
        return data

    def oom_kills(self, task: TaskRecord) -> list[dict[str, object]]:
        """From the host's kernel log (root, or ``kernel.dmesg_restrict=0``)."""
        return self.pool[task.host].oom_kills(task.started_at)

    def tell(self, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
        """One write per task, every host at once."""
        running.tell(self.pool, tasks, name, data)

    def listening(self, tasks: Sequence[TaskRecord]) -> set[str] | None:
        """The kernel's table of listening TCP sockets, read once per host, every host at
        once; a host that cannot be read counts as unknown (its tasks are left out)."""
        return running.listening(self.pool, tasks)

    def read_log_tails(
        self, tasks: Sequence[TaskRecord], max_bytes: int
    ) -> dict[str, bytes | Exception]:
        """One round trip per host for all of its tasks' logs, every host at once."""
        return running.read_log_tails(self.pool, tasks, max_bytes)

    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        data, _ = self.pool[self._near(near)].read_log(path, 0)
        return data or None

    def handle_text(self, task: TaskRecord) -> str:
        return f"pid {task.handle.get('pid')}"

    def close(self) -> None:
        self.pool.close()

    # ---- for the firewall and other host-level features ----------------------------------
    def run_on_host(self, host: str, script: str, what: str) -> str:
        """Run a POSIX sh script on one host; its stdout. Raises BackendError on failure."""
        return shell.run_on_host(self.pool, host, script, what)

    def _near(self, near: str | None) -> str:
        """``near`` where it is one of the hosts, else the first host."""
        return near if near in self.pool.targets else self.hosts[0].name
