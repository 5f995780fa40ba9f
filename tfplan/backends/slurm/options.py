"""The Slurm backend's options (``cluster.options``), checked before anything is submitted."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfplan.errors import ConfigError

__all__ = ["SlurmOptions", "parse_options"]

_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$|^INFINITE$", re.IGNORECASE)
_NAME = re.compile(r"^[A-Za-z0-9_.:+-]+$")


@dataclass(frozen=True)
class SlurmOptions:
    """What tfplan asks Slurm for. One job holds the allocation; each task is a step in it.

    Attributes:
        nodes: how many nodes the job asks for (``sbatch --nodes``).
        tasks_per_node: tfplan tasks that may share one node (``--ntasks-per-node``); the
            planner places at most this many on each.
        partition: ``--partition`` (None: the cluster's default).
        account: ``--account`` (None: the user's default).
        time_limit: ``--time`` ("01:00:00", "2-00:00:00"; None: the partition's limit).
        gpus_per_node: ``--gres=gpu:N``; workers get one GPU each (CUDA_VISIBLE_DEVICES).
        cpus_per_task: ``--cpus-per-task`` of the job (None: Slurm's default of 1).
        mem: ``--mem`` per node ("16G"; None: Slurm's default).
        job_name: the job's name in squeue (default ``tfplan-<experiment>``).
        sbatch_args: extra ``sbatch`` options, as words (``["--qos=high"]``).
        srun_args: extra options for every task's ``srun`` step.
        pending_timeout_secs: give up (and cancel) when the job is not running after this long
            (None: wait as long as it takes; Ctrl-C cancels).
    """

    nodes: int = 1
    tasks_per_node: int = 4
    partition: str | None = None
    account: str | None = None
    time_limit: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    mem: str | None = None
    job_name: str | None = None
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)
    srun_args: tuple[str, ...] = field(default_factory=tuple)
    pending_timeout_secs: float | None = None

    def sbatch_options(self, experiment_id: str) -> list[str]:
        """The allocation request, as ``sbatch`` options (also used for ``--test-only``)."""
        words = [
            f"--job-name={self.job_name or f'tfplan-{experiment_id}'}",
            f"--nodes={self.nodes}",
            f"--ntasks-per-node={self.tasks_per_node}",
        ]
        optional = {
            "--partition": self.partition,
            "--account": self.account,
            "--time": self.time_limit,
            "--cpus-per-task": self.cpus_per_task,
            "--mem": self.mem,
        }
        words += [f"{flag}={value}" for flag, value in optional.items() if value is not None]
        if self.gpus_per_node:
            words.append(f"--gres=gpu:{self.gpus_per_node}")
        return [*words, *self.sbatch_args]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["sbatch_args"] = list(self.sbatch_args)
        data["srun_args"] = list(self.srun_args)
        return data


def _key(name: str) -> str:
    return f"cluster.options.{name}"


def parse_options(options: Mapping[str, Any]) -> SlurmOptions:
    """Typed, checked options.

    Raises:
        ConfigError: an unknown key, a wrong type or a value out of range, naming the key.
    """
    known = {f.name for f in dataclasses.fields(SlurmOptions)}
    for name in options:
        if name not in known:
            raise ConfigError(
                _key(str(name)), "no such Slurm option", f"known: {', '.join(sorted(known))}"
            )
    values = dict(options)
    for name in ("sbatch_args", "srun_args"):
        words = values.get(name) or ()
        if isinstance(words, str) or not all(isinstance(w, str) for w in words):
            raise ConfigError(
                _key(name), f"{words!r} is not a list of words", 'use e.g. ["--qos=high"]'
            )
        values[name] = tuple(words)
    for name in ("nodes", "tasks_per_node", "gpus_per_node", "cpus_per_task"):
        value = values.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(_key(name), f"{value!r} is not a whole number", f"use e.g. {name}=2")
    parsed = SlurmOptions(**values)
    _check(parsed)
    return parsed


def _check(o: SlurmOptions) -> None:
    checks = [
        (o.nodes >= 1, "nodes", f"{o.nodes} < 1", "ask for at least one node"),
        (o.tasks_per_node >= 1, "tasks_per_node", f"{o.tasks_per_node} < 1", "use at least 1"),
        (o.gpus_per_node >= 0, "gpus_per_node", f"{o.gpus_per_node} < 0", "use 0 for CPU nodes"),
        (
            o.cpus_per_task is None or o.cpus_per_task >= 1,
            "cpus_per_task",
            f"{o.cpus_per_task} < 1",
            "use at least 1, or null",
        ),
        (
            o.time_limit is None or bool(_TIME.match(o.time_limit)),
            "time_limit",
            f"{o.time_limit!r} is not a Slurm time",
            'use e.g. "01:00:00" or "2-00:00:00"',
        ),
        (
            o.job_name is None or bool(_NAME.match(o.job_name)),
            "job_name",
            f"{o.job_name!r} has characters Slurm tools display badly",
            "use letters, digits and _.:+-",
        ),
        (
            o.pending_timeout_secs is None or o.pending_timeout_secs > 0,
            "pending_timeout_secs",
            "not positive",
            "use e.g. 600, or null to wait as long as it takes",
        ),
    ]
    for ok, name, problem, fix in checks:
        if not ok:
            raise ConfigError(_key(name), problem, fix)
