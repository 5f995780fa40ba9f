"""The Spark backend's options (``cluster.options``), checked before anything starts."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfplan.errors import ConfigError

__all__ = [
    "ExecutorGroup",
    "RoleExecutors",
    "SparkOptions",
    "parse_options",
    "MASTER_SCHEMES",
    "ROLES",
    "memory_mib",
]

MASTER_SCHEMES = ("spark://", "yarn", "k8s://", "local")
ROLES = ("ps", "chief", "worker", "evaluator")  # in the order their groups are listed
# the JVM options of tfplan's driver and executors (cluster.options.conf may set others)
QUICK_JVM = "-XX:TieredStopAtLevel=1"
_MEMORY = re.compile(r"^\d+[kmgtKMGT]?$")


def memory_mib(size: str) -> int:
    """A JVM memory size ("512m", "2g", "1048576k", bare bytes) in MiB, rounded up."""
    unit = size[-1].lower() if size[-1].isalpha() else ""
    number = int(size[:-1] if unit else size)
    factor = {"": 1 / 2**20, "k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}[unit]
    return max(1, -int(-number * factor // 1))


@dataclass(frozen=True)
class RoleExecutors:
    """``cluster.options.roles.<role>``: executors of the role's own (a Spark resource profile).

    Attributes:
        executors: how many (the places ``<role>-executor-<i>``).
        cores: each one's cores; None: ``executor_cores``.
        memory: each one's JVM heap; None: ``executor_memory``.
        gpus: GPUs each one asks for (``spark.executor.resource.gpu.amount``); its workers get
            them as CUDA_VISIBLE_DEVICES, one each.
        tasks_per_executor: tfplan tasks each one runs; None: ``tasks_per_executor``.
    """

    executors: int = 1
    cores: int | None = None
    memory: str | None = None
    gpus: int = 0
    tasks_per_executor: int | None = None


@dataclass(frozen=True)
class ExecutorGroup:
    """Executors alike: the places ``<prefix>-0..count-1``, for ``roles`` (empty: any).

    ``profile`` is False for the application's default executors (``spark.executor.*``) and
    True for a role's own (a resource profile the driver asks Spark for)."""

    prefix: str
    roles: tuple[str, ...]
    count: int
    cores: int
    memory: str
    gpus: int
    slots: int
    profile: bool

    def places(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.count)]

    def describe(self) -> str:
        gpus = f", {self.gpus} GPU(s)" if self.gpus else ""
        return (
            f"{self.count} executor(s) of {self.cores} core(s), {self.memory}{gpus}, "
            f"{self.slots} task(s) each"
        )


