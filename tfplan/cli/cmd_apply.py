"""`tfplan apply [PLANFILE | OVERRIDES...]`: start the cluster and supervise it to the end."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from tfplan.cli.common import (
    add_experiment_option,
    add_size_arguments,
    add_target_argument,
    approved,
    console,
    refuse_targets_in_sweeps,
    workspace_from,
)
from tfplan.cli.output import (
    LogPrinter,
    add_all_lines_argument,
    recoveries_line,
    start_progress,
    step_progress,
)
from tfplan.cli.render import print_lines, print_plan, targeting_warning
from tfplan.cli.sweep import add_sweep_arguments, run_sweep_command
from tfplan.engine.background import start_background_supervisor, take_over_from_background
from tfplan.engine.lognoise import shows_tf_noise
from tfplan.engine.plans import check_user_code, make_plan
from tfplan.engine.refresh import refreshed_state
from tfplan.engine.runner import ExperimentRun
from tfplan.engine.supervisor import Outcome
from tfplan.engine.workspace import Workspace
from tfplan.errors import ApplyError, StaleStateError, TfplanError
from tfplan.planning.plan import Action, Plan
from tfplan.planning.state import check_plan_is_current

__all__ = ["add_parsers", "run_apply"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    apply = subparsers.add_parser(
        "apply",
        help="start the planned cluster and supervise it until training ends",
        description="With no argument: apply the plan saved by `tfplan plan` (refused if stale; "
        "without a saved plan, plan the defaults first). With Hydra overrides: plan, show, ask, "
        "apply. With a file: apply that saved plan.",
    )
    apply.add_argument(
        "args",
        nargs="*",
        metavar="PLANFILE|OVERRIDES",
        help="a saved plan file, or Hydra overrides such as cluster=local algo.lr=0.1",
    )
    apply.add_argument(
        "--auto-approve", "-auto-approve", action="store_true", help="do not ask before applying"
    )
    apply.add_argument(
        "--detach",
        action="store_true",
        help="return once every task is started; a background supervisor watches them to the "
        "end (tfplan status shows it, tfplan watch follows it, tfplan destroy stops it)",
    )
    add_experiment_option(apply, "the experiment to plan and apply", word=False)
    apply.add_argument(
        "--config-dir",
        help="your own config groups (DIR/cluster/mine.yaml: cluster=mine), over tfplan's; with "
        "a config.yaml, a whole config tree (default: ./conf if there)",
    )
    apply.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    add_target_argument(apply, "plan and start or stop")
    add_all_lines_argument(apply)
    add_size_arguments(apply)
    add_sweep_arguments(apply)
    apply.set_defaults(func=run_apply)


def run_apply(args: argparse.Namespace) -> int:
    refuse_targets_in_sweeps(args)
    if args.multirun:
        return run_sweep_command(args, args.args, dry_run=False)
    out = console()
    workspace = workspace_from(args.workspace)
    plan, replan, config_yaml = _plan_to_apply(args, workspace, out)
    say = lambda line: out.print(f"tfplan | {line}", highlight=False)  # noqa: E731
    if replan is not None:
        if not _approve(plan, args, out):
            out.print("Apply cancelled.")
            return 1
        current = _still_current(plan, workspace, replan, say, lambda p: _approve(p, args, out))
        if current is None:
            out.print("Apply cancelled.")
            return 1
        plan = current
    with ExperimentRun(plan, workspace, say, config_yaml) as run:
        started = time.monotonic()
        with start_progress(out) as progress:
            result = run.apply(progress)
        counts = plan.counts()
        out.print(
            f"\nApply complete! Tasks: {len(result.started)} started, "
            f"{counts[Action.UPDATE]} changed, {len(result.stopped)} stopped "
            f"({time.monotonic() - started:.1f}s)."
        )
        if plan.targets:
            _applied_partially(plan, out)
        if not result.state.running:
            return 0
        if args.detach:
            run.detached = True
            log = run.store.folder / "supervisor.log"
            pid = start_background_supervisor(run.store, workspace.root, plan.experiment_id, log)
            out.print(
                f"Detached: a background supervisor (pid {pid}, log {log}) watches the tasks to "
                f"the end. Follow with: tfplan watch -e {plan.experiment_id}; stop with: "
                f"tfplan destroy -e {plan.experiment_id}"
            )
            return 0
        max_steps = plan.run_config.get("trainer", {}).get("max_steps")
        show_all = args.all_lines or shows_tf_noise(plan.source_config)
        outcome = _supervise(run, out, max_steps, show_all)
    _report(outcome, plan, run.result, run.result_at, out)
    return 0 if outcome.succeeded else 1


def _approve(plan: Plan, args: argparse.Namespace, out: Console) -> bool:
    """Show the plan and ask for approval (a plan without changes needs none)."""
    print_plan(plan, out, args.render)
    return not plan.has_changes or approved(
        out, "Do you want to perform these actions?", args.auto_approve
    )


def _plan_to_apply(
    args: argparse.Namespace, workspace: Workspace, out: Console
) -> tuple[Plan, Callable[[], Plan] | None, str | None]:
    """(the plan; when it was made just now, how to make it again against the state as it is
    then; the resolved config when composed here)."""
    overrides = [a for a in args.args if "=" in a or a.startswith(("+", "~"))]
    files = [a for a in args.args if a not in overrides]
    if files and overrides:
        raise TfplanError(
            "apply takes either a saved plan file or overrides, not both: "
            "run `tfplan plan OVERRIDES -out FILE` then `tfplan apply FILE`"
        )
    if len(files) > 1:
        raise TfplanError(f"apply takes one plan file, got {len(files)}: {' '.join(files)}")
    if args.targets and (files or (not overrides and workspace.default_plan_path.exists())):
        raise TfplanError(
            "-target makes a new plan, and a saved plan is applied exactly as it was made: "
            "give the overrides too (tfplan apply OVERRIDES -target NAME), or plan it first "
            "(tfplan plan OVERRIDES -target NAME, then tfplan apply)"
        )
    if files:
        return _saved_plan(workspace, Path(files[0])), None, None
    if not overrides and workspace.default_plan_path.exists():
        plan = _saved_plan(workspace, None)
        out.print(f"Applying the saved plan {workspace.default_plan_path}")
        return plan, None, None
    from omegaconf import OmegaConf

    from tfplan.config.compose import compose_config, to_config

    composed = compose_config(overrides, args.config_dir)
    cfg = to_config(composed)

    def replan() -> Plan:
        return make_plan(
            cfg, refreshed_state(workspace.store(cfg.experiment.id)), targets=args.targets
        )

    return replan(), replan, OmegaConf.to_yaml(composed)


def _still_current(
    plan: Plan,
    workspace: Workspace,
    replan: Callable[[], Plan],
    say: Callable[[str], None],
    approve: Callable[[Plan], bool],
) -> Plan | None:
    """The plan made just now, checked against the state once a background supervisor of the
    experiment has let go (the run takes over from it anyway; here first): while the plan
    waited for approval, the supervisor may have recorded tasks that ended or restarted. Then
    it is made again: the same changes go ahead as that plan; other changes are shown and asked
    for again (nothing moves the state any more: its supervisor has let go). None when they are
    not approved; the supervisor is then started again.
    """
    store = workspace.store(plan.experiment_id)
    before = store.load()
    supervised = before is not None and before.supervisor is not None and before.supervisor.detached
    take_over_from_background(store, say)
    try:
        check_plan_is_current(plan.state_lineage, plan.state_serial, store.load())
        return plan
    except StaleStateError:
        again = replan()
    if _changes(again) == _changes(plan):
        say(
            "the state moved on while the plan waited for approval (a task ended or "
            "restarted): planned again, the same changes"
        )
        return again
    say(
        "the state moved on while the plan waited for approval (a task ended or restarted) "
        "and the changes are not the ones approved any more: planned again, here they are"
    )
    if approve(again):
        return again
    now = store.load()
    if supervised and now is not None and now.running:
        log = store.folder / "supervisor.log"
        start_background_supervisor(store, workspace.root, plan.experiment_id, log)
    return None


def _changes(plan: Plan) -> list[tuple[str, str]]:
    return sorted((c.task, c.action.value) for c in plan.changes)


def _saved_plan(workspace: Workspace, path: Path | None) -> Plan:
    """A saved plan, applied exactly as it was made: refused before anything starts when the
    user's code it ships changed since (the state's own staleness is checked under the lock).

    Raises:
        PlanFileError: no such plan file, or not one of this format.
        StaleStateError: the user's code changed since the plan was saved.
    """
    plan = workspace.load_plan(path)
    check_user_code(plan)
    return plan


def _applied_partially(plan: Plan, out: Console) -> None:
    """Terraform's "Applied changes may be incomplete" after a targeted apply."""
    lines = targeting_warning(plan)
    lines[1] = ("bold yellow", "Warning: Applied changes may be incomplete")
    lines.append(
        ("", "Run `tfplan plan` (without -target) to see what else the configuration asks for.")
    )
    print_lines(lines, out)


