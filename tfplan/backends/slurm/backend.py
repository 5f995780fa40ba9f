"""The Slurm backend: one job holds the allocation, every task is a step inside it.

- ``allocate``: ``sbatch`` a holder job (``sleep infinity``) asking for the nodes; wait for it
  to run (saying why it pends; Ctrl-C or a failure cancels it); bind the plan's ``node-<i>``
  places to the job's nodes and their addresses.
- ``launch``: ``srun --jobid=JOB --overlap -N1 -n1 -w NODE ... <command>`` started detached on
  the submit host through the local transport, so the step lives on when tfplan exits; srun
  forwards the task's output into the task's log and exits with the task's exit code, which
  the local wrapper records.
- ``cancel``: ``scancel --signal=TERM JOB.STEP`` (signalling srun itself would SIGKILL the task
  at once), then ``scancel JOB.STEP`` after the grace period.
- ``release``: what the parameter servers left on their nodes is removed (one step per node:
  :mod:`tfplan.backends.leftovers`), then ``scancel JOB``; nothing stays queued or held.
- a warm standby is a step of its own (``ps-0.1-standby``); ``signal`` is
  ``scancel --signal=USR1 JOB.STEP``; logs are files on the submit host.
- warm starts (``cluster.warm``, the default): a seed step per node imports TensorFlow as
  soon as the job runs, and each Python task's step has it fork the program
  (:mod:`tfplan.backends.slurm.seeds`); ``release`` ends the seeds with the job.
- workers join a running elastic job as new steps of the same job while its nodes have free
  slots (``tasks_per_node``; the plan refuses more, with the fix), and leave through
  ``scancel --signal=USR2``; ``tell`` writes ``live.json`` into the shared workdirs.

Files: the workdir, code dir and output dir must be on a folder the submit host and every node
share (the usual home or project file system): run.yaml and the recipes are written there from
the submit host, and tfplan reads checkpoints and results there. ``stage`` checks every node
sees them before any task starts. Measured Slurm behaviours: docs/slurm_notes.md.

Handle: ``{"job", "node", "step" (the step's name), "pid", "pgid" (of the local wrapper of the
srun client, the leader of its process group)}``, and ``"exit_file"`` for a standby.
"""

from __future__ import annotations

import os
import posixpath
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
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
    Say,
    TaskInfo,
    TaskPhase,
)
from tfplan.backends.delivery import deliver
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.firewall import (
    cluster_firewalls,
    detect_script,
    install_script,
    parse_detect,
    remove_script,
)
from tfplan.backends.slurm import seeds
from tfplan.backends.slurm.commands import Slurm, SlurmUnreachable, last_line
from tfplan.backends.slurm.options import parse_options
from tfplan.backends.staging import run_yaml, ship_code
from tfplan.backends.transports.local import LocalTransport
from tfplan.backends.transports.preflight import (
    PREFLIGHT_SNIPPET,
    PreflightRequest,
    PreflightResult,
    parse_preflight_output,
    request_json,
)
from tfplan.backends.transports.scripts import handle_exit_file, standby_exit_file
from tfplan.backends.transports.seeds import WarmSeed
from tfplan.backends.transports.specs import HostTarget, LaunchSpec, ProcessInfo, StopResult
from tfplan.errors import BackendError, ConfigError, PreflightError
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord
from tfplan.planning.topology import Place, Target, Topology

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig
    from tfplan.planning.context import PlanContext

__all__ = ["SlurmBackend"]

POLL_SECS = 0.5
# while a job pends: squeue every 50 ms for its first seconds (a job usually starts at the
# scheduler's next pass, and every task's start waits on seeing it run), then every POLL_SECS
EAGER_POLL_SECS, EAGER_FOR_SECS = 0.05, 10.0
RELEASE_WAIT_SECS = 10.0
# Pending reasons that never resolve by waiting: the request does not fit the partition.
FATAL_REASONS = frozenset(
    {
        "PartitionConfig",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "JobLaunchFailure",
        "AccountNotAllowed",
        "QOSMaxNodePerJobLimit",
    }
)


