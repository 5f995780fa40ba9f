"""Hosts without a shared folder, end to end through `tfplan apply` (docs/per_host_output.md).

Each test host is an sshd in its own network and mount namespace where ``private_dir`` is an
empty tmpfs of its own (tests/testbed.py): the hosts share no output folder with each other nor
with the machine running tfplan, which sees the real (empty) folder. What a host holds there is
read inside its namespace. Waits are on observed log lines, never on speed. The fast tier runs
the TF1 case, a program of one's own and the refusals; allreduce and pss run in the full tier.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from apply_helpers import (
    alive,
    kill_groups,
    paced,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from chaos_helpers import ApplyRun, task_record
from test_apply_ssh import _conf_with_cluster, _host
from testbed import NetnsTestbed

pytestmark = pytest.mark.netns


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))
    state = tmp_path / ".tfplan" / "t" / "state.json"
    supervisor = json.loads(state.read_text()).get("supervisor") if state.exists() else None
    if supervisor and alive(supervisor["pid"]):  # a detached apply's background supervisor
        os.kill(supervisor["pid"], signal.SIGKILL)


def _cluster(
    bed: NetnsTestbed, ws: Path, folder: Path | None = None, **fields: object
) -> tuple[dict[str, str], Path]:
    """A cluster of the three namespaced hosts whose output_dir (and workdir) are in the
    private folder; returns the env selecting it and the output_dir."""
    tag = uuid.uuid4().hex[:8]  # the test bed lives for the session: one folder per test
    out = (folder or bed.private_dir) / f"out-{tag}"
    body: dict[str, object] = {
        "hosts": [_host(t, port_base=2400, cpu_slots=3) for t in bed.targets()],
        "ssh_known_hosts": str(bed.known_hosts),
        "workdir": str(bed.private_dir / f"work-{tag}"),
        "output_dir": str(out),
        **fields,
    }
    return _conf_with_cluster(ws, "three", body), out


def _record(ws: Path, experiment: str = "t") -> Path:
    return ws / ".tfplan" / experiment / "output"


def _checkpoints(files: list[str]) -> list[str]:
    return [f for f in files if f == "checkpoint" or ".ckpt-" in f]


def _metrics(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _nothing_left(ws: Path) -> None:
    state = state_of(ws)
    assert not [t["name"] for t in state["tasks"] if alive(t["handle"]["pid"])]


@pytest.mark.cluster
# Full tier: the fast tier's longest test (about 100 s quiet; a ps restart and a resume across
# three namespace hosts). Per-host output itself runs end to end in the fast tier below
# (test_a_program_of_ones_own_gets_its_chiefs_outputs_back[attached]); ps restarts in
# test_kill_matrix, resume in test_experiments.
@pytest.mark.full
def test_tf1_per_host_output_keeps_checkpoints_on_the_chief_and_copies_results_back(
    ws: Path, netns_testbed: NetnsTestbed
) -> None:
    """auto finds no shared folder: the evaluator runs beside the chief, result.json, eval/ and
    the summaries come back, a killed ps restores from the chief's checkpoints, the run resumes
    on a second apply (the checkpoints streamed through the chief: recipes/streamed_saver.py),
    a chief moved to another host is refused, and a checkpoint file lost on the chief's host
    stops the resume in one line naming the host and the file."""
    bed = netns_testbed
    env, out = _cluster(bed, ws, ps=2, workers=2, evaluator=True)
    args = [
        "cluster=three",
        "algo=hogwild",
        "experiment.id=t",
        "trainer.max_steps=600",
        "trainer.log_steps=50",
        "trainer.checkpoint_steps=100",
        "trainer.summary_steps=100",
        "trainer.eval_secs=0.5",
        "lifecycle.ps_grace_secs=2",
        "lifecycle.restart.backoff_secs=0.2",
        # paced: the ps is killed at step 200 and the 400 steps after it take seconds whatever
        # the machine's speed (1,500 unpaced steps kept that margin before, at 5x the CPU)
        *paced(0.05),
    ]
    planned = tfplan(ws, "plan", *args, env=env, check=True)
    # ps/0 on h1, ps/1 on h2, worker/0 (the chief) on h3, worker/1 on h1; the evaluator goes
    # beside the chief, not to the least used host (h2).
    assert "Plan: 5 to add" in planned.stdout
    run = ApplyRun(ws, args, env=env)
    run.wait_for(
        re.escape(
            f"output_dir {out} is not shared: h1, h2 and h3 each have their own (per-host "
            "output): checkpoints stay on the chief's host h3, where the evaluator runs; "
            f"result.json, eval/ and the summaries are copied to {_record(ws)} when the run ends"
        ),
        timeout=60,
    )
    # A parameter server dies once the chief has checkpointed: its restart finds the ps
    # uninitialised, and the chief restores them from its own host's checkpoint (a sharded
    # saver would have each ps read its shard on its own host, where there is none).
    fault = run.wait_step(200, timeout=180, task="worker/0")
    last_ckpt = max(_checkpoint_steps(bed.host_files(3, out)))
    assert last_ckpt >= 100
    os.killpg(task_record(ws, "ps/1")["handle"]["pgid"], signal.SIGKILL)
    recovered = run.wait_for(r"ps/1: restarted on h2", timeout=60, after=fault)
    assert run.finish(timeout=300) == 0, run.text()[-4000:]
    text = run.text()
    assert "Training complete" in text
    # no ps sees the chief's folder: the chief saves, streamed (recipes/streamed_saver.py)
    assert "checkpoints: the chief saves them into" in text and "64.0 MiB at a time" in text, text[
        -3000:
    ]
    steps_after = [s for name, s in run.steps(recovered + 1) if name == "worker/0"]
    assert steps_after and min(steps_after) >= last_ckpt, (steps_after[:3], last_ckpt)

    hosts = {t["name"]: t["host"] for t in state_of(ws)["tasks"]}
    assert hosts["worker/0"] == hosts["evaluator/0"] == "h3"
    # Checkpoints only on the chief's host; nothing in the real folder on this machine.
    on_chief = bed.host_files(3, out)
    assert "checkpoint" in on_chief and _checkpoint_steps(on_chief), on_chief
    assert not _checkpoints(bed.host_files(1, out)) and not _checkpoints(bed.host_files(2, out))
    assert not out.exists()
    # The outputs came back to the workspace, beside the record; the checkpoints did not.
    record = _record(ws)
    result = json.loads((record / "result.json").read_text())
    assert result["global_step"] >= 600
    assert f"Result ({record / 'result.json'}, copied from h3)" in text
    assert _metrics(record / "eval" / "metrics.jsonl")[-1]["global_step"] >= 600
    assert list(record.glob("events.out.tfevents.*")) and list(record.glob("eval/events.*"))
    assert not _checkpoints([p.name for p in record.rglob("*") if p.is_file()])
    assert (record / "tfplan" / "logs" / "worker-0.log").exists()
    _nothing_left(ws)

    # Resume: the chief's host still holds the checkpoint of the last step.
    # tfplan names the step of the checkpoint it finds on the chief's host: read it there.
    step = max(_checkpoint_steps(bed.host_files(3, out)))
    assert step >= 600
    more = [a.replace("max_steps=600", "max_steps=700") for a in args]
    resumed = tfplan(ws, "apply", "--auto-approve", *more, env=env, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
    assert f"resuming experiment t from its checkpoint at step {step}" in resumed.stdout
    again = json.loads((record / "result.json").read_text())
    assert again["global_step"] >= 700
    assert _metrics(record / "eval" / "metrics.jsonl")[-1]["global_step"] >= 700
    _nothing_left(ws)

    # The hosts in another order put the chief on h1: refused before anything starts.
    conf = ws / "conf" / "cluster" / "three.yaml"
    ordered = conf.read_text()
    body = yaml.safe_load(ordered)
    body["hosts"] = list(reversed(body["hosts"]))
    conf.write_text(yaml.safe_dump(body, sort_keys=False))
    step = max(_checkpoint_steps(bed.host_files(3, out)))
    assert step >= 700
    moved = tfplan(ws, "apply", "--auto-approve", *more, env=env)
    assert moved.returncode == 1
    assert moved.stderr.count("\n") == 1, moved.stderr
    assert (
        f"experiment 't' has checkpoints (step {step}) on h3, where its chief "
        "ran, but the chief is now planned on h1" in moved.stderr
    ), moved.stderr
    assert all(t["status"] != "running" for t in state_of(ws)["tasks"])
    _nothing_left(ws)

    # A file of the newest checkpoint gone from the chief's host (the hosts in their order
    # again): the resume's restore stops the chief in one line naming the host and the file
    # (exit 2: nothing to retry), and nothing is left running.
    conf.write_text(ordered)
    data = [f for f in bed.host_files(3, out) if f.startswith(f"model.ckpt-{step}.data-")]
    bed.remove_on_host(3, out / data[-1])
    further = [a.replace("max_steps=600", "max_steps=800") for a in args]
    broken = tfplan(ws, "apply", "--auto-approve", *further, env=env, timeout=300)
    assert broken.returncode != 0, broken.stdout[-3000:]
    said = broken.stdout + broken.stderr
    assert (
        f"checkpoint file {out / data[-1]} is missing on the chief's host {bed.addresses[2]}"
        in said
    ), said[-3000:]
    _nothing_left(ws)


def _checkpoint_steps(files: list[str]) -> list[int]:
    return sorted(
        int(m.group(1)) for f in files if (m := re.fullmatch(r"model\.ckpt-(\d+)\.index", f))
    )


@pytest.mark.cluster
@pytest.mark.full
def test_allreduce_per_host_output_only_the_chief_writes_and_resume_broadcasts(
    ws: Path, netns_testbed: NetnsTestbed
) -> None:
    """MultiWorkerMirroredStrategy across three hosts with no shared folder: only the chief
    writes checkpoints (the other workers never touch output_dir), and a second apply resumes
    from the chief's checkpoint, broadcast to the others."""
    bed = netns_testbed
    env, out = _cluster(bed, ws, ps=0, workers=3, evaluator=True)
    args = [
        "cluster=three",
        "algo=allreduce",
        "experiment.id=t",
        "trainer.max_steps=120",
        "trainer.log_steps=40",
        "trainer.checkpoint_steps=40",
        "trainer.eval_secs=0.5",
    ]
    first = tfplan(ws, "apply", "--auto-approve", *args, env=env, timeout=400)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr
    assert "checkpoints stay on the chief's host h1, where the evaluator runs" in first.stdout
    hosts = {t["name"]: t["host"] for t in state_of(ws)["tasks"]}
    assert hosts == {"worker/0": "h1", "worker/1": "h2", "worker/2": "h3", "evaluator/0": "h1"}
    assert _checkpoint_steps(bed.host_files(1, out))[-1] == 120
    assert bed.host_files(2, out) == [] and bed.host_files(3, out) == []
    record = _record(ws)
    result = json.loads((record / "result.json").read_text())
    assert (result["algo"], result["global_step"], result["replicas"]) == ("allreduce", 120, 3)
    assert _metrics(record / "eval" / "metrics.jsonl")[-1]["global_step"] == 120
    _nothing_left(ws)

    more = [a.replace("max_steps=120", "max_steps=160") for a in args]
    second = tfplan(ws, "apply", "--auto-approve", *more, env=env, timeout=400)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr
    assert "resuming experiment t from its checkpoint at step 120" in second.stdout
    assert "resuming from the checkpoint of step=120" in second.stdout
    assert json.loads((record / "result.json").read_text())["global_step"] == 160
    assert bed.host_files(2, out) == [] and bed.host_files(3, out) == []
    _nothing_left(ws)


