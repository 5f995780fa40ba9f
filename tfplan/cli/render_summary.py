"""The plan of a large cluster, summarised: creates by role and by host, one line each.

A cluster of 9,000 tasks cannot be read block by block (and each block's TF_CONFIG lists the
whole cluster, so such a print grows with the square of the tasks). Above a threshold the
tasks to create are summarised: per role the count, names, ports, devices and restart policy;
what every task shares (command, workdir, TF_CONFIG) once; and the hosts grouped by layout.
Everything is pure: lines of ``(style, text)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tfplan.planning.plan import ROLE_ORDER, Plan, Task
from tfplan.planning.tf_config import ENV_VALUE_LIMIT, is_python

__all__ = [
    "index_ranges",
    "name_ranges",
    "restart_text",
    "summary_lines",
    "tf_config_note",
]

Line = tuple[str, str]  # (rich style, text)
STYLE = "green"


def index_ranges(indices: Iterable[int]) -> str:
    """``0-7, 9, 12-13`` from the sorted distinct indices."""
    ordered = sorted(set(indices))
    parts: list[str] = []
    start = previous = None
    for value in ordered:
        if previous is not None and value == previous + 1:
            previous = value
            continue
        if start is not None:
            parts.append(_span(start, previous))
        start = previous = value
    if start is not None:
        parts.append(_span(start, previous))
    return ", ".join(parts)


def _span(start: int, end: int | None) -> str:
    return str(start) if end is None or end == start else f"{start}-{end}"


def name_ranges(tasks: Sequence[Task]) -> str:
    """``ps/0, worker/0-7, evaluator/0``: each role's indices as ranges, roles in start order."""
    by_role: dict[str, list[int]] = {}
    for task in tasks:
        by_role.setdefault(task.role._value_, []).append(task.index)
    return ", ".join(
        f"{role}/{index_ranges(by_role[role])}" for role in ROLE_ORDER if role in by_role
    )


def restart_text(plan: Plan, role: str) -> str:
    policy = plan.policy.for_role(role)
    if policy.restart.value == "Never":
        return '"Never"'
    text = f'"{policy.restart.value}" (up to {policy.backoff_limit} restarts'
    timeout = policy.progress_timeout_secs
    return text + (f", hung after {timeout}s without a log line)" if timeout else ")")


def tf_config_note(plan: Plan, tasks: Sequence[Task]) -> str:
    """How large the tasks' TF_CONFIG is, and how it reaches them."""
    last: dict[str, Task] = {}
    for task in tasks:  # the longest task part is the highest index of each role
        if task.index >= last.get(task.role.value, task).index:
            last[task.role.value] = task
    largest = max(plan.tf_config_size(t) for t in last.values())
    counts = ", ".join(f"{len(v)} {k}" for k, v in plan.cluster_spec().items())
    text = f"the cluster spec ({counts}) + each task's type and index, {_kib(largest)}"
    if largest <= ENV_VALUE_LIMIT:
        return text
    python = all(is_python(program) for program in {t.command[0] for t in tasks})
    how = (
        "set inside the Python program by a launcher"
        if python
        else "TF_CONFIG_FILE names it (not a Python program: TF_CONFIG itself is not set)"
    )
    return (
        f"{text}: over Linux's 128 KiB limit for one environment variable, so it is written "
        f"to <workdir>/tf_config.json and {how}"
    )


def _kib(size: int) -> str:
    return f"{size} bytes" if size < 1024 else f"{size / 1024:.1f} KiB"


def _ports(tasks: Sequence[Task]) -> str:
    ports = sorted({t.port for t in tasks if t.port is not None})
    if not ports:
        return "no port"
    if len(ports) == 1:
        return f"port {ports[0]}"
    return f"ports {index_ranges(ports)}"


def _devices(tasks: Sequence[Task]) -> str:
    counts = {len(t.devices) for t in tasks}
    if counts == {0}:
        return "no GPU"
    if len(counts) == 1:
        n = counts.pop()
        return f"{n} GPU each" if n == 1 else f"{n} GPUs each"
    return f"{min(counts)}-{max(counts)} GPUs each"


def _gpus(tasks: Sequence[Task]) -> str:
    ids = [int(d) for t in tasks for d in t.devices if d.isdigit()]
    return f"GPUs {index_ranges(ids)}" if ids else "no GPU"


def _pattern(task: Task, text: str) -> str:
    """``text`` with the task's own workdir, role and index written as placeholders."""
    shown = text.replace(task.workdir, "<workdir>")
    return _own_part(task, shown)


def _own_part(task: Task, text: str) -> str:
    return text.replace(f"{task.role._value_}-{task.index}", "<role>-<index>")


