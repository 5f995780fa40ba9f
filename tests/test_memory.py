"""``cluster.memory`` before anything runs (tfplan.planning.memory): the sizes it reads, what it
refuses and how, the limit in the plan, its file and its rendering, a change of it, and the one
line that explains a task killed at its limit. The real cgroups are tests/test_cgroups.py's."""

from __future__ import annotations

import copy
import dataclasses
import json
from functools import cache
from pathlib import Path

import pytest
from state_helpers import state_from

from tfplan.backends.api import LaunchRequest
from tfplan.backends.process.memory import group_of
from tfplan.backends.transports.cgroups import cgroup_name
from tfplan.backends.transports.scripts import (
    MEMORY_TASK_WRAPPER,
    TASK_WRAPPER,
    memory_env,
    task_wrapper,
)
from tfplan.backends.transports.seeds import fork_request
from tfplan.cli.render import plan_lines, task_lines
from tfplan.config.compose import compose_config, to_config
from tfplan.config.schema import Config
from tfplan.diagnosis.explain import Evidence, OomKill, explain
from tfplan.engine.plans import make_plan
from tfplan.errors import ConfigError
from tfplan.planning.context import PlanContext
from tfplan.planning.memory import check_memory, parse_limit
from tfplan.planning.plan import Action, Plan
from tfplan.planning.state import TaskRecord

CONF = Path(__file__).resolve().parent.parent / "conf"
CTX = PlanContext(cwd="/home/user/project", local_python="/usr/bin/python3", tf_version="2.21.0")
GiB, MiB = 2**30, 2**20


@cache
def _composed(overrides: tuple[str, ...]) -> Config:
    return to_config(compose_config(list(overrides), CONF))


def _plan(*overrides: str, state: object = None) -> Plan:
    return make_plan(copy.deepcopy(_composed(overrides)), state, CTX)  # type: ignore[arg-type]


def _error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as raised:
        _plan(*overrides)
    return str(raised.value)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (1073741824, GiB),
        ("1073741824", GiB),
        ("512MiB", 512 * MiB),
        ("1GiB", GiB),
        ("1.5G", GiB + GiB // 2),
        ("800M", 800 * MiB),
        ("800m", 800 * MiB),
        ("2Gi", 2 * GiB),
        ("1 GB", GiB),  # every unit a power of 1024, as Slurm's --mem and Docker read them
        ("64KiB", 64 * 1024),
        ("1T", 2**40),
        (None, None),
    ],
)
def test_a_limit_is_bytes_or_a_size_with_a_binary_unit(value: object, size: int | None) -> None:
    assert parse_limit(value) == size


@pytest.mark.parametrize("value", ["lots", "1.5", "1 PB", "-1G", "G", True, 1.5, [1]])
def test_what_is_no_size_is_refused(value: object) -> None:
    with pytest.raises(ValueError, match="is not a"):
        parse_limit(value)


def test_each_refusal_is_one_line_naming_the_key_and_the_fix() -> None:
    assert _error("+cluster.memory.workers=1GiB") == (
        "cluster.memory.workers: no such role; give limits for ps, chief, worker, evaluator "
        "(each or none)"
    )
    said = _error("+cluster.memory.worker=lots")
    assert said.startswith("cluster.memory.worker: 'lots' is not a size; give bytes or a size")
    assert "512MiB, 1GiB, 1.5G (units are powers of 1024), or null" in said
    said = _error("+cluster.memory.ps=32MiB")
    assert said.startswith("cluster.memory.ps: 32.0 MiB is under 64.0 MiB;")
    assert "a TensorFlow process alone needs about 400 MiB" in said and "\n" not in said


