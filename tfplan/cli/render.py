"""Render a Plan the way ``terraform plan`` renders infrastructure, or as JSON.

:func:`plan_lines` is pure (a list of ``(style, text)`` lines); :func:`print_plan` sends them
through rich, which drops the colours when stdout is not a terminal.
"""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from tfplan.planning.plan import Action, Change, Plan, Task

__all__ = ["plan_lines", "print_plan", "summary_line", "format_bytes"]

_SYMBOL = {
    Action.CREATE: "+",
    Action.UPDATE: "~",
    Action.REPLACE: "-/+",
    Action.DESTROY: "-",
}
_LEGEND = {
    Action.CREATE: "create",
    Action.UPDATE: "update in-place",
    Action.REPLACE: "destroy and then create replacement",
    Action.DESTROY: "destroy",
}
_VERB = {
    Action.CREATE: "will be created",
    Action.UPDATE: "will be updated in-place",
    Action.REPLACE: "must be replaced",
    Action.DESTROY: "will be destroyed",
}
_STYLE = {
    Action.CREATE: "green",
    Action.UPDATE: "yellow",
    Action.REPLACE: "magenta",
    Action.DESTROY: "red",
}

Line = tuple[str, str]  # (rich style, text)


def format_bytes(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def summary_line(plan: Plan) -> str:
    counts = plan.counts()
    add = counts[Action.CREATE] + counts[Action.REPLACE]
    change = counts[Action.UPDATE]
    destroy = counts[Action.DESTROY] + counts[Action.REPLACE]
    return f"Plan: {add} to add, {change} to change, {destroy} to destroy."


def plan_lines(plan: Plan) -> list[Line]:
    """Every line of the rendering, in order."""
    lines: list[Line] = []
    hosts = _count(len({t.host for t in plan.tasks}), "host")
    header = (
        f'tfplan plan for experiment "{plan.experiment_id}" on cluster "{plan.cluster_name}" '
        f"({_count(len(plan.tasks), 'task')} on {hosts}, backend {plan.backend.name})"
    )
    lines.append(("bold", header))
    lines.append(("", ""))
    if plan.request:
        lines.append(("bold", f"The {plan.backend.name} backend will ask for:"))
        lines += [("", f"  {line}") for line in plan.request]
        lines.append(("", ""))
    if not plan.has_changes:
        lines.append(("bold green", "No changes. Your cluster matches the configuration."))
        lines += _footer(plan)
        return lines
    present = [a for a in _SYMBOL if any(c.action is a for c in plan.changes)]
    lines.append(("", "Actions are indicated with the following symbols:"))
    for action in present:
        lines.append((_STYLE[action], f"  {_SYMBOL[action]:>3} {_LEGEND[action]}"))
    lines.append(("", ""))
    lines.append(("", "tfplan will perform the following actions:"))
    for change in plan.changes:
        if change.action is Action.NOOP:
            continue
        lines.append(("", ""))
        lines += _change_block(plan, change)
    lines.append(("", ""))
    lines += _footer(plan)
    lines.append(("", ""))
    lines.append(("bold", summary_line(plan)))
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _change_block(plan: Plan, change: Change) -> list[Line]:
    style = _STYLE[change.action]
    symbol = _SYMBOL[change.action]
    lines: list[Line] = [("bold", f"  # {change.task} {_VERB[change.action]}")]
    for reason in change.reasons:
        lines.append(("dim", f"  #   {reason}"))
    if change.action is Action.DESTROY:
        lines.append((style, f'  {symbol} task "{change.task}" {{'))
        for key in ("host", "port", "status"):
            if key in change.previous:
                lines.append((style, f"      {symbol} {key:<10} = {_value(change.previous[key])}"))
        lines.append((style, "    }"))
        return lines
    task = plan.task(change.task)
    lines.append((style, f'  {symbol} task "{task.name}" {{'))
    inner = "~" if change.action is Action.UPDATE else "+"
    for key, value in _task_fields(plan, task):
        lines.append((style, f"      {inner} {key:<10} = {value}"))
    lines.append((style, "    }"))
    return lines


AFTER_APPLY = "(known after apply)"


def _task_fields(plan: Plan, task: Task) -> list[tuple[str, str]]:
    address = plan.address_of(task)
    known = plan.addresses_known
    return [
        ("host", f'"{task.host}" ({address})' if address else f'"{task.host}" {AFTER_APPLY}'),
        ("port", str(task.port) if task.port is not None else "(none: not in the cluster spec)"),
        ("chief", "true" if task.is_chief else "false"),
        ("devices", "[" + ", ".join(f'"{d}"' for d in task.devices) + "]"),
        (
            "command",
            _value(" ".join(task.command))
            + ("" if known or not plan.command_template else f" {AFTER_APPLY}"),
        ),
        ("workdir", _value(task.workdir)),
        ("TF_CONFIG", plan.tf_config(task) if known else AFTER_APPLY),
        ("restart", _restart(plan, task)),
        ("handle", AFTER_APPLY),
    ]


def _restart(plan: Plan, task: Task) -> str:
    policy = plan.policy.for_role(task.role.value)
    if policy.restart.value == "Never":
        return '"Never"'
    text = f'"{policy.restart.value}" (up to {policy.backoff_limit} restarts'
    timeout = policy.progress_timeout_secs
    return text + (f", hung after {timeout}s without a log line)" if timeout else ")")


def _value(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


def _footer(plan: Plan) -> list[Line]:
    lines: list[Line] = []
    sharding = plan.sharding
    if sharding.placements:
        lines.append(
            (
                "bold",
                f"Variables: {len(sharding.variables)} ({format_bytes(sharding.total_bytes)}) "
                f"over {len(sharding.placements[0].bytes_per_ps)} parameter server(s):",
            )
        )
        for placement in sharding.placements:
            note = (
                " (replica_device_setter's default, used)"
                if placement.strategy == "round_robin"
                else ""
            )
            spread = ", ".join(
                f"ps/{i} {format_bytes(b)}" for i, b in enumerate(placement.bytes_per_ps)
            )
            lines.append(("", f"  {placement.strategy:<13} {spread}{note}"))
    for warning in plan.warnings:
        lines.append(("", ""))
        lines.append(("bold yellow", f"Warning: {warning}"))
    return lines


def print_plan(plan: Plan, console: Console) -> None:
    for style, text in plan_lines(plan):
        console.print(Text(text, style=style or ""), soft_wrap=True)
