"""`tfplan apply -m OVERRIDES` (run a sweep) and `tfplan plan -m OVERRIDES` (its dry run)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.cli.common import approved, console, workspace_from
from tfplan.errors import TfplanError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_sweep_arguments", "run_sweep_command", "print_preview"]


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    """-m and its options, shared by plan and apply."""
    parser.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="sweep: each point of a=1,2 b=x,y (Hydra grammar) is a whole cluster",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="with -m: run up to N clusters at once, each on its own ports",
    )
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="with -m: stream every task's log, prefixed by its point",
    )


def run_sweep_command(args: argparse.Namespace, overrides: list[str], dry_run: bool) -> int:
    from tfplan.sweeps.sweep import SweepOutput, preview_sweep, run_sweep, sweep_spec

    out = console()
    bad = [a for a in overrides if "=" not in a and not a.startswith(("+", "~"))]
    if bad:
        raise TfplanError(
            f"-m takes Hydra overrides, not {' '.join(bad)}: e.g. tfplan apply -m algo.lr=0.01,0.1"
        )
    spec = sweep_spec(list(overrides), args.config_dir, args.concurrency)
    workspace = workspace_from(args.workspace)
    planned = preview_sweep(spec, workspace, for_run=not dry_run)
    print_preview(spec.sweep_id, spec.sweep_dir, spec.sweeper, spec.concurrency, planned, out)
    if dry_run:
        return 1 if any(p.status == "failed" for p in planned) else 0
    if not approved(out, "Do you want to run this sweep?", args.auto_approve):
        out.print("Apply cancelled.")
        return 1
    output = SweepOutput(
        lambda line: out.print(line, highlight=False, markup=False),
        verbose=args.verbose,
        show_all=getattr(args, "all_lines", False),
    )
    try:
        points = run_sweep(spec, workspace, output)
    except KeyboardInterrupt:
        out.print(
            f"Interrupted: every running point was stopped. Resume with experiment.id="
            f"{spec.sweep_id}; see `tfplan report {spec.sweep_dir}`."
        )
        raise
    return _finish(spec.sweep_dir, len(points), out)


def _finish(sweep_dir: str, count: int, out: Console) -> int:
    from tfplan.sweeps.results import load_rows, render_table, write_report

    header, rows = load_rows(Path(sweep_dir))
    out.print()
    render_table(rows, out, f"sweep {header.get('sweep_id')} · {count} points")
    written = write_report(Path(sweep_dir), header, rows)
    failed = [r for r in rows if r.status not in ("succeeded", "pruned")]
    pruned = [r for r in rows if r.status == "pruned"]
    counts = f"{len(rows) - len(failed) - len(pruned)} succeeded, " + (
        f"{len(pruned)} pruned, " if pruned else ""
    )
    out.print(
        f"\nSweep complete! {counts}{len(failed)} failed. "
        f"Wrote {', '.join(str(p) for p in written)}."
    )
    out.print(f"TensorBoard: tfplan tensorboard {header.get('sweep_id')}")
    return 1 if failed else 0


def print_preview(
    sweep_id: str, sweep_dir: str, sweeper: str, concurrency: int, points: list[Any], out: Console
) -> None:
    """One line per point, then the totals."""
    note = (
        ""
        if sweeper == "basic"
        else (f" ({sweeper} chooses points from the results as they come: these are samples)")
    )
    out.print(f"Sweep {sweep_id}: {len(points)} point(s) in {sweep_dir}{note}", highlight=False)
    width = max((len(p.label) for p in points), default=0)
    for p in points:
        if p.status == "failed":
            out.print(
                f"  #{p.num:<3} {p.label:<{width}}  error: {p.reason}",
                highlight=False,
                markup=False,
            )
            continue
        ports = f"ports {p.ports[0]}-{p.ports[1]}" if p.ports else "no ports"
        out.print(
            f"  #{p.num:<3} {p.label:<{width}}  {p.tasks} tasks  {ports}  "
            f"experiment {p.experiment_id}",
            highlight=False,
            markup=False,
        )
    ok = [p for p in points if p.status != "failed"]
    total = sum(p.tasks or 0 for p in ok)
    busiest = sum(sorted((p.tasks or 0 for p in ok), reverse=True)[:concurrency])
    failed = len(points) - len(ok)
    out.print(
        f"\nSweep: {len(points)} points, {total} tasks in all; concurrency {concurrency}: "
        f"at most {busiest} tasks at once."
        + (f" {failed} point(s) cannot be planned." if failed else ""),
        highlight=False,
    )