@pytest.mark.parametrize(
    ("backend", "knob"),
    [
        ("kubernetes", "cluster.options.resources.<role>.limits.memory"),
        ("slurm", "cluster.options.mem (sbatch --mem"),
        ("spark", "cluster.options.roles.<role>"),
        ("mine", "the backend's own options"),
    ],
)
def test_another_backend_is_refused_naming_its_own_knob(backend: str, knob: str) -> None:
    with pytest.raises(ConfigError) as raised:
        check_memory({"worker": "1GiB"}, backend)
    said = str(raised.value)
    assert said.startswith(f"cluster.memory: the {backend} backend does not put tasks in cgroups")
    assert knob in said and "\n" not in said
    check_memory({"worker": None}, backend)  # no limit at all: nothing to refuse
    assert "cluster.options.resources" in _error("cluster=k8s", "+cluster.memory.ps=2GiB")


def test_each_task_takes_its_roles_limit_and_the_chief_the_chiefs() -> None:
    """worker/0 as the chief (cluster.chief=worker0) takes cluster.memory.chief, as a
    separate chief does; a role with null or no entry has no limit."""
    p = _plan(
        "cluster=local",
        "cluster.evaluator=true",
        "+cluster.memory.worker=1GiB",
        "+cluster.memory.chief=2G",
        "+cluster.memory.ps=null",
    )
    assert {t.name: t.memory_limit for t in p.tasks} == {
        "ps/0": None,
        "worker/0": 2 * GiB,
        "worker/1": GiB,
        "evaluator/0": None,
    }
    assert not [w for w in p.warnings if "cluster.memory" in w]
    separate = _plan("cluster=local_chief", "+cluster.memory.chief=1GiB")
    assert {t.name: t.memory_limit for t in separate.tasks if t.memory_limit} == {"chief/0": GiB}


def test_a_worker_limit_without_one_for_the_chief_is_warned_of() -> None:
    p = _plan("cluster=local", "+cluster.memory.worker=1GiB")
    assert p.task("worker/0").memory_limit is None
    said = [w for w in p.warnings if "cluster.memory" in w]
    assert len(said) == 1 and "worker/0 is the chief" in said[0]
    assert "Set cluster.memory.chief too" in said[0]


def test_the_limit_is_in_the_plan_file_only_when_set_and_round_trips() -> None:
    p = _plan("cluster=local", "+cluster.memory.worker=1GiB")
    data = p.to_dict()
    tasks = {t["role"] + "/" + str(t["index"]): t for t in data["tasks"]}
    assert tasks["worker/1"]["memory_limit"] == GiB
    assert "memory_limit" not in tasks["ps/0"] and "memory_limit" not in tasks["worker/0"]
    assert Plan.from_dict(data) == p
    record = TaskRecord.from_task(p.task("worker/1"), p, {"pid": 9}, 0.0, "localhost", None)
    assert record.to_dict()["memory_limit"] == GiB
    assert TaskRecord.from_dict(record.to_dict()) == record
    bare = TaskRecord.from_task(p.task("ps/0"), p, {"pid": 8}, 0.0, "localhost", None)
    assert "memory_limit" not in bare.to_dict()


def test_a_new_limit_replaces_the_task_and_no_limit_leaves_the_fingerprint_alone() -> None:
    plain = _plan("cluster=local")
    unset = _plan("cluster=local", "+cluster.memory.worker=null")
    assert [t.fingerprint for t in unset.tasks] == [t.fingerprint for t in plain.tasks]
    limited = _plan("cluster=local", "+cluster.memory.worker=1GiB", state=state_from(plain))
    changes = {c.task: c for c in limited.changes}
    assert changes["worker/1"].action is Action.REPLACE
    assert changes["worker/1"].reasons == ("memory: no limit -> 1.0 GiB",)
    assert changes["ps/0"].action is Action.NOOP and changes["worker/0"].action is Action.NOOP
    raised = _plan("cluster=local", "+cluster.memory.worker=2GiB", state=state_from(limited))
    assert {c.task: c.reasons for c in raised.changes}["worker/1"] == (
        "memory: 1.0 GiB -> 2.0 GiB",
    )


