"""Render a Plan the way ``terraform plan`` renders infrastructure, or as JSON.

:func:`plan_lines` is pure (a list of ``(style, text)`` lines); :func:`print_plan` sends them
through rich, which drops the colours when stdout is not a terminal.

Size: a small cluster is printed block by block, each with its TF_CONFIG. A cluster of more
than :data:`SUMMARY_THRESHOLD` tasks is printed compactly: the tasks to create summarised by
role and host (:mod:`tfplan.cli.render_summary`), every other change on its own, without the
TF_CONFIG (which lists the whole cluster); ``tfplan show --task NAME`` prints one task in full.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tfplan.cli.render_summary import restart_text, summary_lines, tf_config_note
from tfplan.planning.costs import job_cost
from tfplan.planning.footprint import (
    delta_chains,
    plan_checkpoints,
    print_bytes,
    snapshot_bytes,
)
from tfplan.planning.memory import limit_text
from tfplan.planning.plan import Action, Change, Plan, Role, Task
from tfplan.planning.tf_config import ENV_VALUE_LIMIT

if TYPE_CHECKING:  # rich loads only to print to a terminal
    from rich.console import Console

__all__ = [
    "SUMMARY_THRESHOLD",
    "Line",
    "format_bytes",
    "plan_lines",
    "print_plan",
    "summary_line",
    "task_lines",
]

# More tasks than this in the plan: compact blocks; more tasks to create: a summary of them.
SUMMARY_THRESHOLD = 32

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


def plan_lines(plan: Plan, mode: str = "auto") -> list[Line]:
    """Every line of the rendering, in order.

    Args:
        mode: ``auto`` (full blocks up to :data:`SUMMARY_THRESHOLD` tasks, else compact),
            ``full`` (every block with its TF_CONFIG, however large) or ``summary``.
    """
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
        what = "The targeted tasks match" if plan.targets else "Your cluster matches"
        lines.append(("bold green", f"No changes. {what} the configuration."))
        lines += _footer(plan)
        return lines
    present = [a for a in _SYMBOL if any(c.action is a for c in plan.changes)]
    lines.append(("", "Actions are indicated with the following symbols:"))
    for action in present:
        lines.append((_STYLE[action], f"  {_SYMBOL[action]:>3} {_LEGEND[action]}"))
    lines.append(("", ""))
    lines.append(("", "tfplan will perform the following actions:"))
    lines += _changes(plan, mode)
    lines.append(("", ""))
    lines += _footer(plan)
    lines.append(("", ""))
    lines.append(("bold", summary_line(plan)))
    cost = job_cost(plan.changes)
    if cost:
        lines.append(("yellow", cost))
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _changes(plan: Plan, mode: str) -> list[Line]:
    compact = mode == "summary" or (mode == "auto" and len(plan.tasks) > SUMMARY_THRESHOLD)
    creates = [c for c in plan.changes if c.action is Action.CREATE]
    summarise = compact and len(creates) > (0 if mode == "summary" else SUMMARY_THRESHOLD)
    lines: list[Line] = []
    if summarise:
        lines.append(("", ""))
        lines += summary_lines(plan, [plan.task(c.task) for c in creates])
    for change in plan.changes:
        if change.action is Action.NOOP or (summarise and change.action is Action.CREATE):
            continue
        if compact:
            lines += _compact_block(plan, change)
        else:
            lines.append(("", ""))
            lines += _change_block(plan, change)
    return lines


def _compact_block(plan: Plan, change: Change) -> list[Line]:
    """One change in a few lines: why, and where the task runs (``show --task`` has the rest)."""
    style, symbol = _STYLE[change.action], _SYMBOL[change.action]
    lines: list[Line] = [("", ""), ("bold", f"  # {change.task} {_VERB[change.action]}")]
    lines += [("dim", f"  #   {reason}") for reason in change.reasons]
    if change.cost:
        lines.append(("yellow", f"  #   cost: {change.cost}"))
    if change.action is Action.DESTROY:
        fields = [
            f"{k} = {_value(change.previous[k])}"
            for k in ("host", "port", "status")
            if k in change.previous
        ]
    else:
        task = plan.task(change.task)
        address = plan.address_of(task)
        fields = [
            f'host = "{task.host}"' + (f" ({address})" if address else f" {AFTER_APPLY}"),
            f"port = {task.port if task.port is not None else '(none)'}",
            "devices = [" + ", ".join(f'"{d}"' for d in task.devices) + "]",
        ]
        if task.is_chief:
            fields.append("chief = true")
        if task.memory_limit is not None:
            fields.append(f"memory = {limit_text(task.memory_limit)}")
    lines.append((style, f'  {symbol} task "{change.task}" {{ {", ".join(fields)} }}'))
    return lines


def _change_block(plan: Plan, change: Change) -> list[Line]:
    style = _STYLE[change.action]
    symbol = _SYMBOL[change.action]
    lines: list[Line] = [("bold", f"  # {change.task} {_VERB[change.action]}")]
    for reason in change.reasons:
        lines.append(("dim", f"  #   {reason}"))
    if change.cost:
        lines.append(("yellow", f"  #   cost: {change.cost}"))
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


def _memory(task: Task) -> str:
    return f"{limit_text(task.memory_limit)} (a cgroup of its own)"


def _task_fields(plan: Plan, task: Task) -> list[tuple[str, str]]:
    address = plan.address_of(task)
    known = plan.addresses_known
    memory = [] if task.memory_limit is None else [("memory", _memory(task))]
    return [
        ("host", f'"{task.host}" ({address})' if address else f'"{task.host}" {AFTER_APPLY}'),
        ("port", str(task.port) if task.port is not None else "(none: not in the cluster spec)"),
        ("chief", "true" if task.is_chief else "false"),
        ("devices", "[" + ", ".join(f'"{d}"' for d in task.devices) + "]"),
        *memory,
        (
            "command",
            _value(" ".join(task.command))
            + ("" if known or not plan.command_template else f" {AFTER_APPLY}"),
        ),
        ("workdir", _value(task.workdir)),
        ("TF_CONFIG", plan.tf_config(task) if known else AFTER_APPLY),
        ("restart", restart_text(plan, task.role.value)),
        ("handle", AFTER_APPLY),
    ]


def task_lines(plan: Plan, name: str) -> list[Line]:
    """One task in full (``tfplan show --task NAME``): what the plan does to it, every field,
    its environment and its TF_CONFIG, however large the cluster.

    Raises:
        KeyError: the plan has no task of that name (neither desired nor destroyed).
    """
    change = next((c for c in plan.changes if c.task == name), None)
    if not plan.has_task(name):
        if change is None:
            raise KeyError(name)
        return _change_block(plan, change)
    task = plan.task(name)
    action = change.action if change is not None else Action.NOOP
    if action is Action.NOOP:
        note = "not targeted by this plan" if plan.targets and change is None else "no changes"
        head: list[Line] = [("bold", f"  # {name}: {note}")]
        style, symbol, inner = "", " ", " "
    else:
        head = [("bold", f"  # {name} {_VERB[action]}")]
        head += [("dim", f"  #   {reason}") for reason in change.reasons] if change else []
        head += [("yellow", f"  #   cost: {change.cost}")] if change and change.cost else []
        style, symbol = _STYLE[action], _SYMBOL[action]
        inner = "~" if action is Action.UPDATE else "+"
    lines = [*head, (style, f'  {symbol} task "{name}" {{')]
    for key, value in _task_fields(plan, task):
        if key == "TF_CONFIG" and plan.addresses_known:
            value = json.dumps(json.loads(value), indent=2).replace("\n", "\n" + " " * 19)
            if plan.tf_config_size(task) > ENV_VALUE_LIMIT:
                lines.append(
                    (style, f"      {inner} {'delivery':<10} = {tf_config_note(plan, [task])}")
                )
        lines.append((style, f"      {inner} {key:<10} = {value}"))
    lines.append((style, f"      {inner} {'log':<10} = {_value(task.log_path)}"))
    lines.append((style, f"      {inner} env        = {{"))
    for key, value in sorted(task.env.items()):
        lines.append((style, f"          {key} = {_value(value)}"))
    lines += [(style, "        }"), (style, "    }")]
    return lines


def _value(value: object) -> str:
    return f'"{value}"' if isinstance(value, str) else str(value)


MAX_VARIABLES_SHOWN = 40


def _footer(plan: Plan) -> list[Line]:
    lines: list[Line] = []
    sharding = plan.sharding
    if sharding.placements:
        lines.append(
            (
                "bold",
                f"Variables: {len(sharding.variables)} ({format_bytes(sharding.total_bytes)}) "
                f"over {len(sharding.placements[0].bytes_per_ps)} parameter server(s)"
                + (f", shapes from {sharding.source}" if sharding.source else "")
                + ":",
            )
        )
        for placement in sharding.placements:
            note = (
                " (replica_device_setter's default, used)"
                if placement.strategy == "round_robin"
                else ""
            )
            lines.append(
                ("", f"  {placement.strategy:<13} {_spread(placement.bytes_per_ps)}{note}")
            )
        if sharding.source:  # a user's model: its variables, where round-robin puts them
            used = sharding.placements[0].assignment
            shown = sharding.variables[:MAX_VARIABLES_SHOWN]
            for var in shown:
                shape = "x".join(str(d) for d in var.shape) or "scalar"
                lines.append(
                    (
                        "",
                        f"    {var.name:<40} {shape:<14} {format_bytes(var.bytes):>10}"
                        f"  ps/{used[var.name]}",
                    )
                )
            if len(sharding.variables) > len(shown):
                lines.append(("", f"    ... {len(sharding.variables) - len(shown)} more"))
    lines += _table_lines(plan)
    lines += _checkpoint_lines(plan)
    for code in plan.user_code:
        lines.append(
            (
                "",
                f"Your code: {code.name} ({code.files} file(s), {format_bytes(code.bytes)}) from "
                f"{code.source}, shipped to {plan.code_dir}/{code.name} "
                f"({', '.join(code.keys)})",
            )
        )
    if plan.data_note:
        lines.append(("", f"Data: {plan.data_note}"))
    for warning in plan.warnings:
        lines.append(("", ""))
        lines.append(("bold yellow", f"Warning: {warning}"))
    if plan.targets:
        lines += targeting_warning(plan)
    return lines


def _checkpoint_lines(plan: Plan) -> list[Line]:
    """What keeping the chief's checkpoints takes (tfplan/planning/footprint.py)."""
    size = plan_checkpoints(plan)
    if size is None:
        return []
    slots = f" and {size.slots} {size.optimizer} slot(s) each" if size.slots else ""
    return [
        (
            "",
            f"Checkpoints: at least {format_bytes(size.each)} each (the variables{slots}), "
            f"{size.kept} kept (trainer.keep_checkpoints): {format_bytes(size.total)} in "
            f"{plan.output_dir}",
        )
    ] + _snapshot_lines(plan)


