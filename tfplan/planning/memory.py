"""Pure: ``cluster.memory``, a memory limit per role, each task in a cgroup of its own.

A limit is bytes (an int, or a string of digits), a size with a unit (``512MiB``, ``1GiB``,
``1.5G``, ``800M``: every unit is a power of 1024, ``K``/``KB``/``KiB`` alike, as Slurm's
``--mem`` and Docker read them), or null (no limit). The chief takes ``cluster.memory.chief``
whichever task it is: worker 0 with ``cluster.chief=worker0`` too (it also saves the
checkpoints and scores the final one, so it is sized apart from the other workers).

Only the process backend puts its tasks in cgroups of their own; the others have their own
knob, named when ``cluster.memory`` is refused (:func:`check_memory`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tfplan.errors import ConfigError

__all__ = [
    "MEMORY_ROLES",
    "MIN_LIMIT",
    "check_memory",
    "limit_text",
    "memory_key",
    "memory_limits",
    "memory_warnings",
    "parse_limit",
]

MEMORY_ROLES = ("ps", "chief", "worker", "evaluator")
MIN_LIMIT = 64 * 2**20
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([KMGTkmgt])(?:i?[Bb]|i)?|[Bb])?\s*$")
_OTHER_BACKENDS = {
    "kubernetes": "set cluster.options.resources.<role>.limits.memory (the pod's own limit)",
    "slurm": "Slurm's limit is per node: set cluster.options.mem (sbatch --mem; held per "
    "task step where Slurm's task/cgroup plugin is on)",
    "spark": "give the role executors of its own (cluster.options.roles.<role>: executors, "
    "cores, memory), which keeps it apart from the other roles",
}


def parse_limit(value: Any) -> int | None:
    """A limit in bytes, or None for no limit.

    Raises:
        ValueError: not a whole number of bytes, nor a size with a unit.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{value!r} is not a size")
    if isinstance(value, int):
        return value
    found = _SIZE.match(value)
    if found is None:
        raise ValueError(f"{value!r} is not a size")
    number, unit = found.group(1), (found.group(2) or "").upper()
    if "." in number and not unit:
        raise ValueError(f"{value!r} is not a whole number of bytes")
    return int(float(number) * _UNITS[unit])


def memory_key(role: str, is_chief: bool) -> str:
    """The role of ``cluster.memory`` a task takes its limit from."""
    return "chief" if is_chief else role


def memory_limits(memory: Mapping[str, Any]) -> dict[str, int | None]:
    """``cluster.memory`` as role -> bytes (None: no limit); validated by :func:`check_memory`."""
    return {str(role): parse_limit(value) for role, value in memory.items()}


def limit_text(limit: int | None) -> str:
    """``1.0 GiB``, ``300.0 MiB``, as the plan shows sizes; ``no limit`` for None."""
    if limit is None:
        return "no limit"
    value = float(limit)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{limit} B"  # pragma: no cover - the loop always returns


def check_memory(memory: Mapping[str, Any], backend: str) -> None:
    """Refuse an unknown role, a value that is no size, a limit too small to run a task, and
    limits on a backend other than ``process``.

    Raises:
        ConfigError: naming the key and the fix.
    """
    for role, value in memory.items():
        key = f"cluster.memory.{role}"
        if role not in MEMORY_ROLES:
            raise ConfigError(
                key, "no such role", f"give limits for {', '.join(MEMORY_ROLES)} (each or none)"
            )
        try:
            limit = parse_limit(value)
        except ValueError as error:
            raise ConfigError(
                key,
                str(error),
                "give bytes or a size with a unit, e.g. 512MiB, 1GiB, 1.5G (units are powers "
                "of 1024), or null for no limit",
            ) from None
        if limit is not None and limit < MIN_LIMIT:
            raise ConfigError(
                key,
                f"{limit_text(limit)} is under {limit_text(MIN_LIMIT)}",
                "a TensorFlow process alone needs about 400 MiB: give it at least that, or null",
            )
    if backend != "process" and any(v is not None for v in memory.values()):
        fix = _OTHER_BACKENDS.get(backend, "limit the tasks' memory with the backend's own options")
        raise ConfigError(
            "cluster.memory",
            f"the {backend} backend does not put tasks in cgroups of their own (only the "
            "process backend does)",
            f"remove cluster.memory and {fix}",
        )


def memory_warnings(
    limits: Mapping[str, int | None], chief_is_worker: bool, workers: int
) -> tuple[str, ...]:
    """What a limit of the workers leaves out: worker 0 as the chief takes the chief's."""
    if not chief_is_worker or workers < 1 or limits.get("worker") is None or "chief" in limits:
        return ()
    return (
        "cluster.memory.worker is set but worker/0 is the chief (cluster.chief=worker0), whose "
        "limit is cluster.memory.chief: it runs without one. Set cluster.memory.chief too "
        "(null: no limit, meant)",
    )