def _common_lines(plan: Plan, tasks: Sequence[Task]) -> list[Line]:
    first = tasks[0]
    if plan.command_template:  # placeholders: every task's command differs
        command = {" ".join(plan.command_template) + '" (placeholders filled in per task)'}
    else:
        command = {_pattern(t, " ".join(t.command)) + '"' for t in tasks}
    workdir = {_own_part(t, t.workdir) for t in tasks}
    chiefs = [t.name for t in tasks if t.is_chief]
    rows = [
        ("chief", chiefs[0] if chiefs else "(not created by this plan)"),
        (
            "command",
            f'"{command.pop()}'
            if len(command) == 1
            else f'{len(command)} different commands, e.g. "{" ".join(first.command)}"',
        ),
        (
            "workdir",
            f'"{workdir.pop()}"' if len(workdir) == 1 else f'"{first.workdir}" and others',
        ),
        (
            "TF_CONFIG",
            tf_config_note(plan, tasks) if plan.addresses_known else "(known after apply)",
        ),
        ("handle", "(known after apply)"),
    ]
    return [(STYLE, f"      + {key:<10} = {value}") for key, value in rows]


def _role_lines(plan: Plan, tasks: Sequence[Task]) -> list[Line]:
    by_role: dict[str, list[Task]] = {}
    for task in tasks:
        by_role.setdefault(task.role._value_, []).append(task)
    rows = []
    for role in ROLE_ORDER:
        mine = by_role.get(role)
        if not mine:
            continue
        rows.append(
            [
                f"+ {role}",
                _tasks(len(mine)),
                name_ranges(mine),
                _ports(mine),
                _devices(mine),
                f"restart {restart_text(plan, role)}",
            ]
        )
    return [(STYLE, "  " + line) for line in _columns(rows)]


@dataclass(frozen=True)
class _Layout:
    roles: tuple[tuple[str, int], ...]
    ports: str
    gpus: str


def _host_lines(plan: Plan, tasks: Sequence[Task]) -> list[Line]:
    by_host: dict[str, list[Task]] = {}
    for task in tasks:
        by_host.setdefault(task.host, []).append(task)
    groups: dict[_Layout, list[str]] = {}
    for host, mine in by_host.items():
        count: dict[str, int] = {}
        for task in mine:
            count[task.role._value_] = count.get(task.role._value_, 0) + 1
        roles = tuple((r, count[r]) for r in ROLE_ORDER if r in count)
        layout = _Layout(roles, _ports(mine), _gpus(mine))
        groups.setdefault(layout, []).append(host)
    rows = []
    for layout, hosts in groups.items():
        addresses = [plan.host(h).address or "(known after apply)" for h in hosts]
        if len(hosts) == 1:
            mine = by_host[hosts[0]]
            what = f"{_tasks(len(mine))}: {name_ranges(mine)}"
        else:
            each = sum(n for _, n in layout.roles)
            what = f"{each} task{'s' if each != 1 else ''} each: " + ", ".join(
                f"{n} {r}" for r, n in layout.roles
            )
        rows.append([_some(hosts), _some(addresses), what, layout.ports, layout.gpus])
    title = f"  + {len(by_host)} host{'s' if len(by_host) != 1 else ''}, grouped by layout:"
    return [(STYLE, title)] + [(STYLE, "      " + line) for line in _columns(rows)]


def _tasks(n: int) -> str:
    return f"{n} task" if n == 1 else f"{n} tasks"


def _some(values: Sequence[str]) -> str:
    """All of a few values, or the first and last of many, with the count."""
    if len(values) <= 3:
        return ", ".join(values)
    return f"{values[0]} … {values[-1]} ({len(values)})"


def _columns(rows: list[list[str]]) -> list[str]:
    """Rows as text with aligned columns (the last column is not padded)."""
    if not rows:
        return []
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:-1])) + "  " + row[-1]
        for row in rows
    ]


def summary_lines(plan: Plan, tasks: Sequence[Task]) -> list[Line]:
    """The summary of ``tasks`` (all to be created), by role, what they share, and by host."""
    example = next((t.name for t in tasks if t.role.value == "worker"), tasks[0].name)
    lines: list[Line] = [
        ("bold", f"  # {len(tasks)} tasks will be created, summarised by role and by host"),
        ("dim", f"  #   one task in full: tfplan show --task {example}; all: tfplan plan --full"),
    ]
    lines += _role_lines(plan, tasks)
    lines += _common_lines(plan, tasks)
    lines.append(("", ""))
    lines += _host_lines(plan, tasks)
    return lines
