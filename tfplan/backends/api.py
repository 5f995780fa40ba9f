"""The backend interface: where and how tasks run, whatever the engine underneath.

A backend turns the plan's tasks into running processes and reports on them. The engine
(apply, supervision, status, logs, destroy) speaks only this interface; the state keeps each
task's opaque ``handle`` and the backend's :class:`~tfplan.planning.plan.BackendRef`, so any
later ``tfplan`` process can reconnect to what an earlier one started.

Life of a task, as the engine drives it::

    Backend.target(cluster, ctx)        plan time, pure: options checked, places to put tasks
    Backend.dryrun(plan)                plan time, pure: the request it would make (shown, saved)
    backend = SomeBackend(ref, scratch)
    backend.preflight(plan, tasks)      everything that can be checked before anything starts
    backend.allocate(plan, ...)         scheduler-placed backends: ask for resources, bind hosts
    backend.stage(plan, tasks, alloc)   code, run config and TF_CONFIG files where tasks read them
    backend.launch(request, alloc)      one task -> Launched(handle, host, address)
    backend.describe(records)           phase, exit code, host, CPU, memory per task
    backend.stream_log / read_log       a task's output, followed or read
    backend.read_file(path, near)       a file a task wrote (result.json, checkpoint index)
    backend.locate_output(plan, tasks)  before apply: do the hosts (and this machine) share output_dir
    backend.fetch_outputs(dir, near, to) at the end: the chief's outputs copied to this machine
    backend.cancel(records, grace)      stop tasks: polite signal, then kill after ``grace``
    backend.release(alloc)              give the resources back (nothing stays queued)

Warm starts (``capabilities.warm_starts``): ``allocate`` starts one warm seed per host (a
process that has imported TensorFlow), ``launch`` forks Python tasks from it, ``release`` stops
it; a sweep starts its own (``start_seed``) and shares them between points (``use_seeds``).

Warm standbys (``capabilities.standby``): ``launch`` with ``LaunchRequest.standby`` starts a
second copy of a task that prepares and waits; ``signal(record, "USR1")`` tells it to go,
``move_logs`` makes its log the task's.

Public methods of :class:`Backend` are the contract; a backend implements the abstract ones and
may override the defaults. Every failure a user can act on is a :class:`~tfplan.errors.TfplanError`
with a one-line message. Backends register under the entry-point group ``tfplan.backends``
(see :mod:`tfplan.backends`), so a third party adds one without editing tfplan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from tfplan.backends.logstream import LogStream
from tfplan.backends.transports.seeds import WarmSeed
from tfplan.errors import BackendError
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord

if TYPE_CHECKING:  # the config schemas load OmegaConf: only plan time needs them
    from tfplan.backends.transports.preflight import PreflightResult
    from tfplan.config.schema import ClusterConfig
    from tfplan.planning.context import PlanContext
    from tfplan.planning.topology import Target

__all__ = [
    "Backend",
    "CancelResult",
    "Capabilities",
    "Launched",
    "LaunchRequest",
    "LogStream",
    "OutputPlace",
    "Say",
    "TaskInfo",
    "TaskPhase",
]

Say = Callable[[str], None]


class TaskPhase(str, Enum):
    PENDING = "pending"  # accepted, not running yet (a queued step, a pod being scheduled)
    RUNNING = "running"
    SUCCEEDED = "succeeded"  # ended with exit code 0
    FAILED = "failed"  # ended otherwise (exit code, signal, vanished)
    UNREACHABLE = "unreachable"  # could not be observed (host down, API error)

    @property
    def ended(self) -> bool:
        return self in (TaskPhase.SUCCEEDED, TaskPhase.FAILED)


@dataclass(frozen=True)
class LaunchRequest:
    """One task to start, as the engine asks for it.

    TF_CONFIG comes apart from ``env``: it lists the whole cluster and may be larger than one
    environment variable can be (128 KiB on Linux). A backend starts
    ``tfplan.backends.delivery.deliver(request)``'s command, environment and files, which put
    it in the environment when it fits, else in a file next to the task.
    """

    name: str  # "worker/1"
    role: str
    index: int
    host: str  # the plan's host name (the backend maps it through the allocation)
    command: tuple[str, ...]
    env: dict[str, str]  # everything to export except TF_CONFIG
    workdir: str  # the task's own folder (created)
    log_path: str  # stdout and stderr, truncated at start
    devices: tuple[str, ...] = ()
    keep_log_as: str | None = None  # a restart: move the previous log here first
    attempt: int = 0  # 0 for the first start, n for the n-th restart
    tf_config: str = ""  # the task's TF_CONFIG (JSON), delivered by tfplan.backends.delivery
    # A warm standby of the task ``name`` stands for: the same command, host, port and workdir,
    # started next to the live task. It must not share the task's exit record (its own exit
    # file, its own scheduler step); ``log_path`` is its own log.
    standby: bool = False
    # bytes the task may use (Task.memory_limit: cluster.memory), held by a memory cgroup of
    # its own where the backend makes one (process backend); None: no limit of its own
    memory_limit: int | None = None
    experiment: str = ""  # the experiment's id: names what is the task's on its host (a cgroup)


@dataclass(frozen=True)
class Launched:
    """What the engine records of a started task."""

    handle: dict[str, Any]  # opaque to the engine, JSON-serialisable; the backend's own
    host: str  # where it runs (a real machine or node name)
    address: str | None  # where the other tasks reach it
    started_at: float  # unix time
    note: str = ""  # what the user should know of this start ("a cold start: the seed ...")


@dataclass(frozen=True)
class TaskInfo:
    """A task as the backend observes it now."""

    phase: TaskPhase
    exit_code: int | None = None  # known once ended
    host: str | None = None
    detail: str = ""  # backend words: a ps STAT, a Slurm step state, the reason it is pending
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    error: str | None = None  # why it is unreachable
    # the tracked process (a wrapper) is gone but the program it started runs on: followed on,
    # not restarted (docs/fault_tolerance.md)
    readopted: bool = False


@dataclass(frozen=True)
class CancelResult:
    outcome: str  # "none" (was not running) | "terminated" | "killed"
    elapsed_secs: float


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do beyond the contract; the engine adapts its behaviour."""

    # can install per-host firewall rules (cluster.firewall=true is refused at plan otherwise)
    firewall: bool = False
    # a host that stops answering can be planned around (on_host_failure=replace): the
    # supervisor re-plans its tasks onto the other hosts; otherwise the run fails
    replace_lost_hosts: bool = False
    # output_dir is a folder the machine running tfplan shares (the record of each apply goes
    # to <output_dir>/tfplan/); False: it exists only inside the cluster (a Kubernetes volume),
    # and the record goes to the workspace (.tfplan/<experiment>/output/tfplan/) instead.
    shared_output: bool = True
    # warm standbys: ``launch(standby=True)`` keeps a standby apart from its task, ``signal``
    # reaches a task's program (its wrappers survive USR1) and ``move_logs`` renames logs where
    # they live; without it a restarted task is always a new process
    standby: bool = False
    # output_dir may be each host's own folder (cluster.output_mode=per_host, or auto when
    # the hosts share none): the backend tells the modes apart (locate_output) and copies the
    # chief's outputs back to this machine (fetch_outputs). Otherwise per_host is refused at plan.
    per_host_output: bool = False
    # ``signal`` reaches a running task's program (USR2: a worker asked to leave an elastic job
    # after its next push); without it, leaving workers are told so in ``live.json`` instead
    signals: bool = False
    # how many ``launch`` calls apply may make at once (each start is a round trip: an SSH
    # exec, an srun, an API call); 1: one after the other
    launch_fanout: int = 1
    # warm starts (cluster.warm): ``allocate`` starts a warm seed per host (one process that
    # imported TensorFlow) and ``launch`` forks the Python tasks from it; ``release`` stops
    # it. A sweep shares seeds between its points: ``start_seed``/``use_seeds``/``stop_seed``
    warm_starts: bool = False
    # seeds that outlive an allocation: a sweep starts them once and shares them between its
    # points (``start_seed``/``use_seeds``/``stop_seed``); without it each point's allocation
    # starts its own (Slurm: a seed is a step of the point's job)
    sweep_seeds: bool = False
    # the config key that mounts output_dir on every node, named when per_host is refused
    output_mount_key: str | None = None