def _snapshot_lines(plan: Plan) -> list[Line]:
    """What the in-memory snapshots take on the ps hosts (tfplan/planning/footprint.py)."""
    hosts = snapshot_bytes(plan)
    if not hosts:
        return []
    snapshots = plan.run_config.get("snapshots") or {}
    chains = delta_chains(plan)
    each = ", ".join(f"{host} {format_bytes(n)}" for host, n in hosts.items())
    if len(hosts) > 3:
        each = (
            f"at most {format_bytes(max(hosts.values()))} on each of {len(hosts)} hosts "
            f"({format_bytes(sum(hosts.values()))} in all)"
        )
    copies = (
        bool(snapshots.get("copies", True)) and sum(1 for t in plan.tasks if t.role is Role.PS) > 1
    )
    also = (
        " and on the next ps's host (lifecycle.snapshot_copies), two slots each"
        if copies
        else ", two copies of its variables"
    )
    return [
        (
            "",
            f"Snapshots: every {float(snapshots['secs']):g}s (lifecycle.snapshot_secs), each ps "
            f"into {snapshots.get('folder')} on its host{also}: {each}"
            + (
                f"; {', '.join(f'ps/{k}' for k in sorted(chains))}: a full snapshot, then only "
                "the rows changed (lifecycle.snapshot_deltas; their rows' fingerprints "
                f"{format_bytes(sum(print_bytes(plan).values()))} on the ps)"
                if chains
                else ""
            ),
        )
    ]


