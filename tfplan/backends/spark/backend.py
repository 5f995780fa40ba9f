""":class:`SparkBackend`: the plan's tasks on the executors of one Spark application.

- ``target``: ``cluster.options.executors`` places ``executor-<i>`` whose hosts Spark picks at
  apply time ("known after apply", as Slurm's nodes), each with its own window of ports (two
  executors on one host never share a port).
- ``allocate``: ``spark-submit`` of :mod:`.driver_app` in client mode, detached beside tfplan
  and recorded in the allocation (the driver's process group); it runs one long Spark task per
  executor, a tfplan agent (:mod:`.agent`), and each agent registers where it listens. The
  places are bound to the agents' hosts.
- everything else is the process backend's (:class:`~tfplan.backends.process.ProcessBackend`):
  the same sh scripts start, observe, stop and follow tasks, sent to each executor's agent
  (:mod:`.transport`) instead of over SSH; so restarts, warm seeds, standbys, the host
  watchers, logs and outputs work as on SSH hosts.
- ``release``: SIGTERM to the driver: it cancels the agents' jobs and stops the SparkContext;
  the executors end, and each agent's guard kills whatever it started that still runs.

Files (``<workspace>/backend/spark/``): the driver's log, its agents' registry
(``agents.json``: the driver writes it as agents register, a later tfplan reads it) and the
agents' token (``token``, mode 0600).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.backends.api import (
    Backend,
    CancelResult,
    Capabilities,
    Launched,
    LaunchRequest,
    OutputPlace,
    Say,
)
from tfplan.backends.fanout import run_on_hosts
from tfplan.backends.process import ProcessBackend
from tfplan.backends.process.backend import LAUNCH_FANOUT
from tfplan.backends.spark import agent as agent_module
from tfplan.backends.spark import driver_app
from tfplan.backends.spark.options import SparkOptions, memory_mib, parse_options
from tfplan.backends.spark.transport import AgentTarget, SparkAgentTransport
from tfplan.backends.transports import scripts as _scripts
from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.local import LocalTransport
from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.specs import HostTarget, LaunchSpec
from tfplan.errors import BackendError, ConfigError, PreflightError
from tfplan.planning.plan import BackendRef, Plan, Task
from tfplan.planning.state import Allocation, TaskRecord
from tfplan.planning.topology import Place, Target, Topology

if TYPE_CHECKING:
    from tfplan.backends.transports.preflight import PreflightResult
    from tfplan.config.schema import ClusterConfig
    from tfplan.planning.context import PlanContext

__all__ = ["SparkBackend", "SUPPORTED_SPARK", "spark_version"]

SUPPORTED_SPARK = (3, 4)  # the oldest Spark whose pyspark runs the driver application
POLL_SECS = 0.1
STOP_GRACE_SECS = 15.0
AGENT_MODULE = "tfplan_spark_agent"


def spark_home(options: SparkOptions) -> str | None:
    """``cluster.options.spark_home``, else the installed pyspark's folder (its ``bin/``)."""
    if options.spark_home:
        return options.spark_home
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(list(spec.submodule_search_locations)[0])


def spark_version(home: str) -> tuple[int, ...] | None:
    """The Spark version of ``home`` (pyspark's ``version.py``, or the core jar's name)."""
    version_file = Path(home, "version.py")
    if version_file.is_file():
        found = re.search(r"__version__[^=]*=\s*['\"](\d+)\.(\d+)", version_file.read_text())
        if found:
            return int(found.group(1)), int(found.group(2))
    for jar in Path(home, "jars").glob("spark-core_*.jar"):
        found = re.search(r"-(\d+)\.(\d+)\.\d+", jar.name)
        if found:
            return int(found.group(1)), int(found.group(2))
    return None


def java_missing() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return False
    return shutil.which("java") is None


def master_address(master: str) -> tuple[str, int] | None:
    """(host, port) of a standalone master URL; None for yarn, k8s:// and local."""
    found = re.match(r"^spark://([^:/]+):(\d+)", master)
    return (found.group(1), int(found.group(2))) if found else None


@dataclass(frozen=True)
class FreeResources:
    """What a standalone master's alive workers have free."""

    workers: int
    cores: int
    memory_mib: int
    gpus: int


