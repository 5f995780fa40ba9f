"""-target end to end, on a cluster far too large for one TF_CONFIG variable.

A cluster of 3,500 tasks whose other hosts do not exist (``*.invalid``): planning it contacts
nothing, and ``apply -target`` starts one task on localhost, preflighting only localhost. That
task really starts with a TF_CONFIG of over 200 KB, through the file and the launcher.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    alive,
    base_overrides,
    fake_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)

REMOTE = 5
WORKERS = 3500

PROBE = """
import json, os, sys, time
config = json.loads(os.environ["TF_CONFIG"])
print(json.dumps({"size": len(os.environ["TF_CONFIG"]), "task": config["task"],
                  "workers": len(config["cluster"]["worker"]),
                  "file": os.environ.get("TF_CONFIG_FILE")}), flush=True)
while True:  # serves until stopped, like a ps
    time.sleep(0.2)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _conf(tmp: Path, port: int) -> dict[str, str]:
    """A config tree with cluster=huge: localhost and REMOTE hosts that do not exist."""
    conf = tmp / "conf"
    shutil.copytree(CONF, conf)
    hosts = ["  - {address: 127.0.0.1, name: local, cpu_slots: 2}"] + [
        f"  - {{address: node-{i:04d}.rack-{i % 7}.a-long-domain-name-for-the-cluster.invalid, "
        f"name: node{i}, cpu_slots: 800}}"
        for i in range(REMOTE)
    ]
    (conf / "cluster" / "huge.yaml").write_text(
        "defaults:\n  - schema_cluster\n  - _self_\nname: huge\nhosts:\n"
        + "\n".join(hosts)
        + f"\nps: 1\nworkers: {WORKERS}\nchief: worker0\nport_base: {port}\nport_range: 1000\n"
        f"workdir: {tmp}/work\noutput_dir: {tmp}/out\n"
    )
    (tmp / "probe.py").write_text(PROBE)
    return {"TFPLAN_CONF": str(conf)}


def _overrides(tmp: Path) -> list[str]:
    return [
        "cluster=huge",
        "experiment.id=t",
        "recipe=command",
        f"recipe.command='{sys.executable} {tmp / 'probe.py'}'",
        "lifecycle.stop_grace_secs=2",
    ]


def test_apply_target_starts_one_task_of_a_huge_cluster_on_localhost(ws: Path) -> None:
    env = _conf(ws, free_port_base(4))
    overrides = _overrides(ws)
    planned = tfplan(ws, "plan", *overrides, "--json", "--no-save", env=env, check=True)
    plan = json.loads(planned.stdout)
    assert len(plan["tasks"]) == WORKERS + 1
    local = [t for t in plan["tasks"] if t["host"] == "local" and t["role"] == "worker"]
    target = f"worker/{local[0]['index']}"

    # the printed plan of the whole cluster: a summary, not 3,501 blocks of 230 KB
    whole = tfplan(ws, "plan", *overrides, "--no-save", env=env, check=True)
    assert len(whole.stdout) < 1024 * (WORKERS + 1)
    assert "3501 tasks will be created, summarised by role and by host" in whole.stdout
    assert "over Linux's 128 KiB limit for one environment variable" in whole.stdout

    narrowed = tfplan(ws, "plan", *overrides, "-target", target, env=env, check=True)
    out = narrowed.stdout
    assert "Plan: 1 to add, 0 to change, 0 to destroy." in out
    assert f'+ task "{target}" {{ host = "local" (127.0.0.1)' in out
    assert "Warning: Resource targeting is in effect" in out
    assert "3500 change(s) to other tasks are left out (3500 to add)" in out
    saved = json.loads((ws / ".tfplan" / "plan.json").read_text())
    assert saved["targets"] == [target] and [c["task"] for c in saved["changes"]] == [target]

    applied = tfplan(ws, "apply", "--detach", env=env, check=True)  # the saved, targeted plan
    assert "Apply complete! Tasks: 1 started, 0 changed, 0 stopped" in applied.stdout
    assert "Warning: Applied changes may be incomplete" in applied.stdout
    state = state_of(ws)
    assert [t["name"] for t in state["tasks"]] == [target]
    log = Path(state["tasks"][0]["log_path"])
    wait_until(lambda: "size" in log.read_text(), 60, "the task's report")
    report = json.loads(log.read_text().splitlines()[0])
    assert report["size"] > 200_000 and report["workers"] == WORKERS
    assert report["task"] == {"type": "worker", "index": int(target.split("/")[1])}
    assert report["file"] == str(ws / "work" / target.replace("/", "-") / "tf_config.json")

    # a saved plan is applied exactly as made: -target with it is refused
    refused = tfplan(ws, "apply", "-target", "ps/0", env=env)
    assert refused.returncode == 1 and "-target makes a new plan" in refused.stderr

    destroyed = tfplan(ws, "destroy", "-target", target, env=env, check=True)
    assert "Destroy complete! 1 targeted task(s) stopped, 0 left running" in destroyed.stdout
    assert state_of(ws)["tasks"] == []