@dataclass(frozen=True)
class OutputPlace:
    """Where an apply's ``output_dir`` is, as :meth:`Backend.locate_output` found it."""

    # Every host has its own output_dir: checkpoints stay on the chief's host (the evaluator
    # runs beside it); nothing else can be read from another host's folder.
    per_host: bool = False
    # The machine running tfplan sees output_dir as the tasks do: the record goes there and
    # nothing is copied. Otherwise the record goes to the workspace, and the backend copies
    # the chief's outputs there at the end (when it can: Capabilities.per_host_output).
    launcher_sees: bool = True
    detail: str = ""  # one line for the user: what was found ("" when there is nothing to say)


class Backend(ABC):
    """Runs tasks somewhere. See the module docstring for the order of calls.

    Args:
        ref: the plan's (or state's) backend reference: name and resolved options.
        scratch: a folder on the machine running tfplan that the backend may use for its own
            files (wrappers, local logs); it lives in the experiment's workspace folder.
    """

    name: ClassVar[str] = "abstract"
    capabilities: ClassVar[Capabilities] = Capabilities()

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        self.ref = ref
        self.scratch = Path(scratch)

    # ---- plan time (pure) ----------------------------------------------------------------
    @classmethod
    @abstractmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """Check this backend's options in ``cluster`` and say where tasks can go.

        Pure: no I/O. Raises :class:`~tfplan.errors.ConfigError` naming the key and the fix.
        """

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        """The request :meth:`allocate` would make, as lines for the plan (pure)."""
        return ()

    # ---- apply ---------------------------------------------------------------------------
    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> Sequence[PreflightResult]:
        """Check what can be checked before anything starts or queues; return what each host
        that was asked answered (its interpreter and TensorFlow), or nothing where the
        backend asks no host (a scheduler that picks the nodes later).

        Raises:
            PreflightError: one line per place that is not ready.
        """
        return ()

    def allocate(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        current: Allocation | None,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """Get the resources ``tasks`` need and bind the plan's hosts to real ones.

        Args:
            plan: the plan being applied.
            tasks: the tasks about to start.
            current: the allocation the state holds from an earlier apply (reuse it while it
                lives), or None.
            say: progress for the user ("queued: waiting for resources").
            submitted: called as soon as there is something to give back later (a job id), so
                the engine records it before waiting: Ctrl-C or a crash while queued leaves
                nothing behind.

        The default is for backends whose hosts are the planned ones: nothing to allocate.
        """
        return current or Allocation()

    @abstractmethod
    def stage(
        self, plan: Plan, tasks: Sequence[Task], allocation: Allocation
    ) -> Sequence[PreflightResult] | None:
        """Put the code (built-in recipes), each task's run config and what else tasks read
        where they will read it; a backend that checks the nodes only now (Slurm) returns
        what each answered, as :meth:`preflight` does."""

    @abstractmethod
    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        """Start one task, detached: it runs on when tfplan exits. Returns at once."""

    def release(self, allocation: Allocation) -> None:  # noqa: B027 - optional
        """Give the allocation back; its tasks must already be stopped."""

    def allocation_problem(self, allocation: Allocation) -> str | None:
        """Why the allocation can no longer run tasks (a job cancelled from outside, its time
        limit reached), or None. Asked when a task ends unexpectedly: restarting into a dead
        allocation is pointless, the job ends with this reason instead."""
        return None

    # ---- observe and control -------------------------------------------------------------
    @abstractmethod
    def describe(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskInfo]:
        """Each task's :class:`TaskInfo`, by task name, in as few round trips as possible.

        A task that cannot be observed is ``UNREACHABLE`` (with the reason), never an exception:
        one silent host must not hide the others.
        """

    @abstractmethod
    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """Stop tasks (all at once, so grace periods overlap): a polite signal, then a kill after
        ``grace_secs``; every process of each task is gone when it returns. A failure for one
        task is data (its exception), not raised."""

    def signal(self, task: TaskRecord, name: str) -> None:
        """Send signal ``name`` (``"USR1"``: a standby's go signal) to the task's program.

        Raises:
            BackendError: the task has no live process, or it cannot be reached. Backends
                without ``capabilities.standby`` raise it always.
        """
        raise BackendError(f"the {self.name} backend cannot signal tasks")

    def move_logs(self, task: TaskRecord, moves: Sequence[tuple[str, str]]) -> None:
        """Rename log files where ``task``'s logs live, in order (a missing source is skipped):
        how a standby's log becomes its task's, the previous one kept beside it.

        Raises:
            BackendError: a rename failed. Backends without ``capabilities.standby`` raise it
                always.
        """
        raise BackendError(f"the {self.name} backend cannot move logs")

    @abstractmethod
    def stream_log(self, task: TaskRecord, on_line: Callable[[str], None]) -> LogStream:
        """Follow a task's log from its first line until the task has ended."""

    @abstractmethod
    def read_log(self, task: TaskRecord, offset: int = 0, max_bytes: int = 16 << 20) -> bytes:
        """A task's log from byte ``offset`` (negative: from the end); b"" when none yet."""

    def oom_kills(self, task: TaskRecord) -> list[dict[str, object]]:
        """The out-of-memory kills the kernel of ``task``'s host recorded since it started
        (``pid``, ``name``, ``rss`` in bytes, ``at`` unix time), to explain a task that was
        SIGKILLed; empty where the backend cannot tell (the default)."""
        return []

    def tell(self, tasks: Sequence[TaskRecord], name: str, data: bytes) -> None:
        """Write ``data`` atomically to ``<workdir>/<name>`` of each running task, where its
        program looks (``live.json``: an elastic job's new membership). Backends whose
        :class:`~tfplan.planning.topology.Target` says ``resize_in_place`` implement it.

        Raises:
            BackendError: a task's folder could not be written.
        """
        raise BackendError(f"the {self.name} backend cannot tell running tasks anything")

    def listening(self, tasks: Sequence[TaskRecord]) -> set[str] | None:
        """Which of ``tasks`` have their planned port listened on, on their host (one look per
        host): how a program that never read TF_CONFIG is told from one that joined the
        cluster. None where the backend cannot tell (the default)."""
        return None

    def read_log_tails(
        self, tasks: Sequence[TaskRecord], max_bytes: int
    ) -> dict[str, bytes | Exception]:
        """The last ``max_bytes`` of each task's log (``tfplan status``). Backends that can
        read many logs in one round trip per host override this; by default one read each."""
        out: dict[str, bytes | Exception] = {}
        for task in tasks:
            try:
                out[task.name] = self.read_log(task, -max_bytes)
            except Exception as error:  # noqa: BLE001 - one unreadable log is data
                out[task.name] = error
        return out

    @abstractmethod
    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        """A file a task wrote, or None when it does not exist (yet).

        Args:
            path: absolute path as the task saw it.
            near: the host (plan host name or real one) it was written on, when it matters.
        """

    def locate_output(self, plan: Plan, tasks: Sequence[Task]) -> OutputPlace:
        """Whether the hosts of ``tasks`` (those about to start), and this machine, share
        ``plan.output_dir``; asked once per apply, before anything starts
        (``cluster.output_mode=auto`` is decided here).

        The default: one folder every task shares, seen here as ``capabilities.shared_output``
        says.

        Raises:
            PreflightError: the hosts disagree in a way no mode fits (some share the folder,
                some do not), or ``output_mode=shared`` and they do not share it.
        """
        return OutputPlace(per_host=False, launcher_sees=self.capabilities.shared_output)

    def fetch_outputs(self, folder: str, near: str | None, dest: Path) -> int:
        """Copy what the tasks wrote to ``folder`` on host ``near`` (result.json, eval/,
        summaries; never checkpoints) into ``dest`` on this machine; returns how many files.

        Only for backends with ``capabilities.per_host_output``.

        Raises:
            BackendError: the host could not be read.
        """
        raise NotImplementedError(f"the {self.name} backend cannot copy outputs back")

    # ---- warm seeds (capabilities.warm_starts) ---------------------------------------------
    def start_seed(
        self, host: str, folder: str, python: str, env: dict[str, str], keras: bool = True
    ) -> WarmSeed:
        """Start a warm seed on ``host`` in ``folder``: ``python`` imports TensorFlow with
        ``env`` (``keras=False``: without Keras 3, for tasks that never use it), then forks the
        tasks it is asked for.

        Raises:
            BackendError: it could not start (always, without ``capabilities.warm_starts``).
        """
        raise BackendError(f"the {self.name} backend has no warm starts")

    def seed_ready(self, seed: WarmSeed) -> bool:
        """Whether ``seed`` has imported what it preloads (it answers at once from then on)."""
        return False

    def stop_seed(self, seed: WarmSeed, grace_secs: float = 5.0) -> None:  # noqa: B027
        """Stop ``seed`` (the tasks it forked run on: they are their own process groups).

        Raises:
            BackendError: it could not be confirmed stopped.
        """

    def use_seeds(self, seeds: Sequence[WarmSeed]) -> None:  # noqa: B027 - optional
        """Fork the tasks this backend launches from these seeds (a sweep's, shared by its
        points) where they can start them, instead of seeds of the allocation's own."""

    def free_bytes(self, host: str, folder: str) -> int | None:
        """Free bytes on the disk that holds ``folder``, as ``host`` sees it; None where the
        backend cannot look (a node or pod's disk) or it cannot be read."""
        return None

    @classmethod
    def runs_here(cls, plan: Plan) -> bool:
        """Whether every task of ``plan`` runs on this machine (what fails here fails there:
        the plan may try the user's code here)."""
        return False

    def allocation_text(self, allocation: Allocation) -> str | None:
        """What the allocation holds, as users know it (``17``: a Slurm job; the process
        backend's warm seeds), for ``tfplan status``; None when there is nothing to show."""
        return allocation.id

    def starts_warm(self, host: str, allocation: Allocation | None = None) -> bool:
        """Whether a task (re)started on ``host`` now skips its program's imports, as a warm
        standby taking over would (tasks forked from a warm seed: an apply's, recorded in
        ``allocation``, or a sweep's): standbys are then not worth their processes."""
        return False

    def handle_text(self, task: TaskRecord) -> str:
        """The handle as users know it (``pid 4242``, ``step 17.3``, ``pod x``) for tables."""
        return " ".join(f"{k} {v}" for k, v in task.handle.items())

    def close(self) -> None:  # noqa: B027 - optional
        """Release connections; running tasks are not affected."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
