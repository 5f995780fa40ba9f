"""`tfplan export kubernetes`: a saved plan as manifests, in one of three formats.

The manifests are built by the pure modules (:mod:`.manifests`, :mod:`.replicated`); this module
adds the one thing they cannot know, the recipes package's files, and writes YAML.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from tfplan.backends.kubernetes.manifests import jobs_manifests, ships_code
from tfplan.backends.kubernetes.options import KubeOptions
from tfplan.backends.kubernetes.replicated import jobset_manifests, tfjob_manifests
from tfplan.backends.staging import package_files
from tfplan.errors import PlanFileError, TfplanError
from tfplan.planning.plan import Plan

__all__ = [
    "FORMATS",
    "RECIPES_DIR",
    "code_files",
    "export_manifests",
    "file_name",
    "recipe_files",
    "to_yaml",
]

FORMATS = ("jobs", "jobset", "tfjob")
RECIPES_DIR = Path(__file__).resolve().parents[3] / "recipes"


def recipe_files(root: Path = RECIPES_DIR) -> dict[str, str]:
    """The recipes package as ``recipes/<path>`` -> text (sources only)."""
    if not root.is_dir():
        raise TfplanError(f"the recipes package is not at {root}: reinstall tfplan")
    return {
        f"recipes/{p.relative_to(root).as_posix()}": p.read_text()
        for p in sorted(root.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def code_files(plan: Plan, opts: KubeOptions) -> dict[str, str]:
    """What the ConfigMap carries beside run.yaml: the recipes package and the user's packages
    (``<name>/<path>`` -> text), when ``options.code=configmap``; nothing otherwise (the image
    has the code).

    Raises:
        TfplanError: a file of the user's package is not text (a ConfigMap holds text).
    """
    if not ships_code(plan, opts):
        return {}
    files = recipe_files()
    for code in plan.user_code:
        source = Path(code.source)
        base = source.parent
        for path in package_files(source):
            key = path.relative_to(base).as_posix()
            try:
                files[key] = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise TfplanError(
                    f"{key} (of {code.name}, {', '.join(code.keys)}) is not text, and a "
                    "ConfigMap carries text only: build an image holding your package "
                    "(cluster.options.code=image) or mount it in a volume"
                ) from None
    return files


def export_manifests(plan: Plan, fmt: str = "jobs") -> list[dict[str, Any]]:
    """The objects of ``plan`` in format ``fmt`` (jobs | jobset | tfjob).

    Raises:
        PlanFileError: the plan is not for the kubernetes backend.
        PlanError: ``fmt`` cannot express the plan (tasks of a role differing beyond their index).
    """
    if plan.backend.name != "kubernetes":
        raise PlanFileError(
            f"the plan runs on the {plan.backend.name} backend, not kubernetes: plan it with "
            "cluster=k8s (tfplan plan cluster=k8s ...) to export Kubernetes manifests"
        )
    if fmt not in FORMATS:
        raise TfplanError(f"unknown format {fmt!r}: use one of {', '.join(FORMATS)}")
    opts = KubeOptions.from_ref(plan.backend)
    code = code_files(plan, opts)
    build = {"jobs": jobs_manifests, "jobset": jobset_manifests, "tfjob": tfjob_manifests}[fmt]
    return build(plan, opts, code)


class _Dumper(yaml.SafeDumper):
    """Block style, except short lists of numbers (an exit-code list) on one line; multi-line
    strings (the code in a ConfigMap) as literal blocks; no anchors for shared label maps."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _list(dumper: yaml.SafeDumper, data: list[Any]) -> yaml.Node:
    flow = bool(data) and all(isinstance(v, int) and not isinstance(v, bool) for v in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.Node:
    style = (
        "|" if "\n" in data and all(line == line.rstrip() for line in data.split("\n")) else None
    )
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(list, _list)
_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    """Objects as one multi-document YAML stream (``kubectl apply -f -``)."""
    return yaml.dump_all(
        list(objects), Dumper=_Dumper, sort_keys=False, width=100, explicit_start=True
    )


def file_name(position: int, obj: dict[str, Any]) -> str:
    """``NN-kind-name.yaml``: ``kubectl apply -f DIR`` reads files in name order."""
    return f"{position:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"