_READS = {
    "rows": "only the batch's rows",
    "whole": "the whole table",
    "window": "from the worker's copy; the whole table at every window's pull and push",
    "replica": "its own copy (no ps; the gradients are all-reduced)",
}


def _table_lines(plan: Plan) -> list[Line]:
    """The user's embedding tables: size, bytes per ps with slots, what a step moves."""
    tables = plan.sharding.tables
    if not tables:
        return []
    algo = plan.run_config.get("algo") or {}
    batch = (plan.run_config.get("data") or {}).get("batch_size")
    slots = tables[0].slots
    lines: list[Line] = [
        (
            "bold",
            f"Embedding tables: {len(tables)} (algo.optimizer={algo.get('optimizer', 'sgd')}: "
            f"{slots} slot(s) per row; per step at data.batch_size={batch}):",
        )
    ]
    for t in tables:
        fed = f", feature {t.feature!r}" if t.feature else ""
        lines.append(
            (
                "",
                f"  {t.name}  {t.rows:,} x {t.width}  {format_bytes(t.bytes)}  "
                f"(layer {t.layer!r}{fed})",
            )
        )
        where = (
            f"with slots on ps: {_spread(t.bytes_per_ps)}"
            if t.bytes_per_ps
            else f"whole on every worker, {format_bytes(t.bytes * (1 + t.slots))} with slots"
        )
        lines.append(("", f"    {where}"))
        if t.dynamic is not None:
            d = t.dynamic
            lines.append(
                (
                    "",
                    f"    dynamic: raw {d.ids} ids, capacity {d.capacity:,} rows "
                    f"({d.rows_per_shard:,} per ps, with its id index); a row once an id is "
                    f"seen {d.min_count} time(s) (model.min_count), freed when unseen for "
                    f"{d.ttl_steps:,} steps (model.ttl_steps) or, least recently seen first, "
                    "above 90 % full",
                )
            )
        rows = f"<= {t.rows_per_step:,} rows" if t.rows_per_step is not None else "rows unknown"
        moved = f"reads {_READS[t.reads]}"
        if t.read_bytes_per_step is not None:
            moved += f" (<= {format_bytes(t.read_bytes_per_step)})"
        if t.write_bytes_per_step is not None:
            moved += f", writes the batch's rows (<= {format_bytes(t.write_bytes_per_step)})"
        lines.append(("", f"    a step: {rows}; {moved}"))
    return lines


