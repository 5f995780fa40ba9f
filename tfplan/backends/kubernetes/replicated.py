"""Pure: the plan as one JobSet or one TFJob, where all tasks of a role share one pod template.

A shared template can differ per task only through Kubernetes' ``$(VAR)`` expansion, so each
pod reads its index into ``TFPLAN_INDEX`` (downward API: the JobSet's job-index annotation, or
TFJob's replica-index label), and every per-task value is written with ``$(TFPLAN_INDEX)`` where
the index goes. Each template is checked: expanded for index ``i`` it must give exactly task
``i``'s command and environment, else the export is refused (use ``--format jobs``).

Names and TF_CONFIG follow each controller's own rules:

- JobSet (jobset.x-k8s.io/v1alpha2): replicated job ``<role>`` of N one-pod Indexed Jobs; the
  pods are ``<name>-<role>-<i>-0`` under the JobSet's headless service ``<name>``; tfplan writes
  TF_CONFIG with those names.
- TFJob (kubeflow.org/v1, training-operator v1): the operator writes TF_CONFIG itself with one
  Service per replica, ``<name>-<role>-<i>.<namespace>.svc:<port>`` (every replica type listed,
  the evaluator included), and tfplan fills the command's placeholders with the same names.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tfplan.backends.kubernetes.manifests import (
    Retry,
    config_map,
    container,
    escape,
    job_spec,
    pod_spec,
    retry_of,
    ships_code,
    work_items,
)
from tfplan.backends.kubernetes.options import KubeOptions
from tfplan.errors import PlanError
from tfplan.planning.commands import PLACEHOLDERS, TaskFacts, fill_command
from tfplan.planning.plan import ROLE_ORDER, Plan, Task
from tfplan.planning.policy import RestartPolicy
from tfplan.planning.tf_config import ClusterSpecText

__all__ = [
    "INDEX_REF",
    "INDEX_VAR",
    "JOBSET_INDEX_FIELD",
    "TFJOB_INDEX_FIELD",
    "TFJOB_TYPES",
    "cluster_spec",
    "expand",
    "expected_task",
    "jobset_manifests",
    "tfjob_manifests",
]

INDEX_VAR = "TFPLAN_INDEX"
INDEX_REF = f"$({INDEX_VAR})"
JOBSET_INDEX_FIELD = "metadata.annotations['jobset.sigs.k8s.io/job-index']"
TFJOB_INDEX_FIELD = "metadata.labels['training.kubeflow.org/replica-index']"
TFJOB_TYPES = {"ps": "PS", "chief": "Chief", "worker": "Worker", "evaluator": "Evaluator"}


def address(opts: KubeOptions, fmt: str, role: str, index: int | str) -> str:
    """Where task ``role``/``index`` is reached under each format's controller."""
    if fmt == "jobset":
        return opts.dns(f"{opts.name}-{role}-{index}-0.{opts.service}")
    if fmt == "tfjob":
        return opts.dns(f"{opts.name}-{role}-{index}")
    return opts.address(role, index)


def cluster_spec(plan: Plan, opts: KubeOptions, fmt: str) -> dict[str, list[str]]:
    """job -> endpoints as the tasks see them under ``fmt`` (TFJob: as its operator writes them,
    the evaluator included)."""
    spec: dict[str, list[str]] = {}
    for role in ROLE_ORDER:
        tasks = _tasks(plan, role)
        if tasks and (role != "evaluator" or fmt == "tfjob"):
            spec[role] = [f"{address(opts, fmt, role, t.index)}:{opts.port}" for t in tasks]
    return spec


def _tasks(plan: Plan, role: str) -> list[Task]:
    return sorted((t for t in plan.tasks if t.role.value == role), key=lambda t: t.index)


def expected_task(
    plan: Plan, opts: KubeOptions, fmt: str, task: Task
) -> tuple[list[str], dict[str, str]]:
    """(command, environment) task ``task`` must get under ``fmt``: the plan's, with the
    format's names (TFJob: without TF_CONFIG, which its operator adds)."""
    cluster = cluster_spec(plan, opts, fmt)
    if plan.command_template:
        facts = TaskFacts(
            task.role.value,
            task.index,
            _training(cluster),
            task.port,
            task.is_chief,
            plan.output_dir,
        )
        command = list(fill_command(plan.command_template, facts))
    else:
        command = list(task.command)
    env = dict(task.env)
    if fmt != "tfjob":
        env["TF_CONFIG"] = ClusterSpecText(cluster).tf_config(task.role.value, task.index)
    return command, env


