"""Pure: which tasks ``-target`` selects (Terraform's resource targeting).

A target is a task name (``worker/3``) or a role (``worker``: every worker). A targeted plan is
partial: only the selected tasks' changes are planned, applied or destroyed; the others are left
as they are, whatever the configuration says about them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tfplan.errors import ConfigError
from tfplan.planning.plan import ROLE_ORDER

__all__ = ["name_examples", "resolve_targets"]


def resolve_targets(targets: Sequence[str], known: Iterable[str]) -> frozenset[str]:
    """The task names among ``known`` that ``targets`` select.

    Args:
        targets: task names or roles, as given on the command line.
        known: every task name there is (the plan's and the state's).

    Raises:
        ConfigError: a target names no task; the message lists a few valid names.
    """
    names = list(dict.fromkeys(known))
    by_role: dict[str, list[str]] = {}
    for name in names:
        by_role.setdefault(name.split("/", 1)[0], []).append(name)
    present = set(names)
    selected: set[str] = set()
    for target in targets:
        wanted = target.strip().rstrip("/")
        if wanted in present:
            selected.add(wanted)
        elif wanted in by_role:
            selected.update(by_role[wanted])
        else:
            raise ConfigError(
                "-target",
                f"no task {target!r} in the configuration or the state",
                f"use a task name or a role, e.g. {name_examples(names)}",
            )
    return frozenset(selected)


def name_examples(names: Sequence[str]) -> str:
    """A few valid names: the first and the last of each role, the roles, and the count."""
    by_role: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        by_role.setdefault(name.split("/", 1)[0], []).append(name)
    return f"{_examples(by_role)} ({_count(sum(len(v) for v in by_role.values()))})"


def _examples(by_role: dict[str, list[str]]) -> str:
    shown: list[str] = []
    for role in sorted(by_role, key=lambda r: (ROLE_ORDER + (r,)).index(r)):
        tasks = by_role[role]
        shown += [tasks[0]] if len(tasks) == 1 else [tasks[0], tasks[-1]]
    roles = [r for r in by_role if len(by_role[r]) > 1]
    return ", ".join(shown[:8]) + (f", or a role ({', '.join(roles)})" if roles else "")


def _count(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"