@dataclass(frozen=True)
class SparkOptions:
    """What tfplan asks Spark for: one application whose executors each run a tfplan agent.

    Attributes:
        master: the Spark master URL (``spark://host:7077``; ``yarn`` and ``k8s://...``
            take the same code path, docs/spark.md says what was tested).
        executors: how many executors (one agent each: the plan's places ``executor-<i>``).
        tasks_per_executor: tfplan tasks one executor's host may run.
        executor_cores: ``spark.executor.cores``; the agent's Spark task takes them all
            (``spark.task.cpus``), so each executor runs exactly one agent.
        executor_memory: ``spark.executor.memory`` ("2g"): the JVM's heap; the TensorFlow
            processes the agent starts are not inside it.
        master_web_url: a standalone master's web UI (``http://HOST:8080``, the default), read
            to say before submitting whether the cluster has the cores the plan asks for.
        driver_host: ``spark.driver.host``: the address the executors reach the driver (and
            its agent registry) at; None: Spark's default (this machine's name).
        spark_home: where ``bin/spark-submit`` is; None: the installed ``pyspark``'s folder.
        conf: more ``--conf key=value`` for ``spark-submit``.
        submit_args: more ``spark-submit`` words (``["--queue", "ml"]`` on YARN).
        start_timeout_secs: give up (and end the application) when fewer than ``executors``
            agents registered by then.
        executor_gpus: GPUs each default executor asks for (its workers get one each).
        roles: executors of their own for some roles (``{ps: {executors: 2, cores: 1,
            memory: 2g}, worker: {executors: 4, cores: 4, gpus: 1}}``): each role listed runs
            only on its own executors, the others on the default ``executors`` (0 when every
            role of the plan is listed). Spark asks for them by resource profile, with dynamic
            allocation on (how Spark offers executors of several shapes to one application).
        gpu_discovery_script: ``discoveryScript`` of the executors' GPU requests (YARN and
            Kubernetes need one; a standalone worker assigns its own GPUs).
    """

    master: str = "spark://127.0.0.1:7077"
    executors: int = 3
    tasks_per_executor: int = 2
    executor_cores: int = 1
    executor_memory: str = "1g"
    master_web_url: str | None = None
    driver_host: str | None = None
    spark_home: str | None = None
    conf: dict[str, str] = field(default_factory=dict)
    submit_args: tuple[str, ...] = field(default_factory=tuple)
    start_timeout_secs: float = 120.0
    executor_gpus: int = 0
    roles: dict[str, RoleExecutors] = field(default_factory=dict)
    gpu_discovery_script: str | None = None

    def groups(self) -> tuple[ExecutorGroup, ...]:
        """The default executors (when any), then each listed role's, in :data:`ROLES` order."""
        others = tuple(r for r in ROLES if r not in self.roles) if self.roles else ()
        groups = []
        if self.executors:
            groups.append(
                ExecutorGroup(
                    "executor",
                    others,
                    self.executors,
                    self.executor_cores,
                    self.executor_memory,
                    self.executor_gpus,
                    self.tasks_per_executor,
                    profile=False,
                )
            )
        for role in (r for r in ROLES if r in self.roles):
            mine = self.roles[role]
            groups.append(
                ExecutorGroup(
                    f"{role}-executor",
                    (role,),
                    mine.executors,
                    mine.cores or self.executor_cores,
                    mine.memory or self.executor_memory,
                    mine.gpus,
                    mine.tasks_per_executor or self.tasks_per_executor,
                    profile=True,
                )
            )
        return tuple(groups)

    @property
    def total_executors(self) -> int:
        return sum(g.count for g in self.groups())

    @property
    def total_cores(self) -> int:
        return sum(g.count * g.cores for g in self.groups())

    def submit_conf(self) -> dict[str, str]:
        """The ``--conf`` settings of the application (tfplan's, then the user's)."""
        settings = {
            "spark.executor.cores": str(self.executor_cores),
            "spark.task.cpus": str(self.executor_cores),
            "spark.cores.max": str(self.total_cores),
            "spark.executor.instances": str(self.executors),
            "spark.executor.memory": self.executor_memory,
            # an agent's task must not be run twice at once (a speculative copy), and Spark
            # must not give up on the application when an executor is lost
            "spark.speculation": "false",
            "spark.task.maxFailures": "4",
            "spark.dynamicAllocation.enabled": "false",
            # tfplan's application computes nothing in Spark: its driver keeps the agents' jobs,
            # its executors host the agents; the JIT's first tier compiles the little they run,
            # and the optimising compiler's threads do not take the cores from the tasks while
            # they start (docs/spark.md's run: the driver 8.8 CPU-seconds instead of 11-14)
            "spark.driver.extraJavaOptions": QUICK_JVM,
            "spark.executor.extraJavaOptions": QUICK_JVM,
        }
        if self.executor_gpus:
            settings["spark.executor.resource.gpu.amount"] = str(self.executor_gpus)
            settings["spark.task.resource.gpu.amount"] = str(self.executor_gpus)
            if self.gpu_discovery_script:
                settings["spark.executor.resource.gpu.discoveryScript"] = self.gpu_discovery_script
        if self.roles:
            # executors of several shapes (resource profiles) need dynamic allocation; the
            # agents' tasks never end, so no executor is ever idle and none is taken back
            settings.update(
                {
                    "spark.dynamicAllocation.enabled": "true",
                    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
                    "spark.dynamicAllocation.minExecutors": "0",
                    "spark.dynamicAllocation.initialExecutors": str(self.executors),
                    "spark.dynamicAllocation.maxExecutors": str(self.total_executors),
                }
            )
        if self.driver_host:
            settings["spark.driver.host"] = self.driver_host
        return {**settings, **{str(k): str(v) for k, v in self.conf.items()}}

    def agents(self) -> list[dict[str, Any]]:
        """What the driver application starts: one agent per place, with the resource
        profile of its group (None: the default executors)."""
        return [
            {
                "place": place,
                "profile": (
                    {"cores": g.cores, "memory": g.memory, "gpus": g.gpus} if g.profile else None
                ),
            }
            for g in self.groups()
            for place in g.places()
        ]

    def agents_places(self) -> list[str]:
        return [place for g in self.groups() for place in g.places()]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["submit_args"] = list(self.submit_args)
        return data


def _key(name: str) -> str:
    return f"cluster.options.{name}"