@pytest.mark.cluster
@pytest.mark.full
def test_pss_per_host_output_the_coordinator_reads_and_writes_the_checkpoints(
    ws: Path, netns_testbed: NetnsTestbed
) -> None:
    """ParameterServerStrategy's variables live on the ps; their checkpoints are written and
    read on the chief's (the coordinator's) host only."""
    bed = netns_testbed
    env, out = _cluster(bed, ws, ps=1, workers=2, chief="separate", evaluator=True)
    args = [
        "cluster=three",
        "algo=pss",
        "experiment.id=t",
        "trainer.max_steps=160",
        "trainer.log_steps=40",
        "trainer.checkpoint_steps=80",
        "trainer.eval_secs=0.5",
    ]
    proc = tfplan(ws, "apply", "--auto-approve", *args, env=env, timeout=400)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr
    hosts = {t["name"]: t["host"] for t in state_of(ws)["tasks"]}
    chief = int(hosts["chief/0"][1])
    assert hosts["evaluator/0"] == hosts["chief/0"]
    assert _checkpoint_steps(bed.host_files(chief, out))[-1] >= 160
    for other in {1, 2, 3} - {chief}:
        assert not _checkpoints(bed.host_files(other, out)), other
    result = json.loads((_record(ws) / "result.json").read_text())
    assert result["algo"] == "pss" and result["global_step"] >= 160
    _nothing_left(ws)


