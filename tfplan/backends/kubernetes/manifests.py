"""Pure: Kubernetes objects for a plan's tasks, as the plain dicts the API takes.

The pieces every format shares, and the ``jobs`` format (what ``tfplan apply`` creates)::

    ConfigMap/<name>-config    run.yaml, and the recipes package (code=configmap, built-in recipes)
    Service/<name>             headless (clusterIP None), selects every pod of the experiment,
                               publishes not-ready pods so tasks resolve each other while starting
    Job/<name>-<role>-<index>  one pod: hostname <name>-<role>-<index>, subdomain <name>, so its
                               DNS name is the address in every task's TF_CONFIG

Inside each pod: the ConfigMap is mounted read-only at ``cluster.workdir`` with each task's
``<role>-<index>/run.yaml`` (and ``_code/recipes/...``) where the plan's command reads them
(under apply also ``<role>-<index>/live.json``: what the running job is told, which the kubelet
refreshes in the pod when the ConfigMap changes), and
``cluster.options.output_volume`` (a PVC) at ``cluster.output_dir`` (an emptyDir without one).

Restarts: under ``tfplan apply`` tfplan supervises, so a Job never retries (``backoffLimit: 0``);
in exported manifests the plan's restart policy is mapped to Kubernetes' own (:class:`Retry`).

Values are literal for Kubernetes: every ``$`` in a command, an argument or an env value is
written ``$$`` so that Kubernetes' ``$(VAR)`` expansion gives back exactly the plan's text.
"""

from __future__ import annotations

import math
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from tfplan.backends.kubernetes.options import (
    CONTAINER,
    LABEL_EXPERIMENT,
    PORT_NAME,
    KubeOptions,
)
from tfplan.planning.plan import Action, Plan, Task
from tfplan.planning.policy import RestartPolicy

__all__ = [
    "LIVE_KEY",
    "PERMANENT_EXIT_CODES",
    "PodTask",
    "Retry",
    "config_map",
    "escape",
    "jobs_manifests",
    "pod_task",
    "reader_pod",
    "request_lines",
    "retry_of",
    "service",
    "ships_code",
    "task_job",
    "work_items",
]

PERMANENT_EXIT_CODES = list(range(1, 128))  # ExitCode: the program gave up; 128+ were killed
WORK_VOLUME = "tfplan-work"
OUTPUT_VOLUME = "tfplan-output"
LIVE_KEY = "live.json"  # what a running job is told (recipes/live.py), under apply


@dataclass(frozen=True)
class PodTask:
    """One task as its container runs it (TF_CONFIG in ``env``)."""

    role: str
    index: int
    command: tuple[str, ...]
    env: dict[str, str]
    workdir: str


@dataclass(frozen=True)
class Retry:
    """How Kubernetes restarts a task's pod by itself: ``backoffLimit`` new pods at most;
    ``exit_codes``: exit codes 1-127 fail the Job at once (TFJob's ExitCode policy)."""

    backoff_limit: int = 0
    exit_codes: bool = False
    deadline_secs: int | None = None  # the Job's activeDeadlineSeconds
    ttl_secs: int | None = None  # ttlSecondsAfterFinished


def escape(text: str) -> str:
    """``text`` as Kubernetes must receive it to pass it on unchanged (``$`` -> ``$$``)."""
    return text.replace("$", "$$")


def retry_of(plan: Plan, role: str, opts: KubeOptions) -> Retry:
    """The plan's restart policy for ``role`` in Kubernetes' terms (exported manifests).

    Never -> no retry; OnFailure and Always -> ``backoffLimit`` new pods after a failure (a Job
    never reruns a pod that succeeded); ExitCode -> the same, plus a ``podFailurePolicy`` that
    fails the Job at once on exit codes 1-127 (and does not count evictions).
    """
    policy = plan.policy.for_role(role)
    deadline = plan.policy.deadline_secs
    return Retry(
        backoff_limit=0 if policy.restart is RestartPolicy.NEVER else policy.backoff_limit,
        exit_codes=policy.restart is RestartPolicy.EXIT_CODE,
        deadline_secs=None if deadline is None else math.ceil(deadline),
        ttl_secs=opts.ttl_seconds_after_finished,
    )


def ships_code(plan: Plan, opts: KubeOptions) -> bool:
    """Whether the recipes package (and the user's packages) go into the ConfigMap (else the
    image has them)."""
    return plan.builtin_recipes and opts.code == "configmap"


def pod_task(plan: Plan, task: Task) -> PodTask:
    """A planned task with the TF_CONFIG the engine gives it (the plan's DNS names)."""
    return PodTask(
        task.role.value,
        task.index,
        task.command,
        {**task.env, "TF_CONFIG": plan.tf_config(task)},
        task.workdir,
    )