def parse_options(options: Mapping[str, Any]) -> SparkOptions:
    """Typed, checked options.

    Raises:
        ConfigError: an unknown key, a wrong type or a value out of range, naming the key.
    """
    known = {f.name for f in dataclasses.fields(SparkOptions)}
    for name in options:
        if name not in known:
            raise ConfigError(
                _key(str(name)), "no such Spark option", f"known: {', '.join(sorted(known))}"
            )
    values = dict(options)
    words = values.get("submit_args") or ()
    if isinstance(words, str) or not all(isinstance(w, str) for w in words):
        raise ConfigError(
            _key("submit_args"), f"{words!r} is not a list of words", 'use e.g. ["--queue", "ml"]'
        )
    values["submit_args"] = tuple(words)
    conf = values.get("conf") or {}
    if not isinstance(conf, Mapping):
        raise ConfigError(
            _key("conf"), f"{conf!r} is not a mapping", "use e.g. {spark.ui.port: 4050}"
        )
    values["conf"] = {str(k): str(v) for k, v in conf.items()}
    for name in ("executors", "tasks_per_executor", "executor_cores", "executor_gpus"):
        _whole(values.get(name), _key(name))
    values["roles"] = _parse_roles(values.get("roles") or {})
    parsed = SparkOptions(**values)
    _check(parsed)
    return parsed


def _whole(value: Any, key: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        name = key.rsplit(".", 1)[-1]
        raise ConfigError(key, f"{value!r} is not a whole number", f"use e.g. {name}=2")


def _parse_roles(roles: Any) -> dict[str, RoleExecutors]:
    if not isinstance(roles, Mapping):
        raise ConfigError(
            _key("roles"), f"{roles!r} is not a mapping", "use e.g. {ps: {executors: 1, cores: 1}}"
        )
    known = {f.name for f in dataclasses.fields(RoleExecutors)}
    parsed = {}
    for role, entry in roles.items():
        key = _key(f"roles.{role}")
        if role not in ROLES:
            raise ConfigError(key, "not a role", f"use {', '.join(ROLES)}")
        if not isinstance(entry, Mapping):
            raise ConfigError(key, f"{entry!r} is not a mapping", "use e.g. {executors: 1}")
        for name in entry:
            if name not in known:
                raise ConfigError(
                    f"{key}.{name}", "no such key", f"known: {', '.join(sorted(known))}"
                )
        for name in ("executors", "cores", "gpus", "tasks_per_executor"):
            _whole(entry.get(name), f"{key}.{name}")
        mine = RoleExecutors(**{str(k): v for k, v in entry.items()})
        checks = [
            (mine.executors >= 1, "executors", f"{mine.executors} < 1", "use at least 1"),
            (mine.cores is None or mine.cores >= 1, "cores", f"{mine.cores} < 1", "use at least 1"),
            (mine.gpus >= 0, "gpus", f"{mine.gpus} < 0", "use 0 or more"),
            (
                mine.tasks_per_executor is None or mine.tasks_per_executor >= 1,
                "tasks_per_executor",
                f"{mine.tasks_per_executor} < 1",
                "use at least 1",
            ),
            (
                mine.memory is None or bool(_MEMORY.match(str(mine.memory))),
                "memory",
                f"{mine.memory!r} is not a JVM memory size",
                'use e.g. "1g" or "512m"',
            ),
        ]
        for ok, name, problem, fix in checks:
            if not ok:
                raise ConfigError(f"{key}.{name}", problem, fix)
        parsed[str(role)] = mine
    return parsed


def _check(o: SparkOptions) -> None:
    checks = [
        (
            o.master.startswith(MASTER_SCHEMES),
            "master",
            f"{o.master!r} is not a Spark master URL",
            "use spark://HOST:7077 (a standalone master), yarn or k8s://https://HOST:PORT",
        ),
        (
            o.executors >= (0 if o.roles else 1),
            "executors",
            f"{o.executors} < {0 if o.roles else 1}",
            "ask for at least one executor (or list roles with executors of their own)",
        ),
        (
            o.total_executors >= 1,
            "executors",
            "no executor asked for",
            "set executors >= 1, or give a role executors of its own",
        ),
        (o.executor_gpus >= 0, "executor_gpus", f"{o.executor_gpus} < 0", "use 0 or more"),
        (
            not (o.roles and o.master.startswith("local")),
            "roles",
            f"a {o.master} master runs one executor, of one shape",
            "use a spark://, yarn or k8s:// master for executors per role",
        ),
        (
            o.tasks_per_executor >= 1,
            "tasks_per_executor",
            f"{o.tasks_per_executor} < 1",
            "use at least 1",
        ),
        (o.executor_cores >= 1, "executor_cores", f"{o.executor_cores} < 1", "use at least 1"),
        (
            bool(_MEMORY.match(o.executor_memory)),
            "executor_memory",
            f"{o.executor_memory!r} is not a JVM memory size",
            'use e.g. "1g" or "512m"',
        ),
        (
            o.start_timeout_secs > 0,
            "start_timeout_secs",
            "not positive",
            "use e.g. 120",
        ),
    ]
    for ok, name, problem, fix in checks:
        if not ok:
            raise ConfigError(_key(name), problem, fix)