def test_the_plan_shows_the_limit_of_a_task_that_has_one() -> None:
    p = _plan("cluster=local", "+cluster.memory.worker=1GiB", "+cluster.memory.chief=null")
    text = "\n".join(line for _, line in plan_lines(p))
    assert text.count("memory     = 1.0 GiB (a cgroup of its own)") == 1
    block = text.split('task "worker/1" {', 1)[1].split("}", 1)[0]
    assert "+ memory     = 1.0 GiB (a cgroup of its own)" in block
    shown = "\n".join(line for _, line in task_lines(p, "worker/1"))
    assert "memory     = 1.0 GiB (a cgroup of its own)" in shown
    before = state_from(_plan("cluster=local"))
    limited = _plan("cluster=local", "+cluster.memory.worker=1GiB", state=before)
    compact = [line for _, line in plan_lines(limited, mode="summary") if 'task "' in line]
    assert compact == [
        '  -/+ task "worker/1" { host = "localhost" (127.0.0.1), port = 2224, devices = [], '
        "memory = 1.0 GiB }"
    ]


def test_a_tasks_group_is_named_for_its_experiment_and_task() -> None:
    assert cgroup_name("lr-0.1", "worker", 3) == "tfplan-lr-0.1-worker-3"
    assert cgroup_name("a/b c", "ps", 0) == "tfplan-a_b_c-ps-0"
    assert cgroup_name("e", "ps", 0, standby_attempt=2) == "tfplan-e-ps-0-standby-2"
    request = LaunchRequest("ps/0", "ps", 0, "h", ("python",), {}, "/w", "/w/log", experiment="e")
    assert group_of(request) == "tfplan-e-ps-0"  # a restart enters the group of the first life
    assert group_of(dataclasses.replace(request, attempt=4)) == "tfplan-e-ps-0"
    standby = dataclasses.replace(request, attempt=4, standby=True)
    assert group_of(standby) == "tfplan-e-ps-0-standby-4"  # beside its live task, its own


def _killed(memcg: str | None, task_memcg: str | None, limit: int | None) -> str:
    oom = OomKill(7, "python", 300 * MiB, 0.0, memcg, task_memcg)
    evidence = Evidence(
        "worker/1", "h1", 137, "", oom=oom, memory_limit=limit, memory_key="cluster.memory.worker"
    )
    found = explain(evidence)
    assert found is not None
    return f"{found.id}: {found.line}"


def test_a_task_killed_at_its_own_limit_is_told_which_limit() -> None:
    own = "/sandbox/tfplan-t-worker-1"
    assert _killed(own, own, GiB) == (
        "memory-limit: killed by the kernel on host h1: it reached its memory limit of 1.0 GiB "
        "(cluster.memory.worker) -> raise cluster.memory.worker (a TensorFlow process alone "
        "needs about 400 MiB), or make the task use less (a smaller data.batch_size or model)"
    )
    assert _killed(None, None, GiB).startswith("memory-limit:")  # the kernel did not say
    # the host's memory ran out, or a limit above the task's own: not its limit
    assert _killed("", own, GiB).startswith("oom-killed: killed by the out-of-memory killer")
    assert _killed("/sandbox", own, GiB).startswith("oom-killed:")
    assert _killed(own, own, None).startswith("oom-killed:")  # no limit of its own


def test_a_fork_request_carries_the_limit_only_when_the_task_has_one() -> None:
    plain = json.loads(fork_request(("py", "t.py"), {}, "/w", "/w/log", "/w/exit"))
    assert "memory_limit" not in plain and "cgroup" not in plain
    limited = json.loads(
        fork_request(("py", "t.py"), {}, "/w", "/w/log", "/w/exit", GiB, "tfplan-e-worker-0")
    )
    assert (limited["memory_limit"], limited["cgroup"]) == (GiB, "tfplan-e-worker-0")
    assert memory_env(None, "x") == {} and task_wrapper(None) == TASK_WRAPPER
    assert memory_env(GiB, "g") == {"TFPLAN_CGROUP": "g", "TFPLAN_MEMORY_LIMIT": str(GiB)}
    assert task_wrapper(GiB) == MEMORY_TASK_WRAPPER