def _metadata(opts: KubeOptions, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": opts.namespace, "labels": labels}
    if opts.annotations:
        meta["annotations"] = dict(opts.annotations)
    return meta


def _code_key(path: str) -> str:
    return path.replace("/", ".")  # ConfigMap keys allow [-._a-zA-Z0-9] only


def config_map(
    opts: KubeOptions,
    run_config: Mapping[str, Any],
    code: Mapping[str, str],
    live: str | None = None,
) -> dict[str, Any]:
    """run.yaml and the code files (``recipes/...`` -> text); under apply also ``live.json``
    (``live``: what a running job is told, ``recipes/live.py``)."""
    data = {"run.yaml": yaml.safe_dump(dict(run_config), sort_keys=True)}
    if live is not None:
        data[LIVE_KEY] = live
    data.update({_code_key(path): text for path, text in sorted(code.items())})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(opts, opts.config_map, opts.labels_for()),
        "data": data,
    }


def service(opts: KubeOptions) -> dict[str, Any]:
    """The headless Service whose name is every pod's subdomain."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(opts, opts.service, opts.labels_for()),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_EXPERIMENT: opts.name},
            "ports": [{"name": PORT_NAME, "port": opts.port, "targetPort": opts.port}],
        },
    }


def work_items(
    opts: KubeOptions,
    workdirs: Sequence[str],
    code_paths: Sequence[str],
    code_dir: str,
    live: bool = False,
) -> list[dict[str, str]]:
    keys = ["run.yaml", LIVE_KEY] if live else ["run.yaml"]
    items = [
        {"key": key, "path": posixpath.join(posixpath.relpath(w, opts.workdir), key)}
        for w in workdirs
        for key in keys
    ]
    base = posixpath.relpath(code_dir, opts.workdir)
    items += [{"key": _code_key(p), "path": posixpath.join(base, p)} for p in sorted(code_paths)]
    return items


def _volumes(opts: KubeOptions, items: list[dict[str, str]]) -> list[dict[str, Any]]:
    output: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": opts.output_volume}}
        if opts.output_volume
        else {"emptyDir": {}}
    )
    return [
        {"name": WORK_VOLUME, "configMap": {"name": opts.config_map, "items": items}},
        {"name": OUTPUT_VOLUME, **output},
    ]


def resources(opts: KubeOptions, role: str) -> dict[str, dict[str, str]]:
    """requests/limits of ``role``; a training task's GPUs as the GPU resource's limit."""
    wanted = {kind: dict(amounts) for kind, amounts in opts.resources.get(role, {}).items()}
    if opts.gpus and role in ("chief", "worker"):
        wanted.setdefault("limits", {})[opts.gpu_resource] = str(opts.gpus)
    return {kind: amounts for kind, amounts in wanted.items() if amounts}


def container(
    opts: KubeOptions,
    role: str,
    command: Sequence[str],
    env: Sequence[dict[str, Any]],
    workdir: str,
) -> dict[str, Any]:
    """The task's container; ``command`` and ``env`` already escaped."""
    spec: dict[str, Any] = {
        "name": CONTAINER,
        "image": opts.image,
        "imagePullPolicy": opts.image_pull_policy,
        "command": list(command),
        "env": list(env),
        "workingDir": workdir,
        "volumeMounts": [
            {"name": WORK_VOLUME, "mountPath": opts.workdir, "readOnly": True},
            {"name": OUTPUT_VOLUME, "mountPath": opts.output_dir},
        ],
    }
    if role != "evaluator":
        spec["ports"] = [{"name": PORT_NAME, "containerPort": opts.port, "protocol": "TCP"}]
    wanted = resources(opts, role)
    if wanted:
        spec["resources"] = wanted
    return spec


def pod_spec(
    opts: KubeOptions,
    the_container: dict[str, Any],
    items: list[dict[str, str]],
    restart_policy: str | None = "Never",
    hostname: str | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if hostname:
        spec["hostname"] = hostname
        spec["subdomain"] = opts.service
    if opts.service_account:
        spec["serviceAccountName"] = opts.service_account
    if opts.node_selector:
        spec["nodeSelector"] = dict(opts.node_selector)
    if opts.tolerations:
        spec["tolerations"] = [dict(t) for t in opts.tolerations]
    if opts.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in opts.image_pull_secrets]
    spec["containers"] = [the_container]
    spec["volumes"] = _volumes(opts, items)
    return spec


def job_spec(retry: Retry, template: dict[str, Any], indexed: bool = False) -> dict[str, Any]:
    """A Job that runs one pod, retried as ``retry`` says."""
    spec: dict[str, Any] = {"backoffLimit": retry.backoff_limit, "completions": 1, "parallelism": 1}
    if indexed:
        spec["completionMode"] = "Indexed"
    if retry.exit_codes:
        spec["podFailurePolicy"] = {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": CONTAINER,
                        "operator": "In",
                        "values": list(PERMANENT_EXIT_CODES),
                    },
                },
                {
                    "action": "Ignore",
                    "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                },
            ]
        }
    if retry.deadline_secs is not None:
        spec["activeDeadlineSeconds"] = retry.deadline_secs
    if retry.ttl_secs is not None:
        spec["ttlSecondsAfterFinished"] = retry.ttl_secs
    spec["template"] = template
    return spec


