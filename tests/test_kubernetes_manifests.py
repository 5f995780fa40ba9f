"""The Kubernetes backend at plan time (pure): options, the objects of each format, their
names against TF_CONFIG, the policy mapping, and ``tfplan export kubernetes``.

No cluster: every object is deserialised into the official client's models and must come back
unchanged (so no field is unknown to Kubernetes), and JobSet/TFJob objects are validated
against those projects' own API models from PyPI (kubeflow-trainer-api: JobSet v1alpha2;
kubeflow-training: TFJob v1), unknown fields and wrong types refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from k8s_helpers import (
    container_command,
    container_env,
    downpour_plan,
    k8s_plan,
    round_trip,
    validate_crd,
)

from tfplan.backends.kubernetes import KubernetesBackend, export_manifests
from tfplan.backends.kubernetes.manifests import PodTask, task_job
from tfplan.backends.kubernetes.options import KubeOptions
from tfplan.backends.kubernetes.replicated import JOBSET_INDEX_FIELD, TFJOB_INDEX_FIELD
from tfplan.cli.main import main
from tfplan.errors import BackendError, ConfigError, PlanError
from tfplan.planning.plan import Plan
from tfplan.planning.tf_config import ClusterSpecText

MODEL_OF = {"ConfigMap": "V1ConfigMap", "Service": "V1Service", "Job": "V1Job"}


def _kinds(objects: list[dict[str, Any]]) -> list[str]:
    return [f"{o['kind']}/{o['metadata']['name']}" for o in objects]


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+cluster.options.nmespace=x",
            "cluster.options.nmespace: no such option; known: name, namespace",
        ),
        (
            "cluster.options.namespace=Bad_NS",
            "cluster.options.namespace: 'Bad_NS' is not a DNS label",
        ),
        ("cluster.options.code=git", "cluster.options.code: 'git' is not one of configmap, image"),
        ("cluster.options.gpus=-1", "cluster.options.gpus: -1 is not a count"),
        (
            "cluster.options.resources.worker.limits.memory=lots",
            "cluster.options.resources.worker.limits.memory: 'lots' is not a Kubernetes quantity",
        ),
        ("+cluster.options.resources.master={}", "cluster.options.resources.master: no such role"),
        (
            "cluster.options.tolerations=[{kee: gpu}]",
            "cluster.options.tolerations[0].kee: no such field",
        ),
        (
            "cluster.output_dir=outputs/x",
            "cluster.output_dir: 'outputs/x' is not an absolute folder",
        ),
        (
            "cluster.output_dir=/tfplan/out",
            "cluster.output_dir: /tfplan/out and cluster.workdir /tfplan overlap",
        ),
        ("cluster.workers=per_gpu", "cluster.workers: per_host and per_gpu count hosts"),
        (
            "cluster.firewall=true",
            "cluster.firewall: the kubernetes backend cannot install firewall rules",
        ),
        (
            "cluster.hosts=[{address: 10.0.0.1}]",
            "cluster.hosts: the kubernetes backend places one pod per task",
        ),
    ],
)
def test_a_bad_option_is_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        k8s_plan(override)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_the_cli_prints_an_option_error_as_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "cluster=k8s", "+cluster.options.nmespace=x", "--no-save"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: cluster.options.nmespace: no such option") and "\n" not in err


def test_names_are_dns_labels_even_from_odd_experiment_ids() -> None:
    plan = k8s_plan("experiment.id=LR_0.1")
    name = plan.backend.config["name"]
    assert name.startswith("tfplan-lr-0-1-") and len(name) <= 40
    long = k8s_plan("experiment.id=" + "x" * 80).backend.config["name"]
    assert len(long) == 40 and long != k8s_plan("experiment.id=" + "x" * 81).backend.config["name"]


def test_the_plan_places_one_task_per_pod_named_after_its_dns_name() -> None:
    plan = downpour_plan("cluster.options.namespace=ml", "cluster.options.gpus=2")
    opts = KubeOptions.from_ref(plan.backend)
    assert [h.name for h in plan.hosts] == [
        f"tfplan-downpour-{t}" for t in ("ps-0", "worker-0", "worker-1", "worker-2")
    ]
    for task in plan.tasks:
        assert (
            plan.address_of(task)
            == f"tfplan-downpour-{task.role.value}-{task.index}.tfplan-downpour.ml.svc"
        )
        assert task.port == opts.port == 2222
        assert task.devices == (("0", "1") if task.role.value == "worker" else ())
    assert (
        plan.cluster_spec()["worker"][2] == "tfplan-downpour-worker-2.tfplan-downpour.ml.svc:2222"
    )


def test_the_plan_shows_the_objects_apply_creates() -> None:
    plan = downpour_plan("cluster.options.output_volume=shared")
    assert plan.request[0].startswith('namespace "default"')
    assert (
        "+   ConfigMap/tfplan-downpour-config (run.yaml and the recipes package" in plan.request[1]
    )
    assert plan.request[2].startswith("+   Service/tfplan-downpour (headless, port 2222")
    jobs = [line for line in plan.request if "Job/" in line]
    assert [j.split()[1] for j in jobs] == [
        f"Job/tfplan-downpour-{t}" for t in ("ps-0", "worker-0", "worker-1", "worker-2")
    ]
    assert "requests cpu=2,memory=2Gi; limits memory=4Gi" in jobs[1]
    assert plan.request[-1] == "volume: PersistentVolumeClaim/shared at /tfplan-output/downpour"
    assert KubernetesBackend.dryrun(plan) == plan.request


# --- the objects -------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jobs", "jobset", "tfjob"])
def test_every_object_deserialises_into_the_official_client_models_unchanged(fmt: str) -> None:
    objects = export_manifests(
        downpour_plan("cluster.chief=separate", "cluster.evaluator=true"), fmt
    )
    for obj in objects:
        if obj["kind"] in MODEL_OF:
            assert round_trip(obj, MODEL_OF[obj["kind"]]) == obj
        elif obj["kind"] == "JobSet":
            for replicated in obj["spec"]["replicatedJobs"]:
                template = replicated["template"]
                assert round_trip(template, "V1JobTemplateSpec") == template
        else:
            for replica in obj["spec"]["tfReplicaSpecs"].values():
                assert round_trip(replica["template"], "V1PodTemplateSpec") == replica["template"]


def test_the_round_trip_would_catch_a_field_kubernetes_does_not_know() -> None:
    job = export_manifests(downpour_plan(), "jobs")[2]
    job["spec"]["template"]["spec"]["containers"][0]["gpus"] = 1
    assert round_trip(job, "V1Job") != job


@pytest.mark.parametrize("fmt", ["jobset", "tfjob"])
def test_jobset_and_tfjob_validate_against_their_crd_schemas(fmt: str) -> None:
    plan = downpour_plan(
        "cluster.chief=separate",
        "cluster.evaluator=true",
        "cluster.options.output_volume=shared",
        "cluster.options.gpus=1",
        "cluster.options.tolerations=[{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]",
        "+cluster.options.node_selector.pool=gpu",
        "cluster.options.service_account=trainer",
        "cluster.options.ttl_seconds_after_finished=600",
        "lifecycle.deadline_secs=3600",
    )
    obj = export_manifests(plan, fmt)[-1]
    validate_crd(obj)
    broken = json.loads(json.dumps(obj))
    if fmt == "jobset":
        broken["spec"]["replicatedJobs"][0]["bogus"] = 1
    else:
        broken["spec"]["runPolicy"]["bogus"] = 1
    with pytest.raises(AssertionError, match="does not survive|no such field"):
        validate_crd(broken)
    wrong = json.loads(json.dumps(obj))
    if fmt == "jobset":
        wrong["spec"]["replicatedJobs"][0]["replicas"] = "two"
        with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
            validate_crd(wrong)


def test_jobs_format_names_match_tf_config_and_the_service() -> None:
    plan = downpour_plan("cluster.options.namespace=ml")
    config_map, service, *jobs = export_manifests(plan, "jobs")
    assert _kinds([config_map, service]) == [
        "ConfigMap/tfplan-downpour-config",
        "Service/tfplan-downpour",
    ]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    resolvable = {}
    for job in jobs:
        pod = job["spec"]["template"]
        assert all(
            pod["metadata"]["labels"].get(k) == v for k, v in service["spec"]["selector"].items()
        )
        spec = pod["spec"]
        assert spec["subdomain"] == service["metadata"]["name"]
        resolvable[spec["hostname"]] = (
            f"{spec['hostname']}.{spec['subdomain']}.{job['metadata']['namespace']}.svc"
        )
    for job, task in zip(jobs, plan.tasks, strict=True):
        container = job["spec"]["template"]["spec"]["containers"][0]
        env = container_env(container, {})
        tf_config = json.loads(env["TF_CONFIG"])
        assert tf_config["task"] == {"type": task.role.value, "index": task.index}
        names = [a.rsplit(":", 1)[0] for hosts in tf_config["cluster"].values() for a in hosts]
        assert sorted(names) == sorted(resolvable.values())
        assert env == {**task.env, "TF_CONFIG": plan.tf_config(task)}
        assert container_command(container, env) == list(task.command)


def _jobset_names(jobset: dict[str, Any]) -> dict[str, list[str]]:
    """Pod DNS names by the JobSet controller's rule: <jobset>-<rjob>-<job index>-<pod index>."""
    subdomain = jobset["spec"]["network"]["subdomain"]
    ns = jobset["metadata"]["namespace"]
    return {
        rj["name"]: [
            f"{jobset['metadata']['name']}-{rj['name']}-{i}-0.{subdomain}.{ns}.svc"
            for i in range(rj["replicas"])
        ]
        for rj in jobset["spec"]["replicatedJobs"]
    }