def _training(cluster: dict[str, list[str]]) -> dict[str, list[str]]:
    return {job: hosts for job, hosts in cluster.items() if job != "evaluator"}


def expand(text: str, values: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (``$$`` is a literal ``$``; unknown names stay)."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] != "$" or i + 1 == len(text):
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(" and ")" in text[i + 2 :]:
            end = text.index(")", i + 2)
            name = text[i + 2 : end]
            out.append(values.get(name, f"$({name})"))
            i = end + 1
        else:
            out.append(text[i : i + 2])
            i += 2
    return "".join(out)


def _generalise(values: list[str], role: str) -> str:
    escaped = [escape(v) for v in values]
    if len(set(escaped)) == 1:
        return escaped[0]
    first = escaped[0]
    return first.replace(f"{role}-0", f"{role}-{INDEX_REF}").replace(
        f"{role}/0", f"{role}/{INDEX_REF}"
    )


def _command_template(
    plan: Plan, opts: KubeOptions, fmt: str, role: str, tasks: list[Task]
) -> list[str]:
    if not plan.command_template:
        words = list(zip(*(t.command for t in tasks), strict=True))
        return [_generalise(list(w), role) for w in words]
    cluster = _training(cluster_spec(plan, opts, fmt))
    first = tasks[0]
    facts = TaskFacts(role, 0, cluster, first.port, first.is_chief, plan.output_dir)
    values = {name: escape(facts.value(name)) for name in PLACEHOLDERS}
    values["task_index"] = INDEX_REF
    if first.port is not None:
        values["task_address"] = f"{address(opts, fmt, role, INDEX_REF)}:{first.port}"
    return [escape(word).format_map(values) for word in plan.command_template]


def _role_container(
    plan: Plan, opts: KubeOptions, fmt: str, role: str, tasks: list[Task]
) -> dict[str, Any]:
    expected = [expected_task(plan, opts, fmt, t) for t in tasks]
    command = _command_template(plan, opts, fmt, role, tasks)
    env: list[dict[str, Any]] = [
        {
            "name": INDEX_VAR,
            "valueFrom": {
                "fieldRef": {
                    "fieldPath": JOBSET_INDEX_FIELD if fmt == "jobset" else TFJOB_INDEX_FIELD
                }
            },
        }
    ]
    for key in sorted(expected[0][1]):
        if key == "TF_CONFIG":
            cluster = ClusterSpecText(cluster_spec(plan, opts, fmt)).cluster_json
            value = (
                f'{{"cluster":{escape(cluster)},"task":{{"index":{INDEX_REF},"type":"{role}"}}}}'
            )
        else:
            value = _generalise([e[1].get(key, "") for e in expected], role)
        env.append({"name": key, "value": value})
    _check(fmt, role, tasks, command, env, expected)
    return container(opts, role, command, env, opts.workdir)


def _check(
    fmt: str,
    role: str,
    tasks: list[Task],
    command: list[str],
    env: list[dict[str, Any]],
    expected: list[tuple[list[str], dict[str, str]]],
) -> None:
    """Every task of the role gets exactly its own command and environment from the template."""
    for task, (want_command, want_env) in zip(tasks, expected, strict=True):
        values = {INDEX_VAR: str(task.index)}
        got_command = [expand(w, values) for w in command]
        got_env = {e["name"]: expand(e["value"], values) for e in env if "value" in e}
        if got_command != want_command or got_env != want_env:
            what = "command" if got_command != want_command else "environment"
            raise PlanError(
                f"--format {fmt}: the {role} tasks differ in their {what} by more than their "
                f"index (e.g. {{is_chief}} with cluster.chief=worker0), which one pod template "
                "per role cannot express: use --format jobs, or cluster.chief=separate"
            )


def _role_items(
    plan: Plan, opts: KubeOptions, tasks: list[Task], code: Mapping[str, str]
) -> list[dict[str, str]]:
    return work_items(opts, [t.workdir for t in tasks], sorted(code), plan.code_dir)


def jobset_manifests(
    plan: Plan, opts: KubeOptions, code: Mapping[str, str]
) -> list[dict[str, Any]]:
    """``--format jobset``: the ConfigMap and one JobSet (its controller makes the headless
    Service ``<name>``). Each task is a one-pod Job retried by the plan's policy; the JobSet
    succeeds when the chief (or, with worker 0 as chief, every worker) has, and fails when any
    Job fails for good (``maxRestarts: 0``); its remaining Jobs are then deleted."""
    shipped = code if ships_code(plan, opts) else {}
    replicated = []
    for role in ROLE_ORDER:
        tasks = _tasks(plan, role)
        if not tasks:
            continue
        labels = opts.labels_for(role)
        pod = {
            "metadata": {"labels": labels},
            "spec": pod_spec(
                opts,
                _role_container(plan, opts, "jobset", role, tasks),
                _role_items(plan, opts, tasks, shipped),
            ),
        }
        replicated.append(
            {
                "name": role,
                "replicas": len(tasks),
                "template": {
                    "metadata": {"labels": labels},
                    "spec": job_spec(_no_ttl(retry_of(plan, role, opts)), pod, indexed=True),
                },
            }
        )
    target = "chief" if any(t.role.value == "chief" for t in plan.tasks) else "worker"
    spec: dict[str, Any] = {
        "network": {
            "enableDNSHostnames": True,
            "publishNotReadyAddresses": True,
            "subdomain": opts.service,
        },
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [target]},
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": replicated,
    }
    if opts.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = opts.ttl_seconds_after_finished
    jobset = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _meta(opts),
        "spec": spec,
    }
    return [config_map(opts, plan.run_config, shipped), jobset]


