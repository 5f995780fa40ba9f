"""Helpers for the Kubernetes backend's tests: plans for cluster=k8s, Kubernetes' own ``$(VAR)``
expansion (an independent copy: the exported templates are checked against it), the
client-model round trip, and the CRD schemas of JobSet and TFJob."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from tfplan.cli.common import compose
from tfplan.engine.plans import make_plan
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan

CRDS = Path(__file__).resolve().parent / "data" / "crds"
CONTEXT = PlanContext(
    cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0"
)
MODELS = {"ConfigMap": "V1ConfigMap", "Service": "V1Service", "Job": "V1Job", "Pod": "V1Pod"}


def k8s_plan(*overrides: str) -> Plan:
    return make_plan(compose(["cluster=k8s", *overrides], None), None, CONTEXT)


def downpour_plan(*overrides: str) -> Plan:
    """The docs' example: downpour, 1 ps and 3 workers (worker 0 the chief)."""
    return k8s_plan("algo=downpour", "cluster.workers=3", "experiment.id=downpour", *overrides)


def kube_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command, args and env values (third_party/forked/golang/
    expansion): ``$$`` -> ``$``, ``$(NAME)`` -> its value when defined, anything else as is."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end >= 0:
                    name = text[i + 2 : end]
                    out.append(env[name] if name in env else f"$({name})")
                    i = end + 1
                    continue
                out.append("$(")
                i += 2
                continue
            out.append(text[i : i + 2])
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(container: dict[str, Any], downward: dict[str, str]) -> dict[str, str]:
    """A container's environment as its process sees it: in order, each value expanded with the
    ones before it; ``valueFrom.fieldRef`` read from ``downward`` (fieldPath -> value)."""
    env: dict[str, str] = {}
    for item in container.get("env", []):
        if "valueFrom" in item:
            env[item["name"]] = downward[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = kube_expand(item["value"], env)
    return env


def container_command(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    return [kube_expand(word, env) for word in container["command"]]


def round_trip(obj: dict[str, Any], model: str) -> dict[str, Any]:
    """``obj`` deserialised into the official client's model and serialised back."""
    from kubernetes import client

    instance = getattr(client, model).from_dict(obj)
    assert instance is not None
    out: dict[str, Any] = client.ApiClient().sanitize_for_serialization(instance)
    return out


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused, as ``kubectl apply --validate=strict`` does
    (the API server's structural schemas prune them silently otherwise)."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@functools.cache
def crd_schema(file: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / file).read_text())
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            return copy.deepcopy(_strict(entry["schema"]["openAPIV3Schema"]))  # type: ignore[no-any-return]
    raise AssertionError(f"{file} has no version {version}")


def validate_crd(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError unless ``obj`` fits its CRD's OpenAPI schema."""
    import jsonschema

    group, version = obj["apiVersion"].split("/")
    file = {"JobSet": "jobset.x-k8s.io_jobsets.yaml", "TFJob": "kubeflow.org_tfjobs.yaml"}[
        obj["kind"]
    ]
    jsonschema.Draft7Validator(crd_schema(file, version)).validate(obj)
