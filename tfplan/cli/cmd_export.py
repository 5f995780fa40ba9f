"""`tfplan export kubernetes [PLANFILE] [--format jobs|jobset|tfjob] [--out DIR]`: the saved
plan as Kubernetes manifests, for kubectl, JobSet or Kubeflow's TFJob."""

from __future__ import annotations

import argparse
from pathlib import Path

from tfplan.cli.common import console, workspace_from
from tfplan.files import write_atomic

__all__ = ["add_parsers", "run_export"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfplan.backends.kubernetes.export import FORMATS

    export = subparsers.add_parser(
        "export",
        help="write the saved plan as manifests (kubernetes)",
        description="Write the plan saved by `tfplan plan cluster=k8s` as Kubernetes objects: "
        "YAML on stdout (kubectl apply -f -), or one file per object in --out DIR.",
    )
    export.add_argument("target", choices=["kubernetes"], help="what to export to")
    export.add_argument("file", nargs="?", help="plan file (default: .tfplan/plan.json)")
    export.add_argument(
        "--format",
        choices=FORMATS,
        default="jobs",
        help="jobs: a headless Service and one Job per task (default); jobset: one JobSet; "
        "tfjob: one Kubeflow TFJob",
    )
    export.add_argument("--out", help="write NN-kind-name.yaml files into this folder")
    export.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    from tfplan.backends.kubernetes.export import export_manifests, file_name, to_yaml

    plan = workspace_from(args.workspace).load_plan(Path(args.file) if args.file else None)
    objects = export_manifests(plan, args.format)
    if not args.out:
        print(to_yaml(objects), end="")
        return 0
    folder = Path(args.out)
    for position, obj in enumerate(objects):
        write_atomic(folder / file_name(position, obj), to_yaml([obj]))
    console().print(
        f"Wrote {len(objects)} object(s) to {folder}; create them with: kubectl apply -f {folder}"
    )
    return 0
