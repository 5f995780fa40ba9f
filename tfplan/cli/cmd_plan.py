"""`tfplan plan [OVERRIDES...]` and `tfplan show [FILE]`."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.cli.common import (
    add_experiment_option,
    add_size_arguments,
    add_target_argument,
    compose,
    refuse_targets_in_sweeps,
    show_lines,
    workspace_from,
)
from tfplan.cli.render import plan_lines, task_lines
from tfplan.cli.sweep import add_sweep_arguments, run_sweep_command
from tfplan.engine.plans import make_plan
from tfplan.engine.workspace import Workspace
from tfplan.errors import ConfigError
from tfplan.planning.plan import Action, Plan
from tfplan.planning.targets import name_examples

if TYPE_CHECKING:
    from tfplan.config.schema import Config

__all__ = ["add_parsers", "run_plan", "run_show", "task_json"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    plan = subparsers.add_parser(
        "plan",
        help="show what apply would do, and save it",
        description="Compose the config (Hydra overrides: cluster=3node algo=downpour algo.lr=0.05), "
        "place every task and show the changes against what is running.",
    )
    plan.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. cluster=3node algo.lr=0.1"
    )
    plan.add_argument(
        "-out", "--out", dest="out", help="save the plan here (default: .tfplan/plan.json)"
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    plan.add_argument(
        "--detailed-exitcode",
        "-detailed-exitcode",
        action="store_true",
        help="exit 0 when there are no changes, 2 when there are, 1 on error",
    )
    add_experiment_option(plan, "the experiment to plan", word=False)
    plan.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
    plan.add_argument(
        "--config-dir",
        help="your own config groups (DIR/cluster/mine.yaml: cluster=mine), over tfplan's; with "
        "a config.yaml, a whole config tree (default: ./conf if there)",
    )
    plan.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    plan.add_argument("--no-save", action="store_true", help="do not write a plan file")
    plan.add_argument(
        "--preflight",
        action="store_true",
        help="also run apply's preflight on every host (interpreter, TensorFlow version, "
        "free ports, folders) and show what each runs; nothing starts",
    )
    add_target_argument(plan, "plan only the changes of")
    add_size_arguments(plan)
    add_sweep_arguments(plan)
    plan.set_defaults(func=run_plan)

    show = subparsers.add_parser("show", help="show a saved plan, or one task of it in full")
    show.add_argument("file", nargs="?", help="plan file (default: .tfplan/plan.json)")
    show.add_argument("--json", action="store_true", help="print the plan (or the task) as JSON")
    show.add_argument(
        "--task",
        "-task",
        dest="tasks",
        action="append",
        default=[],
        metavar="NAME",
        help="print this task in full: every field, its environment and its TF_CONFIG "
        "(repeatable), e.g. --task worker/17",
    )
    show.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    add_size_arguments(show)
    show.set_defaults(func=run_show)


def run_plan(args: argparse.Namespace) -> int:
    refuse_targets_in_sweeps(args)
    if args.multirun:  # a dry run of the whole sweep: one line per point, nothing saved
        return run_sweep_command(args, args.overrides, dry_run=True)
    if args.cfg:
        from omegaconf import OmegaConf  # Hydra/OmegaConf load only for the verbs that compose

        from tfplan.config.compose import compose_config

        print(OmegaConf.to_yaml(compose_config(args.overrides, args.config_dir)), end="")
        return 0
    cfg = compose(args.overrides, args.config_dir)
    workspace = workspace_from(args.workspace)
    state = workspace.store(cfg.experiment.id).load()
    if state is not None and state.running:  # observe them (supervision code loads only then)
        from tfplan.engine.refresh import refreshed_state

        state = refreshed_state(workspace.store(cfg.experiment.id))
    plan = make_plan(cfg, state, targets=args.targets)
    if args.json:
        print(plan.to_json())
    else:
        show_lines(plan_lines(plan, args.render))
    if args.preflight:
        show_lines([("", line) for line in ["", *preflight_lines(plan, workspace, cfg)]])
    if not args.no_save:
        path = workspace.save_plan(plan, Path(args.out) if args.out else None)
        if not args.json:
            again = f"tfplan apply{'' if not args.out else ' ' + str(args.out)}"
            show_lines(
                [
                    ("", ""),
                    (
                        "",
                        f"Saved the plan to {path}. To perform exactly these actions, run: {again}",
                    ),
                ]
            )
    if args.detailed_exitcode:
        return 2 if plan.has_changes else 0
    return 0


def preflight_lines(plan: Plan, workspace: Workspace, cfg: Config) -> list[str]:
    """Apply's preflight on the plan's hosts, as lines. Tasks that run already keep their ports,
    so only the ports of tasks to create are checked.

    Raises:
        PreflightError: a host is not ready (the same one-line error apply would give).
    """
    from tfplan.backends import open_backend
    from tfplan.backends.transports.preflight import readiness_lines

    creates = {c.task for c in plan.changes if c.action is Action.CREATE}
    tasks = [t if t.name in creates else replace(t, port=None) for t in plan.tasks]
    with open_backend(plan.backend, workspace.store(cfg.experiment.id).scratch) as backend:
        lines = readiness_lines(backend.preflight(plan, tasks))
    return lines or [
        f"preflight passed ({plan.backend.name}: the interpreters are checked where the tasks "
        "start, once the backend has placed them)"
    ]


def run_show(args: argparse.Namespace) -> int:
    workspace = workspace_from(args.workspace)
    path = Path(args.file) if args.file else workspace.default_plan_path
    plan = workspace.load_plan(path)
    if args.tasks:
        return _show_tasks(plan, args.tasks, args.json, path)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
    else:
        show_lines(plan_lines(plan, args.render))
    return 0


def _show_tasks(plan: Plan, names: list[str], as_json: bool, path: Path) -> int:
    """``show --task``: each task in full, or as JSON (its whole environment, its TF_CONFIG).

    Raises:
        ConfigError: the plan has no such task; the message lists a few that it has.
    """
    known = [t.name for t in plan.tasks] + [c.task for c in plan.changes]
    present = set(known)
    for name in names:
        if name not in present:
            raise ConfigError(
                "--task",
                f"no task {name!r} in the plan {path}",
                f"use one of its tasks, e.g. {name_examples(known)}",
            )
    if as_json:
        print(json.dumps([task_json(plan, name) for name in names], indent=2, sort_keys=True))
        return 0
    lines = []
    for name in names:
        lines += [*task_lines(plan, name), ("", "")]
    show_lines(lines[:-1])
    return 0


def task_json(plan: Plan, name: str) -> dict[str, Any]:
    """One task as JSON: the plan file's task with its whole environment, its change and its
    TF_CONFIG (parsed)."""
    change = next((c.to_dict() for c in plan.changes if c.task == name), None)
    if not plan.has_task(name):
        return {"name": name, "change": change}
    task = plan.task(name)
    return {
        "name": name,
        **task.to_dict(),
        "change": change,
        "tf_config": json.loads(plan.tf_config(task)) if plan.addresses_known else None,
    }
