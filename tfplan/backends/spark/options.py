"""The Spark backend's options (``cluster.options``), checked before anything starts."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfplan.errors import ConfigError

__all__ = ["SparkOptions", "parse_options", "MASTER_SCHEMES"]

MASTER_SCHEMES = ("spark://", "yarn", "k8s://", "local")
_MEMORY = re.compile(r"^\d+[kmgtKMGT]?$")


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

    def submit_conf(self) -> dict[str, str]:
        """The ``--conf`` settings of the application (tfplan's, then the user's)."""
        settings = {
            "spark.executor.cores": str(self.executor_cores),
            "spark.task.cpus": str(self.executor_cores),
            "spark.cores.max": str(self.executors * self.executor_cores),
            "spark.executor.instances": str(self.executors),
            "spark.executor.memory": self.executor_memory,
            # an agent's task must not be run twice at once (a speculative copy), and Spark
            # must not give up on the application when an executor is lost
            "spark.speculation": "false",
            "spark.task.maxFailures": "4",
            "spark.dynamicAllocation.enabled": "false",
        }
        if self.driver_host:
            settings["spark.driver.host"] = self.driver_host
        return {**settings, **{str(k): str(v) for k, v in self.conf.items()}}

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
    for name in ("executors", "tasks_per_executor", "executor_cores"):
        value = values.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(_key(name), f"{value!r} is not a whole number", f"use e.g. {name}=2")
    parsed = SparkOptions(**values)
    _check(parsed)
    return parsed


def _check(o: SparkOptions) -> None:
    checks = [
        (
            o.master.startswith(MASTER_SCHEMES),
            "master",
            f"{o.master!r} is not a Spark master URL",
            "use spark://HOST:7077 (a standalone master), yarn or k8s://https://HOST:PORT",
        ),
        (o.executors >= 1, "executors", f"{o.executors} < 1", "ask for at least one executor"),
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