def targeting_warning(plan: Plan) -> list[Line]:
    """Terraform's "Resource targeting is in effect", with what this plan leaves out."""
    left = plan.left_out
    counts = ", ".join(f"{n} to {_LEFT_OUT[a]}" for a, n in sorted(left.items()) if n)
    others = (
        f" {sum(left.values())} change(s) to other tasks are left out ({counts}): run "
        "`tfplan plan` without -target to see them."
        if left
        else ""
    )
    return [
        ("", ""),
        ("bold yellow", "Warning: Resource targeting is in effect"),
        (
            "",
            f"This plan was made with -target {' -target '.join(plan.targets)}: it may not "
            f"represent all of the changes the configuration asks for.{others} The -target "
            "option is for exceptional situations such as repairing a task by hand, not for "
            "routine use.",
        ),
    ]


_LEFT_OUT = {
    Action.CREATE.value: "add",
    Action.UPDATE.value: "change",
    Action.REPLACE.value: "replace",
    Action.DESTROY.value: "destroy",
}


def _spread(bytes_per_ps: tuple[int, ...], shown: int = 8) -> str:
    """Each ps's bytes; with many ps, the first few that hold any and how many hold none."""
    pairs = list(enumerate(bytes_per_ps))
    if len(pairs) <= shown:
        return ", ".join(f"ps/{i} {format_bytes(b)}" for i, b in pairs)
    holding = [(i, b) for i, b in pairs if b]
    text = ", ".join(f"ps/{i} {format_bytes(b)}" for i, b in holding[:shown])
    if len(holding) > shown:
        text += f" and {len(holding) - shown} more"
    empty = len(pairs) - len(holding)
    return text + (f"; {empty} of {len(pairs)} ps hold none" if empty else "")


def print_lines(lines: list[Line], console: Console) -> None:
    """Styled lines in one print (rich costs ~50 µs a call: 10,000 lines took seconds); plain
    text written as is when the console is not a terminal."""
    if console.color_system is None:
        console.file.write("".join(text + "\n" for _, text in lines))
        console.file.flush()
        return
    from rich.text import Text

    out = Text()
    for style, text in lines:
        out.append(text, style=style or None)
        out.append("\n")
    console.print(out, soft_wrap=True, end="")


def print_plan(plan: Plan, console: Console, mode: str = "auto") -> None:
    print_lines(plan_lines(plan, mode), console)
