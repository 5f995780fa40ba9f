"""`tfplan plan [OVERRIDES...]` and `tfplan show [FILE]`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tfplan.cli.common import compose, console, workspace_from
from tfplan.cli.render import print_plan
from tfplan.cli.sweep import add_sweep_arguments, run_sweep_command
from tfplan.engine.plans import make_plan
from tfplan.engine.refresh import refreshed_state

__all__ = ["add_parsers", "run_plan", "run_show"]


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
    plan.add_argument("--cfg", choices=["job"], help="print the composed config and exit")
    plan.add_argument("--config-dir", help="the conf/ folder to use (default: ./conf or tfplan's)")
    plan.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    plan.add_argument("--no-save", action="store_true", help="do not write a plan file")
    add_sweep_arguments(plan)
    plan.set_defaults(func=run_plan)

    show = subparsers.add_parser("show", help="show a saved plan")
    show.add_argument("file", nargs="?", help="plan file (default: .tfplan/plan.json)")
    show.add_argument("--json", action="store_true", help="print the plan as JSON")
    show.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    show.set_defaults(func=run_show)


def run_plan(args: argparse.Namespace) -> int:
    if args.multirun:  # a dry run of the whole sweep: one line per point, nothing saved
        return run_sweep_command(args, args.overrides, dry_run=True)
    if args.cfg:
        from omegaconf import OmegaConf  # Hydra/OmegaConf load only for the verbs that compose

        from tfplan.config.compose import compose_config

        print(OmegaConf.to_yaml(compose_config(args.overrides, args.config_dir)), end="")
        return 0
    cfg = compose(args.overrides, args.config_dir)
    workspace = workspace_from(args.workspace)
    state = refreshed_state(workspace.store(cfg.experiment.id))
    plan = make_plan(cfg, state)
    if args.json:
        print(plan.to_json())
    else:
        print_plan(plan, console())
    if not args.no_save:
        path = workspace.save_plan(plan, Path(args.out) if args.out else None)
        if not args.json:
            console().print(
                f"\nSaved the plan to {path}. To perform exactly these actions, run: "
                f"tfplan apply{'' if not args.out else ' ' + str(args.out)}"
            )
    if args.detailed_exitcode:
        return 2 if plan.has_changes else 0
    return 0


def run_show(args: argparse.Namespace) -> int:
    workspace = workspace_from(args.workspace)
    plan = workspace.load_plan(Path(args.file) if args.file else None)
    if args.json:
        print(json.dumps(plan.to_dict(), indent=2, sort_keys=True))
    else:
        print_plan(plan, console())
    return 0