class SlurmBackend(Backend):
    """Tasks as steps of one Slurm job (see the module docstring)."""

    name = "slurm"
    capabilities = Capabilities(
        firewall=True, standby=True, signals=True, launch_fanout=8, warm_starts=True
    )

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        super().__init__(ref, scratch)
        self.options = parse_options(ref.config.get("options", {}))
        self.firewall = bool(ref.config.get("firewall", False))
        self.warm = bool(ref.config.get("warm", True))
        self.slurm = Slurm()
        self.local = LocalTransport(HostTarget("submit-host", "127.0.0.1", python=sys.executable))

    # ---- plan time -----------------------------------------------------------------------
    @classmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """``nodes`` places named ``node-0``.. whose machines Slurm picks at apply time.

        Raises:
            ConfigError: hosts listed (Slurm picks them), or a bad option.
        """
        if cluster.hosts:
            raise ConfigError(
                "cluster.hosts",
                "the slurm backend lets Slurm pick the nodes",
                "remove cluster.hosts and set cluster.options.nodes",
            )
        options = parse_options(cluster.options)
        python = cluster.python or "python3"
        places = tuple(
            Place(f"node-{i}", None, options.tasks_per_node, options.gpus_per_node, python=python)
            for i in range(options.nodes)
        )
        ref = BackendRef(
            cls.name,
            {
                "options": options.to_dict(),
                "python": python,
                "firewall": cluster.firewall,
                "warm": cluster.warm,
            },
        )
        topology = Topology(
            places=places,
            places_key="cluster.options.nodes",
            slots_key="cluster.options.tasks_per_node",
        )
        return Target(ref, topology, resize_in_place=True, allocates="Slurm job")

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        """The sbatch request and how the tasks become steps."""
        options = parse_options(plan.backend.config.get("options", {}))
        used = [h.name for h in plan.hosts if any(t.host == h.name for t in plan.tasks)]
        lines = [
            "sbatch "
            + " ".join(options.sbatch_options(plan.experiment_id))
            + "  # holds the allocation (sleep infinity)",
            f"then one step per task on its node: srun --jobid=JOB --overlap --nodes=1 "
            f"--ntasks=1 --nodelist=NODE{' ' + ' '.join(options.srun_args) if options.srun_args else ''} <command>",
        ]
        if plan.backend.config.get("warm", True):
            lines.append(
                "warm starts: a step per node (tfplan-seed-NODE) imports TensorFlow once; each "
                "Python task's step has it fork the program (cluster.warm=false: cold steps)"
            )
        for position, host in enumerate(used):
            names = ", ".join(t.name for t in plan.tasks if t.host == host)
            lines.append(f"{host} = the job's node {position + 1} (known after apply): {names}")
        if plan.backend.config.get("firewall"):
            lines.append("firewall: each node admits only the job's nodes to its tasks' ports")
        return tuple(lines)

    # ---- apply ---------------------------------------------------------------------------
    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> tuple[()]:
        """Slurm answers, the partition exists, ``sbatch --test-only`` accepts the request, and
        the shared folders are writable here. Nothing is queued; the nodes are asked once they
        are known (:meth:`stage`).

        Raises:
            PreflightError: what is wrong, one line.
        """
        try:
            self.slurm.ping()
            partition = self.options.partition
            if partition is not None:
                known = self.slurm.partitions()
                if partition not in known:
                    raise PreflightError(
                        {
                            "slurm": f"cluster.options.partition: no partition {partition!r}; "
                            f"available: {', '.join(known) or 'none'}"
                        }
                    )
            refused = self.slurm.test_only(self.options.sbatch_options(plan.experiment_id))
        except SlurmUnreachable as error:
            raise PreflightError({"slurm": str(error)}) from None
        if refused is not None:
            raise PreflightError(
                {
                    "slurm": f"sbatch refuses the request ({refused}): fix cluster.options "
                    "(nodes, tasks_per_node, partition, time_limit, sbatch_args)"
                }
            )
        for folder in {plan.code_dir, plan.output_dir, *(t.workdir for t in tasks)}:
            _check_writable(folder)
        return ()

    def allocate(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        current: Allocation | None,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """Submit the holder job and wait until it runs; bind ``node-<i>`` to its nodes.

        Raises:
            BackendError: sbatch refused, the job cannot run (its reason), or it ended.
        """
        if current is not None and current.id and self._usable(current, plan):
            if self.warm:
                current = self._start_seeds(plan, tasks, current, say, submitted)
            return self._record_leftovers(current, plan, submitted)
        script = self.scratch / "allocation.sh"
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(
            "#!/bin/sh\n# tfplan: holds the allocation of experiment "
            f"{plan.experiment_id}; its tasks run as steps (srun --jobid)\nexec sleep infinity\n"
        )
        options = [
            *self.options.sbatch_options(plan.experiment_id),
            f"--output={self.scratch}/slurm-%j.out",
        ]
        job = self.slurm.submit(options, str(script))
        allocation = Allocation(id=job, data={"job": job, "experiment": plan.experiment_id})
        submitted(allocation)
        say(f"submitted Slurm job {job} ({self.options.nodes} node(s))")
        nodes = self._wait_running(job, say)
        addresses = self.slurm.node_addresses(nodes)
        wanted = [h.name for h in plan.hosts]
        if len(nodes) < len(wanted):
            raise BackendError(
                f"Slurm job {job} got {len(nodes)} node(s), the plan needs {len(wanted)}"
            )
        bound = {name: (nodes[i], addresses[nodes[i]]) for i, name in enumerate(wanted)}
        say(
            f"Slurm job {job} runs on {', '.join(nodes)}: "
            + ", ".join(f"{name}={node}" for name, (node, _) in bound.items())
        )
        allocation = Allocation(
            id=job,
            data={
                "job": job,
                "experiment": plan.experiment_id,
                "nodes": nodes,
                "request": self.options.sbatch_options(plan.experiment_id),
            },
            bound=bound,
        )
        if self.warm:
            allocation = self._start_seeds(plan, tasks, allocation, say, submitted)
        if self.firewall:
            allocation = self._install_firewall(plan, allocation, submitted, say)
        return self._record_leftovers(allocation, plan, submitted)

    @staticmethod
    def _record_leftovers(
        allocation: Allocation, plan: Plan, submitted: Callable[[Allocation], None]
    ) -> Allocation:
        kept = leftovers.record(allocation, plan)
        if kept != allocation:
            submitted(kept)
        return kept

    def _start_seeds(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        allocation: Allocation,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        job = str(allocation.id)
        return seeds.start_seeds(
            self.local,
            lambda node, name: self._step_words(job, node, name),
            plan,
            tasks,
            allocation,
            say,
            submitted,
        )

    def _step_words(self, job: str, node: str, name: str) -> list[str]:
        """``srun`` starting a step of one task on ``node`` inside the job."""
        return [
            "srun",
            f"--jobid={job}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            f"--job-name={name}",
            "--kill-on-bad-exit=0",
            *self.options.srun_args,
        ]

    def _usable(self, allocation: Allocation, plan: Plan) -> bool:
        """The recorded job still runs, binds every place of the plan and was asked for as the
        plan asks now (the planner restarted every task if not); a job that is not is
        cancelled, so that a new one never leaves the old one held."""
        requested = self.options.sbatch_options(plan.experiment_id)
        asked = allocation.data.get("request")
        job = str(allocation.id)
        state = self.slurm.job(job)
        if (
            state.state == "RUNNING"
            and all(h.name in allocation.bound for h in plan.hosts)
            and (asked is None or list(asked) == requested)
        ):
            return True
        if not state.gone:
            self.slurm.cancel([job])
        return False

    def _wait_running(self, job: str, say: Say) -> list[str]:
        began = time.monotonic()
        said = ""
        while True:
            state = self.slurm.job(job)
            if state.state == "RUNNING":
                return self.slurm.hostnames(state.nodes)
            if state.gone or state.state not in ("PENDING", "CONFIGURING"):
                final = state.state or self.slurm.final_state(job) or "gone"
                raise BackendError(
                    f"Slurm job {job} ended before it ran ({final}): see "
                    f"{self.scratch}/slurm-{job}.out"
                )
            if state.reason in FATAL_REASONS:
                raise BackendError(
                    f"Slurm job {job} can never run here ({state.reason}): the request is larger "
                    "than the partition allows; lower cluster.options.nodes/tasks_per_node or "
                    "pick another partition"
                )
            reason = state.reason if state.reason not in ("", "None") else "scheduling"
            news = f"Slurm job {job} is {state.state.lower()} ({reason})"
            if news != said:
                say(f"{news}; waiting (Ctrl-C cancels it)")
                said = news
            limit = self.options.pending_timeout_secs
            if limit is not None and time.monotonic() - began > limit:
                raise BackendError(
                    f"Slurm job {job} did not start within pending_timeout_secs={limit:.0f} "
                    f"({state.reason}); cancelled"
                )
            waited = time.monotonic() - began
            time.sleep(EAGER_POLL_SECS if waited < EAGER_FOR_SECS else POLL_SECS)

    def stage(
        self, plan: Plan, tasks: Sequence[Task], allocation: Allocation
    ) -> list[PreflightResult]:
        """Write the recipes and run.yaml into the shared folders, then check on every node
        that they are there (the folders are shared), TensorFlow is installed (built-in
        recipes), the ports are free and the folders writable.

        Raises:
            PreflightError: a node's problems, in one line.
        """
        ship_code(plan, self.local)
        config = run_yaml(plan)
        for task in tasks:
            self.local.write_file(posixpath.join(task.workdir, "run.yaml"), config)
        marker = uuid.uuid4().hex
        written = _write_marker(plan.output_dir, marker)
        try:
            failures, answers = self._check_nodes(plan, tasks, allocation, marker, written)
        finally:
            _remove_marker(plan.output_dir, marker)
        if failures:
            raise PreflightError(failures)
        return answers

    def _check_nodes(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        allocation: Allocation,
        marker: str,
        written: str,
    ) -> tuple[dict[str, str], list[PreflightResult]]:
        """node -> its problems: python, TensorFlow, ports, writable folders, and whether it
        sees the submit host's files (run.yaml, the shared-folder marker); and what each node
        that answered runs."""
        python = str(self.ref.config.get("python", "python3"))
        nodes = sorted({allocation.bound[t.host][0] for t in tasks})
        answers: list[PreflightResult] = []  # list.append is atomic across the threads

        def check(node: str) -> str | None:
            mine = [t for t in tasks if allocation.bound[t.host][0] == node]
            request = PreflightRequest(
                tf_version=plan.tf_version if plan.builtin_recipes else None,
                ports=tuple(t.port for t in mine if t.port is not None),
                writable_dirs=(plan.output_dir,),
                shared_dir=plan.output_dir,
                marker_token=marker,
                legacy_keras=any(t.env.get("TF_USE_LEGACY_KERAS") == "1" for t in mine),
                gpus=len({d for t in mine for d in t.devices}),
            )
            files = " ".join(_sh_quote(posixpath.join(t.workdir, "run.yaml")) for t in mine)
            script = (
                f'for f in {files}; do [ -r "$f" ] || echo "missing: $f" >&2; done; '
                f'exec "$0" -c "$1" "$2"'
            )
            done = self.slurm.run(
                "srun",
                f"--jobid={allocation.id}",
                "--overlap",
                "--nodes=1",
                "--ntasks=1",
                f"--nodelist={node}",
                f"--job-name=tfplan-preflight-{node}",
                "sh",
                "-c",
                script,
                python,
                PREFLIGHT_SNIPPET,
                request_json(request),
                check=False,
            )
            problems = [
                f"does not see {line.split(': ', 1)[1]} written by the submit host"
                for line in done.stderr.splitlines()
                if line.startswith("missing: ")
            ]
            try:
                result = parse_preflight_output(node, done.stdout, 0.0)
            except ValueError:
                return f"{python} failed there: {last_line(done.stderr)}"
            answers.append(result)
            problems += result.problems
            if result.shared_marker is not None and result.shared_marker != written:
                problems.append(f"does not see {plan.output_dir} as the submit host does")
            if problems and any("does not see" in p for p in problems):
                problems.append(
                    "the slurm backend needs workdir and output_dir on a folder the submit "
                    "host and every node share"
                )
            return "; ".join(problems) or None

        results = run_on_hosts({n: n for n in nodes}, check)
        failures = {node: str(result) for node, result in results.items() if result}
        return failures, sorted(answers, key=lambda a: a.host)

    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        if request.host not in allocation.bound:
            raise BackendError(
                f"{request.name}: {request.host} is not bound to a node of Slurm job "
                f"{allocation.id}: apply again"
            )
        node, address = allocation.bound[request.host]
        delivery = deliver(request)  # srun passes its environment on to the step
        step = f"{request.name.replace('/', '-')}.{request.attempt}"
        if request.standby:
            step += "-standby"
        if request.keep_log_as:
            self.local.move(request.log_path, request.keep_log_as)
        for path, text in delivery.files.items():  # the workdir is shared with the nodes
            self.local.write_file(path, text.encode())
        seed = seeds.allocation_seeds(allocation).get(request.host) if self.warm else None
        env = {**request.env, "TF_CONFIG": request.tf_config} if request.tf_config else request.env
        forked = seeds.fork_command(self.local, seed, request, env)
        srun = [
            *self._step_words(str(allocation.id), node, step),
            f"--chdir={request.workdir}",
            *(forked or delivery.command),
        ]
        exit_file = standby_exit_file(request.workdir, request.attempt) if request.standby else None
        started = self.local.start(
            LaunchSpec(
                request.name,
                tuple(srun),
                delivery.env,
                request.workdir,
                request.log_path,
                exit_file=exit_file,
            )
        )
        handle: dict[str, object] = {
            "job": str(allocation.id),
            "node": node,
            "step": step,
            "pid": started.pid,
            "pgid": started.pgid,
        }
        if exit_file is not None:
            handle["exit_file"] = exit_file
        if forked:
            handle["forked"] = True
        return Launched(handle=handle, host=node, address=address, started_at=started.started_at)

    def release(self, allocation: Allocation) -> None:
        """Remove firewall rules (if any), cancel the job, and wait until squeue forgets it."""
        if not allocation.id:
            return
        job = str(allocation.id)
        if self.firewall and allocation.data.get("firewall"):
            self._remove_firewall(allocation)
        self._remove_leftovers(allocation)
        self.slurm.cancel([job])
        problems = seeds.stop_seeds(self.local, allocation)  # their steps ended with the job
        if problems:
            detail = "; ".join(f"{h}: {e}" for h, e in sorted(problems.items()))
            raise BackendError(f"Slurm job {job}: {detail}")
        deadline = time.monotonic() + RELEASE_WAIT_SECS
        while time.monotonic() < deadline:
            if self.slurm.job(job).gone:
                return
            time.sleep(0.05)
        raise BackendError(
            f"Slurm job {job} is still listed {RELEASE_WAIT_SECS:.0f}s after scancel"
        )

    def _remove_leftovers(self, allocation: Allocation) -> None:
        """What the parameter servers left on their nodes (in-memory snapshots of a ps killed
        outright), removed through one step per node before the job ends; best effort: a job
        that ended outside tfplan has no step to run them in."""
        left = {
            allocation.bound[h][0]: paths
            for h, paths in leftovers.leftovers(allocation).items()
            if h in allocation.bound
        }
        if not left:
            return
        state = self.slurm.job(str(allocation.id))
        if state.state != "RUNNING":
            return
        run_on_hosts(
            {n: n for n in left},
            lambda node: self._on_node(
                allocation, node, leftovers.remove_script(left[node]), "tfplan-cleanup"
            ),
        )

    def allocation_text(self, allocation: Allocation) -> str | None:
        held = seeds.allocation_seeds(allocation)
        if not held:
            return allocation.id
        nodes = ", ".join(
            f"{allocation.bound[h][0] if h in allocation.bound else h}" for h in sorted(held)
        )
        return f"{allocation.id} (warm seeds on {nodes})"

    def starts_warm(self, host: str, allocation: Allocation | None = None) -> bool:
        """``host``: the plan's (``node-0``) or the node a task record names (``n1``)."""
        if not self.warm or allocation is None:
            return False
        held = seeds.allocation_seeds(allocation)
        return host in held or any(allocation.bound.get(h, ("",))[0] == host for h in held)

    def seed_ready(self, seed: WarmSeed) -> bool:
        return seeds.seed_ready(seed)

    def allocation_problem(self, allocation: Allocation) -> str | None:
        if not allocation.id:
            return None
        state = self.slurm.job(str(allocation.id))
        if state.state in ("RUNNING", "COMPLETING"):
            return None
        final = state.state or self.slurm.final_state(str(allocation.id)) or "gone"
        return f"Slurm job {allocation.id} ended outside tfplan ({final})"

    # ---- observe and control -------------------------------------------------------------
    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        """The srun clients (one ``ps`` on the submit host); a live client is a running step."""
        if not tasks:
            return {}
        try:
            infos = self.local.status([_pid(t) for t in tasks], exit_files=_exit_files(tasks))
        except BackendError as error:
            return {
                t.name: TaskInfo(TaskPhase.UNREACHABLE, host=t.host, error=str(error))
                for t in tasks
            }
        return {t.name: _info(infos.get(_pid(t)), t) for t in tasks}

    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """TERM each step through Slurm, wait up to the grace period, then cancel what is left
        (SIGKILL) and make sure no srun client remains.

        Whichever died first: a task whose local wrapper is gone while srun runs on is stopped
        with its process group (srun takes its remote task with it); a step still listed
        whose srun client is gone is cancelled too (Slurm kills a task whose srun dies, but
        the step is not left to that)."""
        began = time.monotonic()
        live = [t for t in tasks if self._alive(t)]
        ids = self._step_ids(tasks)
        self.slurm.cancel(sorted(ids[t.name] for t in live if t.name in ids), signal="TERM")
        deadline = time.monotonic() + grace_secs
        while time.monotonic() < deadline and any(self._alive(t) for t in live):
            time.sleep(0.1)
        left = [t for t in live if self._alive(t)]
        orphans = [t for t in tasks if t not in live and t.name in ids]
        self.slurm.cancel(sorted(ids[t.name] for t in (*left, *orphans) if t.name in ids))
        results: dict[str, CancelResult | Exception] = {}
        try:
            stops: dict[int, StopResult | BackendError] = self.local.stop_groups(
                [(_pid(t), int(t.handle["pgid"])) for t in tasks], 2.0
            )
        except BackendError as error:
            stops = {int(t.handle["pgid"]): error for t in tasks}
        for task in tasks:
            stopped = stops[int(task.handle["pgid"])]
            if isinstance(stopped, BackendError):
                results[task.name] = stopped
                continue
            outcome = "none" if task not in live else ("killed" if task in left else "terminated")
            if stopped.outcome == "killed":
                outcome = "killed"
            results[task.name] = CancelResult(outcome, time.monotonic() - began)
        return results

    def _step_ids(self, tasks: Sequence[TaskRecord]) -> dict[str, str]:
        """Task name -> ``JOB.STEP`` of each task whose step squeue still lists."""
        ids: dict[str, str] = {}
        for job in sorted({str(t.handle["job"]) for t in tasks}):
            steps = self.slurm.steps(job)
            for task in tasks:
                if str(task.handle["job"]) == job and task.handle["step"] in steps:
                    ids[task.name] = steps[task.handle["step"]]
        return ids

    def signal(self, task: TaskRecord, name: str) -> None:
        """``scancel --signal=NAME JOB.STEP``: straight to the task on its node."""
        step = self._step_ids([task]).get(task.name)
        if step is None:
            raise BackendError(
                f"{task.name}: step {task.handle.get('step')} of Slurm job "
                f"{task.handle.get('job')} is not running"
            )
        self.slurm.cancel([step], signal=name)

    def move_logs(self, task: TaskRecord, moves: Sequence[tuple[str, str]]) -> None:
        self.local.move_all(moves)

    def tell(self, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
        """Written from the submit host: every task's workdir is on the shared folder."""
        for task in tasks:
            self.local.write_file(posixpath.join(task.workdir, name), data)

    def _alive(self, task: TaskRecord) -> bool:
        info = self.local.status([_pid(task)], exit_files=_exit_files([task])).get(_pid(task))
        return info is not None and info.alive

    def stream_log(self, task: TaskRecord, on_line: Callable[[str], None]) -> LogStream:
        return self.local.stream_log(
            task.log_path,
            _pid(task),
            on_line,
            exit_file=_exit_files([task])[0],
            pgid=int(task.handle["pgid"]),
        )

    def read_log(self, task: TaskRecord, offset: int = 0, max_bytes: int = 16 << 20) -> bytes:
        data, _ = self.local.read_log(task.log_path, offset, max_bytes)
        return data

    def read_log_tails(
        self, tasks: Sequence[TaskRecord], max_bytes: int
    ) -> dict[str, bytes | Exception]:
        """Every log is on this machine (the shared workdir): one read for all."""
        try:
            tails = self.local.read_tails([t.log_path for t in tasks], max_bytes)
        except BackendError as error:
            return {t.name: error for t in tasks}
        return {t.name: tail for t, tail in zip(tasks, tails, strict=True)}

    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        try:
            return Path(path).read_bytes() or None
        except OSError:
            return None

    def handle_text(self, task: TaskRecord) -> str:
        return f"job {task.handle.get('job')} step {task.handle.get('step')}"

    def close(self) -> None:
        self.local.close()

    # ---- firewall on the nodes ----------------------------------------------------------
    def _on_node(
        self, allocation: Allocation, node: str, script: str, name: str = "tfplan-firewall"
    ) -> str:
        """Run ``script`` with ``sh`` on ``node``, as a step of the job named ``name``."""
        done = self.slurm.run(
            "srun",
            f"--jobid={allocation.id}",
            "--overlap",
            "--nodes=1",
            "--ntasks=1",
            f"--nodelist={node}",
            f"--job-name={name}",
            "sh",
            "-c",
            script,
            check=False,
        )
        if done.returncode != 0:
            raise BackendError(f"node {node}: {last_line(done.stderr or done.stdout)}")
        return done.stdout

    def _install_firewall(
        self, plan: Plan, allocation: Allocation, submitted: Callable[[Allocation], None], say: Say
    ) -> Allocation:
        rules = cluster_firewalls(
            plan.experiment_id,
            [
                (allocation.bound[t.host][0], allocation.bound[t.host][1], t.port)
                for t in plan.tasks
            ],
        )
        allocation = Allocation(
            id=allocation.id,
            data={**allocation.data, "firewall": sorted(rules)},
            bound=allocation.bound,
        )
        submitted(allocation)

        def install(node: str) -> str:
            support = parse_detect(self._on_node(allocation, node, detect_script()))
            if support.backend is None:
                raise BackendError(support.problem or "no firewall tool")
            self._on_node(allocation, node, install_script(rules[node], support.backend))
            return support.backend

        failed = run_on_hosts({n: n for n in rules}, install).failed
        if failed:
            detail = "; ".join(f"{n}: {e}" for n, e in sorted(failed.items()))
            raise BackendError(f"could not install the firewall rules: {detail}")
        say(f"firewall: only the job's nodes reach the tasks' ports on {', '.join(sorted(rules))}")
        return allocation

    def _remove_firewall(self, allocation: Allocation) -> None:
        script = remove_script(str(allocation.data.get("experiment", "")))
        nodes = list(allocation.data.get("firewall") or [])
        failed = run_on_hosts(
            {n: n for n in nodes}, lambda n: self._on_node(allocation, n, script)
        ).failed
        if failed:
            detail = "; ".join(f"{n}: {e}" for n, e in sorted(failed.items()))
            raise BackendError(f"could not remove the firewall rules: {detail}")


def _pid(task: TaskRecord) -> int:
    return int(task.handle["pid"])


def _exit_files(tasks: Sequence[TaskRecord]) -> list[str | None]:
    return [handle_exit_file(t.handle, t.workdir) for t in tasks]


def _info(info: ProcessInfo | None, task: TaskRecord) -> TaskInfo:
    if info is None:
        return TaskInfo(TaskPhase.FAILED, host=task.host, detail="srun client missing")
    if not info.alive and info.exit_code is None and info.left:
        return TaskInfo(
            TaskPhase.FAILED,
            host=task.host,
            detail=f"wrapper of srun gone, {info.left} local process(es) of its group running",
        )
    if info.alive:
        return TaskInfo(
            TaskPhase.RUNNING, host=task.host, detail=f"step {task.handle.get('step')} via srun"
        )
    phase = TaskPhase.SUCCEEDED if info.exit_code == 0 else TaskPhase.FAILED
    return TaskInfo(phase, exit_code=info.exit_code, host=task.host, detail="step ended")


def _check_writable(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
        probe = Path(folder) / f".tfplan-write-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        raise PreflightError(
            {
                "submit host": f"{folder} is not writable ({error.strerror}): the slurm backend "
                "writes the run config and reads results there; use a folder every node shares"
            }
        ) from None


def _write_marker(folder: str, token: str) -> str:
    """The shared-folder marker, written first by the submit host; returns its content."""
    content = f"{socket.gethostname()} {uuid.uuid4().hex}"
    path = Path(folder) / f".tfplan-shared-{token}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return content


def _remove_marker(folder: str, token: str) -> None:
    (Path(folder) / f".tfplan-shared-{token}").unlink(missing_ok=True)


def _sh_quote(value: str) -> str:
    import shlex

    return shlex.quote(value)