def test_jobset_tf_config_names_the_pods_the_jobset_controller_makes() -> None:
    plan = downpour_plan("cluster.evaluator=true")
    jobset = export_manifests(plan, "jobset")[-1]
    names = _jobset_names(jobset)
    for rj in jobset["spec"]["replicatedJobs"]:
        job = rj["template"]["spec"]
        assert (job["completions"], job["parallelism"], job["completionMode"]) == (1, 1, "Indexed")
        container = job["template"]["spec"]["containers"][0]
        for index in range(rj["replicas"]):
            env = container_env(container, {JOBSET_INDEX_FIELD: str(index)})
            tf_config = json.loads(env["TF_CONFIG"])
            assert tf_config["task"] == {"type": rj["name"], "index": index}
            cluster = tf_config["cluster"]
            assert cluster == {
                r: [f"{n}:2222" for n in names[r]] for r in names if r != "evaluator"
            }
            task = plan.task(f"{rj['name']}/{index}")
            want = {
                **task.env,
                "TF_CONFIG": ClusterSpecText(cluster).tf_config(task.role.value, index),
            }
            assert env == {"TFPLAN_INDEX": str(index), **want}
            assert container_command(container, env) == list(task.command)


def _tfjob_cluster(tfjob: dict[str, Any]) -> dict[str, list[str]]:
    """TF_CONFIG's cluster as training-operator v1.9 writes it (genClusterSpec): every replica
    type, lower-cased, <tfjob>-<type>-<i>.<namespace>.svc:<the tfjob-port container port>."""
    name, ns = tfjob["metadata"]["name"], tfjob["metadata"]["namespace"]
    cluster = {}
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        ports = spec["template"]["spec"]["containers"][0].get("ports", [])
        port = next((p["containerPort"] for p in ports if p["name"] == "tfjob-port"), 2222)
        cluster[rtype.lower()] = [
            f"{name}-{rtype.lower()}-{i}.{ns}.svc:{port}" for i in range(spec["replicas"])
        ]
    return cluster


