"""`tfplan export kubernetes [PLANFILE] [--format jobs|jobset|tfjob] [--out DIR]`: the saved
plan as Kubernetes manifests, for kubectl, JobSet or Kubeflow's TFJob.

`tfplan export model [-e ID] [--step N] [--out PATH]`: an experiment's trained Keras model as a
``.keras`` file, from its latest checkpoint or the one of step N (tfplan/engine/model_export.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tfplan.cli.common import add_experiment_option, console, workspace_from
from tfplan.errors import TfplanError
from tfplan.files import write_atomic

__all__ = ["add_parsers", "run_export"]


def add_parsers(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tfplan.backends.kubernetes.export import FORMATS

    export = subparsers.add_parser(
        "export",
        help="write the saved plan as manifests (kubernetes), or a trained model (model)",
        description="kubernetes: write the plan saved by `tfplan plan cluster=k8s` as Kubernetes "
        "objects: YAML on stdout (kubectl apply -f -), or one file per object in --out DIR. "
        "model: write an experiment's trained Keras model (model._target_) as a .keras file "
        "from its latest checkpoint, or the one of --step N (default --out: "
        "<output_dir>/model-<step>.keras).",
    )
    export.add_argument("target", choices=["kubernetes", "model"], help="what to export")
    export.add_argument(
        "file", nargs="?", help="kubernetes: plan file (default: .tfplan/plan.json)"
    )
    export.add_argument(
        "--format",
        choices=FORMATS,
        default="jobs",
        help="kubernetes: jobs: a headless Service and one Job per task (default); jobset: one "
        "JobSet; tfjob: one Kubeflow TFJob",
    )
    export.add_argument(
        "--out",
        help="kubernetes: write NN-kind-name.yaml files into this folder; model: the .keras file",
    )
    add_experiment_option(export, "model: the experiment (default: the only one)", word=True)
    export.add_argument(
        "--step", type=int, help="model: the checkpoint of this global step (default: the latest)"
    )
    export.add_argument(
        "--join-bytes",
        type=int,
        help="model: the most bytes of weights joined into one .keras file (default: the run's "
        "trainer.export_join_bytes, else a quarter of the available memory); a larger model is written "
        "as its parts in <name>.parts/ beside --out, with a model.json and an assemble.py",
    )
    export.add_argument("--workspace", help="workspace folder (default: .tfplan)")
    export.set_defaults(func=run_export)


def run_export(args: argparse.Namespace) -> int:
    if args.target == "model":
        return _export_model(args)
    if args.experiment or args.step is not None or args.join_bytes is not None:
        raise TfplanError(
            "-e, --step and --join-bytes are for `tfplan export model`, not kubernetes"
        )
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


def _export_model(args: argparse.Namespace) -> int:
    from tfplan.engine.model_export import plan_export, run_export

    if args.file:
        raise TfplanError(
            f"`tfplan export model` takes no plan file ({args.file}): name the experiment with -e ID"
        )
    job = plan_export(
        workspace_from(args.workspace), args.experiment, args.step, args.out, args.join_bytes
    )
    written = run_export(job)
    if written.is_dir():
        console().print(
            f"Exported step {job.step} of experiment {job.experiment} as parts to {written} "
            f"(too large to join in one process): python {written}/assemble.py OUT.keras joins "
            "them where memory allows; its model.json says how they fit"
        )
        return 0
    console().print(
        f"Exported step {job.step} of experiment {job.experiment} to {written} "
        "(keras.saving.load_model opens it)"
    )
    return 0
