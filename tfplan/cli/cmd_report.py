"""`tfplan report [DIR|SWEEP]`: re-render a sweep's table from its folder; CSV, JSON and plot."""

from __future__ import annotations

import argparse
from pathlib import Path

from tfplan.cli.common import console, workspace_from

__all__ = ["add_parsers", "run_report"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = subparsers.add_parser(
        "report",
        help="a sweep's results: table, results.csv, results.json, accuracy.png",
        description="Reads the sweep folder as it is now (each point's result.json and "
        "eval/metrics.jsonl), prints one row per point and rewrites the CSV, JSON and plot.",
    )
    report.add_argument(
        "target",
        nargs="?",
        metavar="DIR|SWEEP",
        help="a sweep folder or sweep id (default: the latest sweep applied here)",
    )
    report.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    report.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    from tfplan.engine.experiment import find_output
    from tfplan.errors import TfplanError
    from tfplan.sweeps.results import load_rows, render_table, write_report

    out = console()
    if args.target and Path(args.target).is_dir():
        folder = Path(args.target).absolute()
    else:
        kind, folder = find_output(workspace_from(args.workspace), args.target)
        if kind != "sweep":
            raise TfplanError(
                f"{args.target or 'the latest run'} is an experiment, not a sweep: "
                "give a sweep id or folder (tfplan tensorboard shows an experiment)"
            )
    header, rows = load_rows(folder)
    render_table(rows, out, f"sweep {header.get('sweep_id')} · {len(rows)} points")
    written = write_report(folder, header, rows)
    out.print(f"Wrote {', '.join(str(p) for p in written)}.")
    if not any(p.suffix == ".png" for p in written):
        out.print("No plot: matplotlib is not installed (pip install matplotlib).")
    return 0