def test_tfjob_command_placeholders_get_the_names_the_operator_writes() -> None:
    command = "python train.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --me={task_address} --cost=$$5"
    plan = downpour_plan("recipe=command", f"recipe.command='{command}'")
    tfjob = export_manifests(plan, "tfjob")[-1]
    cluster = _tfjob_cluster(tfjob)
    assert cluster["ps"] == ["tfplan-downpour-ps-0.default.svc:2222"]
    for rtype, spec in tfjob["spec"]["tfReplicaSpecs"].items():
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "tensorflow"
        for index in range(spec["replicas"]):
            env = container_env(container, {TFJOB_INDEX_FIELD: str(index)})
            assert "TF_CONFIG" not in env  # the operator adds it
            words = container_command(container, env)
            role = rtype.lower()
            assert words[2:7] == [
                f"--job_name={role}",
                f"--task_index={index}",
                f"--ps_hosts={','.join(cluster['ps'])}",
                f"--worker_hosts={','.join(cluster['worker'])}",
                f"--me={cluster[role][index]}",
            ]
            assert words[7] == "--cost=$$5"  # the user's literal text, through the expansion


def test_a_role_whose_tasks_differ_beyond_their_index_is_refused_for_replicated_formats() -> None:
    plan = downpour_plan("recipe=command", "recipe.command='python t.py --chief={is_chief}'")
    with pytest.raises(PlanError, match="use --format jobs, or cluster.chief=separate"):
        export_manifests(plan, "jobset")
    assert len(export_manifests(plan, "jobs")) == 6