def _no_ttl(retry: Retry) -> Retry:
    return Retry(retry.backoff_limit, retry.exit_codes, retry.deadline_secs, None)


def _meta(opts: KubeOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": opts.name,
        "namespace": opts.namespace,
        "labels": opts.labels_for(),
    }
    if opts.annotations:
        meta["annotations"] = dict(opts.annotations)
    return meta


def tfjob_manifests(plan: Plan, opts: KubeOptions, code: Mapping[str, str]) -> list[dict[str, Any]]:
    """``--format tfjob``: the ConfigMap and one TFJob. Restart policies are TFJob's own (the
    same four names); its backoffLimit counts restarts over the whole job, so it is the plan's
    per-task limit times the tasks; ``cleanPodPolicy: Running`` stops the parameter servers and
    the evaluator once the chief (or worker 0) has succeeded."""
    shipped = code if ships_code(plan, opts) else {}
    replicas: dict[str, Any] = {}
    for role in ROLE_ORDER:
        tasks = _tasks(plan, role)
        if not tasks:
            continue
        the_container = _role_container(plan, opts, "tfjob", role, tasks)
        replicas[TFJOB_TYPES[role]] = {
            "replicas": len(tasks),
            "restartPolicy": plan.policy.for_role(role).restart.value,
            "template": {
                "metadata": {"labels": opts.labels_for(role)},
                "spec": pod_spec(
                    opts,
                    the_container,
                    _role_items(plan, opts, tasks, shipped),
                    restart_policy=None,
                ),
            },
        }
    limits = [
        plan.policy.for_role(t.role.value).backoff_limit
        for t in plan.tasks
        if plan.policy.for_role(t.role.value).restart is not RestartPolicy.NEVER
    ]
    run_policy: dict[str, Any] = {"cleanPodPolicy": "Running", "backoffLimit": sum(limits)}
    if plan.policy.deadline_secs is not None:
        run_policy["activeDeadlineSeconds"] = math.ceil(plan.policy.deadline_secs)
    if opts.ttl_seconds_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = opts.ttl_seconds_after_finished
    tfjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _meta(opts),
        "spec": {"runPolicy": run_policy, "tfReplicaSpecs": replicas},
    }
    return [config_map(opts, plan.run_config, shipped), tfjob]