def env_list(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The environment in name order (a plan read back from its file has it sorted too)."""
    return [{"name": k, "value": escape(env[k])} for k in sorted(env)]


def task_job(
    opts: KubeOptions,
    task: PodTask,
    code_paths: Sequence[str],
    code_dir: str,
    retry: Retry = Retry(),
    live: bool = False,
) -> dict[str, Any]:
    """The Job of one task (``retry``: none under apply, the plan's policy when exported;
    ``live``: ``live.json`` beside its run.yaml, under apply)."""
    name = opts.job(task.role, task.index)
    labels = opts.labels_for(task.role, task.index)
    the_container = container(
        opts, task.role, [escape(w) for w in task.command], env_list(task.env), task.workdir
    )
    items = work_items(opts, [task.workdir], code_paths, code_dir, live)
    template = {
        "metadata": {"labels": labels, **_annotations(opts)},
        "spec": pod_spec(opts, the_container, items, hostname=name),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(opts, name, labels),
        "spec": job_spec(retry, template),
    }


def _annotations(opts: KubeOptions) -> dict[str, Any]:
    return {"annotations": dict(opts.annotations)} if opts.annotations else {}


def jobs_manifests(plan: Plan, opts: KubeOptions, code: Mapping[str, str]) -> list[dict[str, Any]]:
    """``--format jobs``: ConfigMap, headless Service, one Job per task."""
    shipped = code if ships_code(plan, opts) else {}
    return [
        config_map(opts, plan.run_config, shipped),
        service(opts),
        *(
            task_job(
                opts,
                pod_task(plan, task),
                sorted(shipped),
                plan.code_dir,
                retry_of(plan, task.role.value, opts),
            )
            for task in plan.tasks
        ),
    ]


def reader_pod(opts: KubeOptions, name: str, path: str) -> dict[str, Any]:
    """A pod that prints one file of the output volume to its log (exit 3: no such file)."""
    script = 'test -f "$1" || exit 3; cat "$1"'
    spec = pod_spec(
        opts,
        {
            "name": "reader",
            "image": opts.image,
            "imagePullPolicy": opts.image_pull_policy,
            "command": ["sh", "-c", escape(script), "tfplan-read", escape(path)],
            "volumeMounts": [
                {"name": OUTPUT_VOLUME, "mountPath": opts.output_dir, "readOnly": True}
            ],
        },
        [],
    )
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] == OUTPUT_VOLUME]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(opts, name, {**opts.labels_for(), "tfplan/reader": "true"}),
        "spec": spec,
    }


_SYMBOLS = {Action.CREATE: "+", Action.REPLACE: "-/+", Action.DESTROY: "-"}


def request_lines(plan: Plan, opts: KubeOptions) -> tuple[str, ...]:
    """The objects ``tfplan apply`` creates, replaces or deletes, Terraform style (the dry run)."""
    where = opts.context or "the current context"
    config = opts.kubeconfig or "$KUBECONFIG or ~/.kube/config"
    lines = [f'namespace "{opts.namespace}" ({where} of {config})']
    starts = any(c.action in (Action.CREATE, Action.REPLACE) for c in plan.changes)
    if starts:
        code = "run.yaml and the recipes package" if ships_code(plan, opts) else "run.yaml"
        if ships_code(plan, opts) and plan.user_code:
            code += " and " + ", ".join(c.name for c in plan.user_code)
        lines.append(f"+   ConfigMap/{opts.config_map} ({code}; replaced if it exists)")
        lines.append(
            f"+   Service/{opts.service} (headless, port {opts.port}; pods resolve as "
            f"<job>.{opts.service}.{opts.namespace}.svc; kept if it exists)"
        )
    by_name = {c.task: c.action for c in plan.changes}
    for change in plan.changes:
        symbol = _SYMBOLS.get(change.action)
        if symbol is None:
            continue
        role, _, index = change.task.partition("/")
        line = f"{symbol:<3} Job/{opts.job(role, index)}"
        if by_name[change.task] is not Action.DESTROY:
            line += f" ({_pod_words(opts, role)})"
        lines.append(line)
    if opts.output_volume:
        lines.append(f"volume: PersistentVolumeClaim/{opts.output_volume} at {opts.output_dir}")
    else:
        lines.append(
            f"volume: none (emptyDir at {opts.output_dir}): checkpoints and result.json stay in "
            "the chief's pod and go with it; set cluster.options.output_volume to a PVC"
        )
    return tuple(lines)


def _pod_words(opts: KubeOptions, role: str) -> str:
    words = [f"image {opts.image}"]
    for kind, amounts in resources(opts, role).items():
        words.append(f"{kind} " + ",".join(f"{k}={v}" for k, v in sorted(amounts.items())))
    return "; ".join(words)
