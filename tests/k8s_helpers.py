"""Helpers for the Kubernetes backend's tests: plans for cluster=k8s, Kubernetes' own ``$(VAR)``
expansion (an independent copy: the exported templates are checked against it), the
client-model round trip, and the JobSet and TFJob projects' own API models."""

from __future__ import annotations

from typing import Any

from tfplan.cli.common import compose
from tfplan.engine.plans import make_plan
from tfplan.planning.context import PlanContext
from tfplan.planning.plan import Plan

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


def _check_tfjob_part(value: Any, type_name: str, path: str) -> None:
    """Walk ``value`` against training-operator's TFJob model types (``openapi_types``): an
    unknown field or a wrong type raises; Kubernetes' own types (V1...) round-trip through the
    official client's models."""
    from kubeflow.training import models

    for prefix in ("dict(str, ", "Dict[str, "):  # the generator writes both
        if type_name.startswith(prefix):
            assert isinstance(value, dict), f"{path}: not a map"
            for key, item in value.items():
                _check_tfjob_part(item, type_name[len(prefix) : -1], f"{path}.{key}")
            return
    if type_name.startswith(("list[", "List[")):
        assert isinstance(value, list), f"{path}: not a list"
        for i, item in enumerate(value):
            _check_tfjob_part(item, type_name[5:-1], f"{path}[{i}]")
        return
    simple = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if type_name in simple:
        assert isinstance(value, simple[type_name]) and not (
            type_name == "int" and isinstance(value, bool)
        ), f"{path}: {value!r} is not {type_name}"
        return
    if type_name.startswith("V1"):
        assert round_trip(value, type_name) == value, f"{path}: not a valid {type_name}"
        return
    cls = getattr(models, type_name)
    assert isinstance(value, dict), f"{path}: not an object"
    fields = {json_key: cls.openapi_types[attr] for attr, json_key in cls.attribute_map.items()}
    for key, item in value.items():
        assert key in fields, f"{path}.{key}: no such field in {type_name}"
        _check_tfjob_part(item, fields[key], f"{path}.{key}")


def validate_crd(obj: dict[str, Any]) -> None:
    """Raise AssertionError unless ``obj`` is a valid JobSet or TFJob of its project.

    The check is a strict round trip through the project's own published API models, generated
    from its OpenAPI schema and installed from PyPI: ``kubeflow-trainer-api`` for JobSet
    v1alpha2 (kubernetes-sigs/jobset's types, as Kubeflow Trainer ships them) and
    ``kubeflow-training`` for TFJob kubeflow.org/v1 (training-operator v1's SDK; its model types
    are walked field by field, its pod templates round-trip through the official client). A
    wrong type fails; an unknown field is dropped or named, so the object does not pass.
    """
    if obj["kind"] == "JobSet":
        from kubeflow_trainer_api.models.jobset_v1alpha2_job_set import JobsetV1alpha2JobSet

        assert obj["apiVersion"] == "jobset.x-k8s.io/v1alpha2", obj["apiVersion"]
        back = JobsetV1alpha2JobSet.from_dict(obj).to_dict()  # raises on a wrong type
    else:
        assert obj["kind"] == "TFJob" and obj["apiVersion"] == "kubeflow.org/v1", obj["kind"]
        _check_tfjob_part(obj, "KubeflowOrgV1TFJob", "TFJob")
        back = obj
    assert back == obj, f"{obj['kind']} does not survive its project's API models unchanged"