def _supervise(run: ExperimentRun, out: Console, max_steps: int | None, show_all: bool) -> Outcome:
    printer = LogPrinter(out, show_all)
    with step_progress(out, max_steps) as on_step:
        try:
            return run.supervise(printer.emit, on_step)
        except KeyboardInterrupt:
            out.print("Interrupted: every task was stopped; the state records them as stopped.")
            raise


def _report(
    outcome: Outcome, plan: Plan, result: dict[str, Any] | None, result_at: str, out: Console
) -> None:
    max_steps = plan.run_config.get("trainer", {}).get("max_steps")
    step = outcome.last_step
    if outcome.succeeded and isinstance(max_steps, int) and step is not None and step > max_steps:
        # the bar stopped at max_steps (tfplan.cli.output.shown_step): the true step, once
        out.print(
            f"\n[bold green]Training complete[/]: {outcome.reason} at global step {step} "
            f"(trainer.max_steps={max_steps}: asynchronous workers finish the steps they began)."
        )
    elif outcome.succeeded:
        out.print(f"\n[bold green]Training complete[/]: {outcome.reason}.")
    else:
        out.print(f"\n[bold red]Training failed[/]: {outcome.reason}.")
    if isinstance(result, dict):
        shown = {
            k: v for k, v in result.items() if k not in ("status", "ps_recoveries", "snapshots")
        }
        out.print(f"Result ({result_at}): {', '.join(f'{k}={v}' for k, v in shown.items())}")
        recovered = recoveries_line(result.get("ps_recoveries"))
        if recovered is not None:
            out.print(recovered, highlight=False)
    if not outcome.succeeded:
        raise ApplyError(
            f"training failed: {outcome.reason}; `tfplan explain -e {plan.experiment_id}` says "
            f"why, `tfplan logs -e {plan.experiment_id}` shows the logs"
        )