def test_literal_dollars_survive_kubernetes_expansion_in_jobs() -> None:
    plan = k8s_plan(
        "recipe=command",
        "recipe.command='sh -c \"echo $(hostname) $$HOME\"'",
        "+recipe.env={PRICE: '$(X)'}",
    )
    job = export_manifests(plan, "jobs")[2]
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = container_env(container, {})
    assert env["PRICE"] == "$(X)"
    assert container_command(container, env) == list(plan.tasks[0].command)


def test_volumes_put_run_yaml_and_the_code_where_the_command_reads_them() -> None:
    plan = downpour_plan("cluster.options.output_volume=shared")
    job = export_manifests(plan, "jobs")[3]  # worker/0
    spec = job["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    work = mounts["tfplan-work"]
    assert work["mountPath"] == "/tfplan" and work["readOnly"]
    files = {
        f"{work['mountPath']}/{i['path']}": i["key"]
        for i in volumes["tfplan-work"]["configMap"]["items"]
    }
    env = container_env(container, {})
    assert files[env["TFPLAN_RUN_CONFIG"]] == "run.yaml" == files[plan.tasks[1].command[-1]]
    assert files[f"{env['PYTHONPATH']}/recipes/train.py"] == "recipes.train.py"
    config_map = export_manifests(plan, "jobs")[0]
    assert set(files.values()) <= set(config_map["data"])
    assert yaml.safe_load(config_map["data"]["run.yaml"]) == plan.run_config
    assert mounts["tfplan-output"]["mountPath"] == plan.output_dir
    assert volumes["tfplan-output"]["persistentVolumeClaim"] == {"claimName": "shared"}
    image = k8s_plan("cluster.options.code=image")
    assert list(export_manifests(image, "jobs")[0]["data"]) == ["run.yaml"]


# --- policies ----------------------------------------------------------------------------------


def _policy_plan() -> Plan:
    return downpour_plan(
        "cluster.chief=separate",
        "cluster.evaluator=true",
        "lifecycle.restart.ps=OnFailure",
        "lifecycle.restart.chief=ExitCode",
        "lifecycle.restart.worker=Always",
        "lifecycle.restart.evaluator=Never",
        "lifecycle.restart.backoff_limit=2",
        "lifecycle.deadline_secs=100.5",
    )


def test_jobs_map_restart_policies_to_backoff_limit_and_pod_failure_policy() -> None:
    jobs = {
        j["metadata"]["name"].split("-", 2)[2]: j["spec"]
        for j in export_manifests(_policy_plan(), "jobs")[2:]
    }
    assert {k: j["backoffLimit"] for k, j in jobs.items()} == {
        "ps-0": 2,
        "chief-0": 2,
        "worker-0": 2,
        "worker-1": 2,
        "worker-2": 2,
        "evaluator-0": 0,
    }
    assert [k for k, j in jobs.items() if "podFailurePolicy" in j] == ["chief-0"]
    rules = jobs["chief-0"]["podFailurePolicy"]["rules"]
    assert rules[0]["action"] == "FailJob"
    assert rules[0]["onExitCodes"] == {
        "containerName": "tensorflow",
        "operator": "In",
        "values": list(range(1, 128)),
    }
    assert rules[1] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert all(j["template"]["spec"]["restartPolicy"] == "Never" for j in jobs.values())
    assert all(j["activeDeadlineSeconds"] == 101 for j in jobs.values())


def test_tfjob_keeps_tfplan_policies_and_jobset_succeeds_with_the_chief() -> None:
    plan = _policy_plan()
    tfjob = export_manifests(plan, "tfjob")[-1]
    replicas = tfjob["spec"]["tfReplicaSpecs"]
    assert {k: v["restartPolicy"] for k, v in replicas.items()} == {
        "PS": "OnFailure",
        "Chief": "ExitCode",
        "Worker": "Always",
        "Evaluator": "Never",
    }
    assert tfjob["spec"]["runPolicy"] == {
        "cleanPodPolicy": "Running",
        "backoffLimit": 10,
        "activeDeadlineSeconds": 101,
    }
    jobset = export_manifests(plan, "jobset")[-1]
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert jobset["spec"]["failurePolicy"] == {"maxRestarts": 0}
    assert export_manifests(downpour_plan(), "jobset")[-1]["spec"]["successPolicy"][
        "targetReplicatedJobs"
    ] == ["worker"]


def test_apply_creates_jobs_that_never_retry_by_themselves() -> None:
    plan = downpour_plan()
    opts = KubeOptions.from_ref(plan.backend)
    task = plan.tasks[1]
    job = task_job(
        opts,
        PodTask("worker", 0, task.command, {**task.env, "TF_CONFIG": "{}"}, task.workdir),
        [],
        plan.code_dir,
    )
    assert job["spec"]["backoffLimit"] == 0 and "podFailurePolicy" not in job["spec"]
    assert round_trip(job, "V1Job") == job


# --- tfplan export kubernetes -----------------------------------------------------------------


def test_export_writes_yaml_to_stdout_or_one_file_per_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFPLAN_WORKSPACE", raising=False)
    assert main(["plan", "cluster=k8s", "algo=downpour", "cluster.workers=3"]) == 0
    capsys.readouterr()
    assert main(["export", "kubernetes"]) == 0
    documents = list(yaml.safe_load_all(capsys.readouterr().out))
    assert _kinds(documents)[:3] == [
        "ConfigMap/tfplan-default-config",
        "Service/tfplan-default",
        "Job/tfplan-default-ps-0",
    ]
    assert len(documents) == 6
    assert main(["export", "kubernetes", "--format", "jobset", "--out", "k8s"]) == 0
    assert sorted(p.name for p in (tmp_path / "k8s").iterdir()) == [
        "00-configmap-tfplan-default-config.yaml",
        "01-jobset-tfplan-default.yaml",
    ]
    jobset = yaml.safe_load((tmp_path / "k8s" / "01-jobset-tfplan-default.yaml").read_text())
    validate_crd(jobset)


def test_export_of_a_plan_for_another_backend_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TFPLAN_WORKSPACE", raising=False)
    assert main(["plan", "cluster=local"]) == 0
    capsys.readouterr()
    assert main(["export", "kubernetes"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: the plan runs on the process backend, not kubernetes: plan it with cluster=k8s "
        "(tfplan plan cluster=k8s ...) to export Kubernetes manifests"
    )


def test_the_docs_show_exactly_what_export_writes_for_the_downpour_example() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "kubernetes.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```yaml\n")[1:]]
    shown = [list(yaml.safe_load_all(b)) for b in blocks]
    plan = downpour_plan(
        "cluster.options.code=image",
        "cluster.options.image=registry.example.com/ml/tfplan:2.21.0",
        "cluster.options.output_volume=tfplan-shared",
    )
    jobs, jobset, tfjob = (export_manifests(plan, fmt) for fmt in ("jobs", "jobset", "tfjob"))
    assert shown == [jobs, jobset[1:], tfjob[1:]]
    assert jobset[0] == tfjob[0] == jobs[0]  # the ConfigMap, shown once
    for line in plan.request[:3]:
        assert line in text


def test_plan_and_export_need_no_kubernetes_client_and_apply_says_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import kubernetes -> ImportError
    plan = downpour_plan()
    assert len(export_manifests(plan, "tfjob")) == 2
    backend = KubernetesBackend(plan.backend, tmp_path)
    with pytest.raises(
        BackendError,
        match=r"the kubernetes client is not installed: pip install 'tfplan\[kubernetes\]'",
    ):
        backend.preflight(plan, plan.tasks)


def test_cluster_domain_goes_into_every_address() -> None:
    plan = k8s_plan("cluster.options.cluster_domain=corp.example")
    assert (
        plan.address_of(plan.tasks[0])
        == "tfplan-default-ps-0.tfplan-default.default.svc.corp.example"
    )
    with pytest.raises(
        ConfigError, match="cluster.options.cluster_domain: '{x}' is not a DNS domain"
    ):
        k8s_plan("cluster.options.cluster_domain='{x}'")