def test_a_target_that_names_no_task_is_one_line_listing_valid_ones(ws: Path) -> None:
    env = _conf(ws, free_port_base(4))
    proc = tfplan(ws, "plan", *_overrides(ws), "-target", "worker/99999", env=env)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: -target: no task 'worker/99999' in the configuration")
    assert "e.g. ps/0, worker/0, worker/3499, or a role (worker) (3501 tasks)" in proc.stderr
    assert not (ws / ".tfplan").exists()


def test_show_task_prints_one_task_in_full_and_refuses_an_unknown_one(ws: Path) -> None:
    env = _conf(ws, free_port_base(4))
    tfplan(ws, "plan", *_overrides(ws), env=env, check=True)
    shown = tfplan(ws, "show", "--task", "worker/17", env=env, check=True)
    out = shown.stdout
    assert out.startswith("  # worker/17 will be created\n")
    assert '"type": "worker"' in out and '"index": 17' in out  # its TF_CONFIG, in full
    assert out.count(".invalid:") == WORKERS - 1  # every worker but the one on localhost
    assert "TF_CONFIG_FILE" not in out and 'TFPLAN_TASK = "worker/17"' in out
    as_json = json.loads(tfplan(ws, "show", "--task", "worker/17", "--json", env=env).stdout)
    assert as_json[0]["tf_config"]["task"] == {"type": "worker", "index": 17}
    assert as_json[0]["env"]["TFPLAN_TASK"] == "worker/17"
    unknown = tfplan(ws, "show", "--task", "worker/4000", env=env)
    assert unknown.returncode == 1 and unknown.stderr.count("\n") == 1
    assert "no task 'worker/4000' in the plan" in unknown.stderr and "worker/3499" in unknown.stderr


def test_destroy_target_stops_one_task_and_the_others_stay_supervised(ws: Path) -> None:
    port = free_port_base()
    overrides = [
        *base_overrides(ws, port),
        *fake_overrides(ws, steps="600", step_secs="0.1", worker_secs="120"),
    ]
    tfplan(ws, "apply", "--auto-approve", "--detach", *overrides, check=True)
    before = state_of(ws)
    pids = {t["name"]: t["handle"]["pid"] for t in before["tasks"]}
    supervisor = before["supervisor"]["pid"]
    destroyed = tfplan(ws, "destroy", "-target", "worker/1", check=True)
    out = destroyed.stdout
    assert "Destroy complete! 1 targeted task(s) stopped, 2 left running" in out
    assert "A background supervisor (pid" in out and "watches the other tasks again" in out
    assert not alive(pids["worker/1"]) and alive(pids["ps/0"]) and alive(pids["worker/0"])
    after = state_of(ws)
    assert sorted(t["name"] for t in after["tasks"]) == ["ps/0", "worker/0"]
    assert not alive(supervisor)  # taken over, so that it would not restart worker/1
    wait_until(lambda: alive(int(state_of(ws)["supervisor"]["pid"])), 30, "the new supervisor")
    # the plan now wants worker/1 back, and only it
    replan = tfplan(ws, "plan", "--detailed-exitcode", *overrides)
    assert replan.returncode == 2 and "Plan: 1 to add, 0 to change, 0 to destroy." in replan.stdout
    unknown = tfplan(ws, "destroy", "-target", "worker/7")
    assert unknown.returncode == 1 and "e.g. ps/0, worker/0 (2 tasks)" in unknown.stderr
    tfplan(ws, "destroy", check=True)
    assert not alive(pids["ps/0"]) and not alive(pids["worker/0"])