# A program of the user's own (recipe=command) that follows the per-host rules: the chief alone
# writes its outputs and checkpoints; another task's files stay on its host.
BYO = r"""
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
out = os.environ["TFPLAN_OUTPUT_DIR"]
os.makedirs(out, exist_ok=True)
if task["type"] == "ps":
    while True:
        time.sleep(0.2)
if task["type"] == "worker" and task["index"] == 0:
    for name in ("ckpt-7.index", "ckpt-7.data-00000-of-00001", "checkpoint"):
        open(os.path.join(out, name), "w").write("weights")
    open(os.path.join(out, "metrics.jsonl"), "w").write('{"step": 7}\n')
    json.dump({"global_step": 7, "accuracy": 0.5}, open(os.path.join(out, "result.json"), "w"))
    print("step=7 chief done", flush=True)
else:
    open(os.path.join(out, "%s-%d.txt" % (task["type"], task["index"])), "w").write("mine")
"""


@pytest.mark.parametrize(
    "detach", [False, pytest.param(True, marks=pytest.mark.full)], ids=["attached", "detached"]
)
def test_a_program_of_ones_own_gets_its_chiefs_outputs_back(
    ws: Path, netns_testbed: NetnsTestbed, detach: bool
) -> None:
    bed = netns_testbed
    env, out = _cluster(bed, ws, ps=1, workers=2, output_mode="per_host")
    script = ws / "byo.py"
    script.write_text(BYO)
    args = [
        "cluster=three",
        "experiment.id=t",
        "recipe=command",
        f"recipe.command='python3 {script}'",
        "lifecycle.ps_grace_secs=1",
    ]
    flags = ["--auto-approve", "--detach"] if detach else ["--auto-approve"]
    proc = tfplan(ws, "apply", *flags, *args, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert (
        f"output_dir {out}: per-host output (cluster.output_mode=per_host): checkpoints stay "
        "on the chief's host h2" in proc.stdout
    )
    record = _record(ws)
    if detach:  # the background supervisor ends the run and copies the outputs back
        match = re.search(r"a background supervisor \(pid (\d+)", proc.stdout)
        assert match, proc.stdout[-2000:]
        pid = int(match.group(1))
        wait_until(lambda: not alive(pid), 60, "the background supervisor to end")
        runs = json.loads((record / "tfplan" / "experiment.json").read_text())["runs"]
        assert runs[-1]["status"] == "succeeded"
    else:
        assert f"Result ({record / 'result.json'}, copied from h2)" in proc.stdout
    got = sorted(p.name for p in record.iterdir() if p.is_file())
    assert got == ["metrics.jsonl", "result.json"]
    assert (record / "tfplan" / "logs" / "worker-0.log").read_text() == "step=7 chief done\n"
    assert bed.host_files(3, out) == ["worker-1.txt"]  # never copied: it is not the chief's
    assert not out.exists()
    _nothing_left(ws)


@pytest.mark.parametrize(
    "case", ["shared_mode_on_private_folders", "one_host_without_the_mount", "evaluator_away"]
)
def test_folders_that_fit_no_mode_are_one_line_errors_and_start_nothing(
    ws: Path, netns_testbed: NetnsTestbed, case: str
) -> None:
    bed = netns_testbed
    if case == "shared_mode_on_private_folders":
        env, _ = _cluster(bed, ws, ps=1, workers=2, output_mode="shared")
        expected = {"h2", "h3"}
        words = "does not see the shared dir of the other hosts"
        fix = "or set cluster.output_mode=per_host"
    elif case == "one_host_without_the_mount":  # h1 and h2 share it, h3 has its own there
        env, _ = _cluster(bed, ws, folder=bed.unshared_dir, ps=1, workers=2)
        expected = {"h3"}
        words = "sees its own"
        fix = "or set cluster.output_mode=per_host"
    else:  # ps/0 fills h1, worker/0 (the chief) fills h2: the evaluator can only go to h3
        hosts = [
            _host(t, port_base=2400, cpu_slots=n)
            for t, n in zip(bed.targets(), (1, 1, 3), strict=True)
        ]
        env, _ = _cluster(bed, ws, ps=1, workers=2, evaluator=True, hosts=hosts)
        expected = {"h3"}
        words = "evaluator/0 is planned here and worker/0 on h2, but the hosts share no output"
        fix = "give h2 a free cpu slot (it then runs there), mount output_dir on every host"
    script = ws / "byo.py"
    script.write_text(BYO)
    args = [
        "cluster=three",
        "experiment.id=t",
        "recipe=command",
        f"recipe.command='python3 {script}'",
    ]
    proc = tfplan(ws, "apply", "--auto-approve", *args, env=env)
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"error: preflight failed on {len(expected)} host(s): ")
    assert words in proc.stderr and fix in proc.stderr, proc.stderr
    for host in {"h1", "h2", "h3"}:
        assert (f"{host}: " in proc.stderr) == (host in expected), proc.stderr
    state = ws / ".tfplan" / "t" / "state.json"
    assert not state.exists() or json.loads(state.read_text())["tasks"] == []