class AgentPool(TransportPool):
    """Transports by place name, to the agents the driver's registry names now: an agent
    started again (its executor lost) is reached at its new address."""

    def __init__(self, registry: Path, token_file: Path, python: str | None) -> None:
        super().__init__(())
        self.registry = registry
        self.token_file = token_file
        self.python = python
        self._seen_mtime: int | None = None
        self._data: dict[str, Any] = {}

    def refresh(self) -> dict[str, Any]:
        """Re-read the registry when it changed (every transport lookup asks: a stat, not
        two reads, when it did not); the registry's content."""
        try:
            mtime = self.registry.stat().st_mtime_ns
            if mtime == self._seen_mtime:
                return self._data
            data: dict[str, Any] = json.loads(self.registry.read_text())
            token = self.token_file.read_text().strip()
        except (OSError, ValueError):
            return {}
        targets = {}
        for name, record in data.get("agents", {}).items():
            targets[name] = AgentTarget(
                name=name,
                address=str(record["address"]),
                python=self.python or str(record.get("python") or "python3"),
                agent_port=int(record["port"]),
                token=token,
                gpus=tuple(str(g) for g in record.get("gpus") or ()),
            )
        with self._lock:
            for name, target in targets.items():
                opened = self._open.get(name)
                if opened is not None and opened.target != target:
                    opened.close()
                    del self._open[name]
            self.targets = dict(targets)
            self._seen_mtime, self._data = mtime, data
        return data

    def __getitem__(self, name: str) -> Transport:
        self.refresh()
        return super().__getitem__(name)

    def _make(self, target: HostTarget) -> Transport:
        return SparkAgentTransport(target)


class SparkBackend(ProcessBackend):
    """Tasks on the executors of one Spark application (see the module docstring)."""

    name = "spark"
    capabilities = Capabilities(
        standby=True, signals=True, launch_fanout=LAUNCH_FANOUT, warm_starts=True
    )

    def __init__(self, ref: BackendRef, scratch: Path) -> None:
        super().__init__(ref, scratch)
        self.options = parse_options(ref.config.get("options", {}))
        self.folder = self.scratch / "spark"
        self.registry = self.folder / "agents.json"
        self.token_file = self.folder / "token"
        self.python: str | None = ref.config.get("python")
        self.agents = AgentPool(self.registry, self.token_file, self.python)
        self.pool = self.agents  # the process backend's pool: the agents the registry names
        self.agents.refresh()
        self.hosts = list(self.agents.targets.values())
        self.local = LocalTransport(HostTarget("driver", "127.0.0.1", python=sys.executable))

    # ---- plan time -----------------------------------------------------------------------
    @classmethod
    def target(cls, cluster: ClusterConfig, ctx: PlanContext) -> Target:
        """``executors`` places named ``executor-0``.. whose hosts Spark picks at apply time.

        Raises:
            ConfigError: hosts listed (Spark picks them), the firewall asked for, or a bad option.
        """
        if cluster.hosts:
            raise ConfigError(
                "cluster.hosts",
                "the spark backend runs tasks on the executors Spark gives it",
                "remove cluster.hosts and set cluster.options.executors",
            )
        options = parse_options(cluster.options)
        # the executors run the Python this machine runs tfplan with (spark.pyspark.python),
        # unless cluster.python names theirs
        python = cluster.python or sys.executable
        places: list[Place] = []
        port_base = cluster.port_base  # each place its own window: two on one host never clash
        for group in options.groups():
            for name in group.places():
                places.append(
                    Place(
                        name,
                        None,
                        group.slots,
                        gpus=group.gpus,
                        port_base=port_base,
                        python=python,
                        roles=group.roles,
                    )
                )
                port_base += group.slots
        ref = BackendRef(
            cls.name,
            {"options": options.to_dict(), "python": cluster.python, "warm": cluster.warm},
        )
        topology = Topology(
            places=tuple(places),
            places_key="cluster.options.roles" if options.roles else "cluster.options.executors",
            slots_key="cluster.options.tasks_per_executor",
        )
        return Target(ref, topology, resize_in_place=True, allocates="Spark application")

    @classmethod
    def dryrun(cls, plan: Plan) -> tuple[str, ...]:
        """The spark-submit request and which place runs which tasks."""
        options = parse_options(plan.backend.config.get("options", {}))
        conf = " ".join(f"--conf {k}={v}" for k, v in options.submit_conf().items())
        lines = [
            f"spark-submit --master {options.master} --deploy-mode client {conf} "
            f"driver_app.py  # the driver runs here, detached; "
            f"{options.total_executors} executor(s), {options.total_cores} core(s) in all",
        ]
        for group in options.groups():
            first, last = group.places()[0], group.places()[-1]
            named = first if first == last else f"{first}..{last}"
            who = ", ".join(group.roles) if group.roles else "any role"
            how = "a resource profile" if group.profile else "spark.executor.*"
            lines.append(f"{named} ({who}): {group.describe()} ({how})")
        lines.append(
            "each executor runs one tfplan agent (a Spark task holding its cores and GPUs); "
            "tasks start through it as on an SSH host"
        )
        if plan.backend.config.get("warm", True):
            lines.append(
                "warm starts: a seed per executor imports TensorFlow once; Python tasks fork "
                "from it (cluster.warm=false: cold starts)"
            )
        for host in plan.hosts:
            names = ", ".join(t.name for t in plan.tasks if t.host == host.name)
            if names:
                lines.append(f"{host.name} = an executor's host (known after apply): {names}")
        return tuple(lines)

    # ---- apply ---------------------------------------------------------------------------
    def preflight(self, plan: Plan, tasks: Sequence[Task]) -> list[PreflightResult]:
        """Java and Spark are here (a supported version), the master answers and has the
        cores the plan asks for (a standalone master's web UI, when it answers). The executors'
        hosts are checked once the agents run (:meth:`stage`).

        Raises:
            PreflightError: what is wrong, one line.
        """
        problem = self._spark_problem()
        if problem:
            raise PreflightError({"spark": problem})
        return []

    def _spark_problem(self) -> str | None:
        options = self.options
        if java_missing():
            return (
                "no Java on this machine (spark-submit needs it): install a JRE 17 "
                "(apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
            )
        home = spark_home(options)
        if home is None or not os.access(os.path.join(home, "bin", "spark-submit"), os.X_OK):
            return (
                f"cluster.options.spark_home: no bin/spark-submit in {home or 'pyspark (not installed)'}: "
                "pip install pyspark, or set cluster.options.spark_home to a Spark folder"
            )
        version = spark_version(home)
        if version is None or version < SUPPORTED_SPARK:
            shown = ".".join(map(str, version)) if version else "unknown"
            return (
                f"cluster.options.spark_home: Spark {shown} in {home} is not supported: use Spark "
                f"{'.'.join(map(str, SUPPORTED_SPARK))} or newer (pip install 'pyspark>=4')"
            )
        address = master_address(options.master)
        if address is not None:
            try:
                socket.create_connection(address, timeout=5.0).close()
            except OSError as error:
                return (
                    f"cluster.options.master: {options.master} does not answer "
                    f"({error.strerror or error}): start the master or fix the URL"
                )
            free = self._free(address[0])
            if free is not None:
                return self._short(free)
        return None

    def _short(self, free: FreeResources) -> str | None:
        """What the plan asks for that the master's alive workers do not have free."""
        options = self.options
        key = "cluster.options.roles" if options.roles else "cluster.options.executors"
        asked = ", ".join(
            f"{g.count} {g.prefix}(s) of {g.cores} core(s), {g.memory}"
            + (f", {g.gpus} GPU(s)" if g.gpus else "")
            for g in options.groups()
        )
        wants = {
            "core(s)": options.total_cores,
            "MiB of memory": sum(g.count * memory_mib(g.memory) for g in options.groups()),
            "GPU(s)": sum(g.count * g.gpus for g in options.groups()),
        }
        has = {"core(s)": free.cores, "MiB of memory": free.memory_mib, "GPU(s)": free.gpus}
        for what, needed in wants.items():
            if needed > has[what]:
                return (
                    f"{key}: the plan needs {asked}: {needed} {what}; the master has "
                    f"{has[what]} free {what} on {free.workers} alive worker(s): ask for fewer "
                    "or smaller executors, or add workers"
                )
        return None

    def _free(self, host: str) -> FreeResources | None:
        """What a standalone master's alive workers have free (its web UI's JSON), if it
        answers."""
        url = self.options.master_web_url or f"http://{host}:8080"
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/json/", timeout=3.0) as answer:  # noqa: S310
                state = json.loads(answer.read())
        except (OSError, ValueError):
            return None
        alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
        return FreeResources(
            workers=len(alive),
            cores=sum(int(w.get("cores", 0)) - int(w.get("coresused", 0)) for w in alive),
            memory_mib=sum(int(w.get("memory", 0)) - int(w.get("memoryused", 0)) for w in alive),
            gpus=sum(
                len(((w.get("resourcesfree") or {}).get("gpu") or {}).get("addresses") or ())
                for w in alive
            ),
        )

    def allocate(
        self,
        plan: Plan,
        tasks: Sequence[Task],
        current: Allocation | None,
        say: Say,
        submitted: Callable[[Allocation], None],
    ) -> Allocation:
        """Start the application (or keep the running one) and bind ``executor-<i>`` to the
        agents' hosts; then what the process backend starts per host (warm seeds).

        Raises:
            BackendError: spark-submit failed, the driver ended, or too few agents registered
                within ``start_timeout_secs`` (the application is ended then).
        """
        if current is not None and current.data.get("driver") and self._usable(current):
            bound = self._bound()
            return super().allocate(plan, tasks, _with(current, bound), say, submitted)
        if current is not None and current.data.get("driver"):
            self._stop_driver(current)
        allocation = self.submit(plan.experiment_id, say, submitted)
        try:
            bound = self.wait_agents(allocation)
        except BaseException:
            self._stop_driver(allocation)
            raise
        allocation = _with(allocation, bound)
        submitted(allocation)
        say(
            "Spark application "
            + str(allocation.id)
            + " runs its agents on "
            + ", ".join(
                f"{name}={address}" + (f" ({host})" if host != address else "")
                for name, (host, address) in sorted(bound.items())
            )
        )
        return super().allocate(plan, tasks, allocation, say, submitted)

    def submit(
        self, experiment_id: str, say: Say, submitted: Callable[[Allocation], None]
    ) -> Allocation:
        """``spark-submit`` the application, detached; recorded (``submitted``) at once.

        Raises:
            BackendError: no Spark here, or spark-submit could not be started.
        """
        options = self.options
        home = spark_home(options)
        if home is None:
            raise BackendError(
                "no Spark found: pip install pyspark or set cluster.options.spark_home"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        for stale in (self.registry, self.token_file):
            stale.unlink(missing_ok=True)
        token = secrets.token_hex(16)
        fd = os.open(self.token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(token + "\n")
        agent_file = self.folder / f"{AGENT_MODULE}.py"
        shutil.copyfile(agent_module.__file__, agent_file)
        app_file = self.folder / "driver_app.py"
        shutil.copyfile(driver_app.__file__, app_file)
        wanted_file = self.folder / "wanted.json"
        wanted_file.write_text(json.dumps(options.agents(), indent=1))
        python = self.python or sys.executable
        command = [
            os.path.join(home, "bin", "spark-submit"),
            "--master",
            options.master,
            "--deploy-mode",
            "client",
            "--name",
            f"tfplan-{experiment_id}",
            "--py-files",
            str(agent_file),
            *[w for k, v in options.submit_conf().items() for w in ("--conf", f"{k}={v}")],
            "--conf",
            f"spark.pyspark.python={python}",
            "--conf",
            f"spark.pyspark.driver.python={sys.executable}",
            *options.submit_args,
            str(app_file),
            str(self.registry),
            str(wanted_file),
        ]
        env = {
            driver_app.TOKEN_ENV: token,
            "TFPLAN_SPARK_APP": f"tfplan-{experiment_id}",
            "SPARK_HOME": home,
            "PYSPARK_PYTHON": python,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        if options.driver_host:
            env["SPARK_LOCAL_IP"] = options.driver_host
        if options.gpu_discovery_script:
            env["TFPLAN_SPARK_GPU_SCRIPT"] = options.gpu_discovery_script
        started = self.local.start(
            LaunchSpec(
                name="spark-driver",
                command=tuple(command),
                env=env,
                workdir=str(self.folder),
                log_path=str(self.folder / "driver.log"),
            )
        )
        allocation = Allocation(
            id=f"driver-{started.pid}",
            data={
                "driver": {"pid": started.pid, "pgid": started.pgid},
                "master": options.master,
                "experiment": experiment_id,
                "log": str(self.folder / "driver.log"),
                "request": options.to_dict(),
            },
        )
        submitted(allocation)
        say(
            f"submitted the Spark application to {options.master} (driver pid {started.pid}, "
            f"{options.total_executors} executor(s)); waiting for its agents"
        )
        return allocation

    def wait_agents(self, allocation: Allocation) -> dict[str, tuple[str, str]]:
        """Wait until every executor's agent registered; the places bound to their hosts.

        Raises:
            BackendError: the driver ended, or too few agents within ``start_timeout_secs``.
        """
        wanted = self.options.total_executors
        deadline = time.monotonic() + self.options.start_timeout_secs
        while True:
            data = self.agents.refresh()
            agents = data.get("agents", {})
            if len(agents) >= wanted:
                self.hosts = list(self.pool.targets.values())
                if data.get("app_id"):
                    allocation.data["app_id"] = data["app_id"]
                return self._bound()
            problem = self.allocation_problem(allocation)
            if problem:
                raise BackendError(problem)
            if time.monotonic() > deadline:
                free = None
                address = master_address(self.options.master)
                if address is not None:
                    free = self._free(address[0])
                have = (
                    f"; the master has {free.cores} free core(s), {free.memory_mib} MiB and "
                    f"{free.gpus} GPU(s) on {free.workers} worker(s)"
                    if free is not None
                    else ""
                )
                missing = sorted(set(self.options.agents_places()) - set(agents))
                raise BackendError(
                    f"only {len(agents)} of {wanted} Spark executors started within "
                    f"cluster.options.start_timeout_secs={self.options.start_timeout_secs:.0f} "
                    f"(missing: {', '.join(missing)}){have}: ask for fewer or smaller executors "
                    f"or add workers (the driver's log: {self.folder / 'driver.log'})"
                )
            time.sleep(POLL_SECS)

    def _bound(self) -> dict[str, tuple[str, str]]:
        data = self.agents.refresh()
        return {
            place: (str(r.get("hostname") or r["address"]), str(r["address"]))
            for place, r in data.get("agents", {}).items()
        }

    def _usable(self, allocation: Allocation) -> bool:
        if self.allocation_problem(allocation) is not None:
            return False
        asked = allocation.data.get("request")
        return asked is None or asked == self.options.to_dict()

    def allocation_problem(self, allocation: Allocation) -> str | None:
        """The driver is gone (the application ended with it)."""
        driver = allocation.data.get("driver")
        if not driver:
            return None
        # the driver's process group (its JVM and Python), not only the sh that started them
        if _group_alive(int(driver["pgid"])):
            return self._moved(allocation)
        log = Path(str(allocation.data.get("log", self.folder / "driver.log")))
        return (
            f"the Spark driver (pid {driver['pid']}) ended, and the application with it: "
            f"{_last_line(log)} (its log: {log})"
        )

    def _moved(self, allocation: Allocation) -> str | None:
        """An executor whose agent Spark started again on another host: the TensorFlow
        cluster's addresses are fixed, so its tasks cannot come back there."""
        now = self._bound()
        for place, (_, address) in sorted(allocation.bound.items()):
            moved = now.get(place)
            if moved is not None and moved[1] != address:
                return (
                    f"Spark started {place}'s agent again on another host ({address} -> "
                    f"{moved[1]}): a TensorFlow cluster's addresses are fixed; run `tfplan apply` "
                    "again to start the job anew from its last checkpoint"
                )
        return None

    def release(self, allocation: Allocation) -> None:
        """The process backend's release (seeds, leftovers), then the driver: SIGTERM, which
        ends the application, SIGKILL to its group after a grace period.

        Raises:
            BackendError: something could not be released.
        """
        problems: list[str] = []
        if self.pool.targets:
            try:
                super().release(allocation)
            except BackendError as error:
                problems.append(str(error))
        self._stop_driver(allocation)
        if problems:
            raise BackendError("; ".join(problems))

    def _stop_driver(self, allocation: Allocation) -> None:
        driver = allocation.data.get("driver")
        if not driver:
            return
        pgid = int(driver["pgid"])
        program = _driver_program(pgid)
        if program is not None:
            try:
                os.kill(program, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + STOP_GRACE_SECS
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(POLL_SECS)
        if _group_alive(pgid):
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def launch(self, request: LaunchRequest, allocation: Allocation) -> Launched:
        """The process backend's start, through the task's agent; a worker's GPUs are the plan's
        numbers (its executor's first, second...) mapped to the addresses Spark gave it."""
        self.agents.refresh()  # an agent Spark started again may have other GPUs
        given = self.agents.targets.get(request.host)
        gpus = given.gpus if isinstance(given, AgentTarget) else ()
        return super().launch(_on_gpus(request, gpus), allocation)

    def cancel(
        self, tasks: Sequence[TaskRecord], grace_secs: float
    ) -> dict[str, CancelResult | Exception]:
        """The process backend's stop, through each task's agent. A task whose agent does not
        answer because the application is over (its driver is gone) is gone too: the agent
        died with its executor, and its guard killed what it had started."""
        results = super().cancel(tasks, grace_secs)
        if any(isinstance(r, Exception) for r in results.values()) and not self._driver_alive():
            results = {
                name: CancelResult("none", 0.0) if isinstance(r, Exception) else r
                for name, r in results.items()
            }
        return results

    def _driver_alive(self) -> bool:
        """Whether spark-submit still runs: its wrapper records its exit status when it ends."""
        return not Path(_scripts.exit_file(str(self.folder))).exists()

    def allocation_text(self, allocation: Allocation) -> str | None:
        driver = allocation.data.get("driver") or {}
        app = allocation.data.get("app_id") or allocation.id
        return f"Spark application {app} (driver pid {driver.get('pid')})"

    def read_file(self, path: str, near: str | None = None) -> bytes | None:
        """From this machine: the output folder is shared with the executors' hosts."""
        try:
            return Path(path).read_bytes() or None
        except OSError:
            return None

    def free_bytes(self, host: str, folder: str) -> int | None:
        """This machine's free space in the shared folder."""
        path = Path(folder)
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None

    def locate_output(self, plan: Plan, tasks: Sequence[Task]) -> OutputPlace:
        """One folder this machine and every executor's host share (checked in :meth:`stage`,
        once the executors are known), as on Slurm."""
        return Backend.locate_output(self, plan, tasks)

    def stage(self, plan: Plan, tasks: Sequence[Task], allocation: Allocation) -> None:
        """Check that every executor's host sees the output folder this machine writes (a
        marker written here, looked for there), then as on SSH hosts: the code and each
        task's run.yaml through the executor's agent.

        Raises:
            PreflightError: an executor's host does not see the shared folder.
        """
        folder = Path(plan.output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        marker = folder / f".tfplan-spark-{secrets.token_hex(6)}"
        marker.write_text("tfplan\n")
        try:
            hosts = sorted({t.host for t in tasks})

            def sees(name: str) -> None:
                found = self.agents[name].run_script(
                    f"test -f {_scripts.q(str(marker))} && echo yes || echo no",
                    f"look for {marker}",
                )
                if found.stdout.strip() != b"yes":
                    raise BackendError(
                        f"does not see {plan.output_dir} as this machine does: put "
                        "cluster.workdir and cluster.output_dir on a folder every executor's "
                        "host shares"
                    )

            failed = run_on_hosts({h: h for h in hosts}, sees).failed
        finally:
            marker.unlink(missing_ok=True)
        if failed:
            raise PreflightError({h: str(why) for h, why in failed.items()})
        super().stage(plan, tasks, allocation)


def _on_gpus(request: LaunchRequest, gpus: Sequence[str]) -> LaunchRequest:
    """``request`` with CUDA_VISIBLE_DEVICES naming the executor's own GPUs: the plan numbers
    an executor's GPUs 0, 1...; Spark gave it the addresses ``gpus`` of its host's."""
    planned = request.env.get("CUDA_VISIBLE_DEVICES")
    if not planned or not gpus:
        return request
    try:
        mapped = ",".join(gpus[int(i)] for i in planned.split(","))
    except (ValueError, IndexError):
        return request  # more GPUs planned than given: the plan's own numbers, as elsewhere
    return replace(request, env={**request.env, "CUDA_VISIBLE_DEVICES": mapped})


def _with(allocation: Allocation, bound: dict[str, tuple[str, str]]) -> Allocation:
    return Allocation(id=allocation.id, data=dict(allocation.data), bound=bound)


def _group_alive(pgid: int) -> bool:
    return any(s.pgid == pgid and s.state != "Z" for s in agent_module.processes().values())


def _driver_program(pgid: int) -> int | None:
    """The driver's Python process: spark-submit execs a JVM, which runs the application's
    Python as its child, all in the group tfplan started. SIGTERM to it ends the application
    politely (it cancels the agents' jobs and stops the SparkContext)."""
    for pid, stat in agent_module.processes().items():
        if stat.pgid != pgid:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if os.path.basename(argv[0].decode(errors="replace")).startswith("python") and any(
            word.endswith(b"driver_app.py") for word in argv
        ):
            return pid
    return None


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line.strip()[:300]
    return lines[-1].strip()[:300] if lines else "an empty log"
