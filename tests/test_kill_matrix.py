"""Restarts and teardown leave nothing behind, whichever of a task's processes dies first.

A task is a wrapper (the tracked process: its pid is the handle, it leads the task's process
group) and the program under it. For every role (ps, chief, worker, evaluator), over the local
and the SSH transport of the process backend, the test kills the program and leaves the
wrapper: before the task is restarted every process of its previous life must be gone; or kills
the wrapper and leaves the program: the program, still serving, is re-adopted, never replaced.
When the run ends (or is torn down, or destroyed) no process of any life, and no warm standby,
is left. tests/test_slurm_restarts.py does the same on Slurm.

The program stands in for a TensorFlow task where TensorFlow is not the point (tests/
test_standby.py does the same with the real recipes): it binds its task's port the way a gRPC
server does (no SO_REUSEPORT), so a previous life that still held the port would make the new
one exit 1, a permanent failure. It supports the warm standby contract (TFPLAN_STANDBY=1: wait
for SIGUSR1 before binding), trains until a stop file appears, and appends its pid to ``pids``
in its workdir, so the test knows every program of every life. No wait races a timeout: each
step waits for a line or a state the previous step caused.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from apply_helpers import (
    TENSORFLOW_PROGRAM,
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)
from chaos_helpers import ApplyRun
from test_apply_ssh import _conf_with_cluster, _host
from testbed import LoopbackSshd

pytestmark = pytest.mark.cluster
FULL = pytest.mark.full

PROGRAM = r"""
import json, os, pathlib, signal, socket, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
name = f"{task['type']}/{task['index']}"
stop = pathlib.Path(sys.argv[1])
jobs = config["cluster"]
if "spawn" in sys.argv[2:]:  # a child in the task's group, that outlives the program
    import subprocess
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open("pids", "a") as pids:
        pids.write(f"{child.pid}\n")
if os.environ.get("TFPLAN_STANDBY") == "1":
    gate = stop.parent / "standby_gate"  # a slow start: nothing blocked, nothing printed yet
    while gate.exists():
        time.sleep(0.05)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    print(f"standby for {name}: ready", flush=True)
    signal.sigwait({signal.SIGUSR1})
    print(f"standby for {name}: taking over", flush=True)
if task["type"] in jobs:  # the evaluator has no port
    host, port = jobs[task["type"]][task["index"]].rsplit(":", 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        server.bind((host, int(port)))
    except OSError as error:
        print(f"{name} cannot bind {host}:{port}: {error}", flush=True)
        sys.exit(1)
    server.listen()
with open("pids", "a") as pids:
    pids.write(f"{os.getpid()}\n")
print(f"{name} up pid {os.getpid()}", flush=True)
chief = task["type"] == "chief" or (
    "chief" not in jobs and task["type"] == "worker" and task["index"] == 0
)
step = 0
while task["type"] == "ps" or not stop.exists():
    step += 1
    if chief:
        print(f"step={step}", flush=True)
    time.sleep(0.05)
print(f"{name} done", flush=True)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))
    supervisor = _state(tmp_path).get("supervisor")
    if supervisor and alive(supervisor["pid"]):
        os.kill(supervisor["pid"], signal.SIGKILL)


def _state(ws: Path) -> dict[str, object]:
    path = ws / ".tfplan" / "t" / "state.json"
    return state_of(ws) if path.exists() else {}


def _standby_groups(ws: Path) -> list[int]:
    return [int(s["handle"]["pgid"]) for s in _state(ws).get("standbys", [])]  # type: ignore[attr-defined]


@dataclass
class Via:
    """How the tasks are started: the process backend's local or SSH transport."""

    host: str  # the host name tfplan reports ("restarted on HOST")
    args: list[str]  # overrides selecting the cluster
    env: dict[str, str]


@pytest.fixture(params=["local", pytest.param("ssh", marks=[pytest.mark.ssh, pytest.mark.full])])
def via(request: pytest.FixtureRequest, ws: Path) -> Via:
    if request.param == "local":
        return Via("localhost", [], {})
    sshd: LoopbackSshd = request.getfixturevalue("sshd_server")
    target = sshd.target()
    env = _conf_with_cluster(
        ws,
        "viassh",
        {
            "hosts": [_host(target, cpu_slots=8)],
            "ps": 1,
            "workers": 2,
            "ssh_known_hosts": str(sshd.known_hosts),
        },
    )
    return Via(target.name, ["cluster=viassh"], env)


LOCAL = Via("localhost", [], {})


def _args(
    ws: Path, *extra: str, via: Via = LOCAL, warm: bool = False, spawn: bool = False
) -> list[str]:
    """A cluster of every role: ps/0, chief/0, worker/0, worker/1 and evaluator/0; ``warm``: the
    program as a TensorFlow program, forked from the host's warm seed (else cold starts);
    ``spawn``: each program starts a child in its group that outlives it."""
    program = ws / "program.py"
    program.write_text((TENSORFLOW_PROGRAM if warm else "") + PROGRAM)
    return [
        *via.args,
        *base_overrides(ws, free_port_base()),
        "recipe=command",
        f"recipe.command='{sys.executable} {program} {ws / 'stop'}{' spawn' if spawn else ''}'",
        "cluster.chief=separate",
        "cluster.evaluator=true",
        "lifecycle.restart.backoff_secs=0.2",
        # the cold start: a wrapper and its program (a task forked from the host's warm seed
        # has no wrapper: test_a_forked_task_is_forked_again_and_nothing_is_left)
        *(() if warm else ("cluster.warm=false",)),
        *extra,
    ]


def _record(ws: Path, name: str) -> dict[str, object]:
    return next(t for t in state_of(ws)["tasks"] if t["name"] == name)


def _group(pgid: int) -> list[int]:
    """The live processes of a process group: not zombies, unless other threads of a zombie
    still run (they hold its files, its port among them, until the last one exits)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and (fields[0] != "Z" or int(fields[17]) > 1):
            found.append(int(entry.name))
    return found


def _programs(ws: Path) -> list[int]:
    """Every program of every life of every task (and standby) that got as far as starting."""
    return [int(p) for f in (ws / "work").glob("*/pids") for p in f.read_text().split()]


class Lives:
    """Every process group the experiment's tasks and standbys ever had, as seen in its state."""

    def __init__(self, ws: Path) -> None:
        self.ws = ws
        self.groups: set[int] = set()

    def note(self) -> None:
        self.groups.update(recorded_groups(self.ws))

    def assert_nothing_left(self) -> None:
        self.note()
        left = {g: _group(g) for g in self.groups if _group(g)}
        assert not left, f"process groups still alive: {left}"
        programs = [p for p in _programs(self.ws) if alive(p)]
        assert not programs, f"programs still alive: {programs}"


def _up(run: ApplyRun, task: str, after: int = 0) -> tuple[int, int]:
    """(line index, program pid) of the task's next 'up' line. The first one comes after the
    whole apply before it (composition, the hosts' checks over SSH, the starts): on a loaded
    machine (CI runs this part niced beside the test-bed part) that took over 60 s."""
    i = run.wait_for(rf"^{re.escape(task)}\s+\| {re.escape(task)} up pid \d+", 180, after)
    return i, int(run.lines[i][1].rsplit(" ", 1)[1])


def _kill(ws: Path, task: str, program: int, first: str) -> dict[str, object]:
    record = _record(ws, task)
    wrapper = int(record["handle"]["pid"])  # type: ignore[index]
    assert program in _group(wrapper)
    os.kill(wrapper if first == "tracked" else program, signal.SIGKILL)
    return record


# the fast tier runs one case of each test (--tier=full: every role, over SSH too)
ROLES = [
    pytest.param(victim, marks=() if victim == "ps/0" else FULL)
    for victim in ("ps/0", "chief/0", "worker/0", "evaluator/0")
]


@pytest.mark.parametrize("victim", ROLES)
def test_a_restart_starts_after_every_process_of_the_previous_life_is_gone(
    ws: Path, via: Via, victim: str
) -> None:
    """The program dies first, a child of it left in its group: the restart stops the child
    before the next life starts."""
    run = ApplyRun(ws, _args(ws, "lifecycle.ps_standby=false", via=via, spawn=True), env=via.env)
    lives = Lives(ws)
    up, program = _up(run, victim)
    run.wait_for(r"^chief/0\s+\| step=", 60)
    lives.note()
    before = _kill(ws, victim, program, "program")
    run.wait_for(rf"{re.escape(victim)}: restarted on {via.host}", 60, up)
    # the restart is written after the new life started, and that after the old one was gone
    assert _group(int(before["handle"]["pgid"])) == [], "a previous life outlived its restart"  # type: ignore[index]
    assert not alive(program)
    # the new life's 'up' line may come before or after the supervisor's 'restarted' line (two
    # streams): looked for after the first life's (seen under load: it came first, and a search
    # from 'restarted' waited for a line already past)
    _, again = _up(run, victim, up + 1)  # it could bind the port: nothing held it
    assert again != program
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    assert "cannot bind" not in run.text()
    lives.assert_nothing_left()


@pytest.mark.parametrize("victim", ROLES)
def test_a_program_whose_wrapper_died_is_readopted_not_restarted(
    ws: Path, via: Via, victim: str
) -> None:
    """The wrapper dies, the program serves on: tfplan says it re-adopted it, never restarts
    it (nor hands over to a standby), still streams its log, and when the stop file ends the
    run the program's own end (exit status unknown: a chief or evaluator ending so is started
    again, and its next life ends at once) lets the run succeed with nothing left."""
    standby = victim == "ps/0"
    run = ApplyRun(ws, _args(ws, f"lifecycle.ps_standby={standby}", via=via), env=via.env)
    lives = Lives(ws)
    up, program = _up(run, victim)
    run.wait_for(r"^chief/0\s+\| step=", 60)
    if standby:
        run.wait_for(r"^ps/0~standby\s+\| standby for ps/0: ready", 60)
    lives.note()
    wrapper = int(_record(ws, victim)["handle"]["pid"])  # type: ignore[index]
    _kill(ws, victim, program, "tracked")
    said = run.wait_for(
        rf"^tfplan\s+\| {re.escape(victim)}: its wrapper \(pid {wrapper}\) is gone but its "
        r"program runs on \(program pid \d+\): re-adopted, not restarted",
        60,
        up,
    )
    run.wait_for(r"^chief/0\s+\| step=", 60, said)  # training goes on meanwhile
    assert alive(program) and _record(ws, victim)["status"] == "running"
    status = json.loads(tfplan(ws, "status", "--json", env=via.env, check=True).stdout)
    row = next(r for r in status["tasks"] if r["task"] == victim)
    assert row["state"] == "running", row
    assert f"{victim}: restarted" not in run.text()
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    text = run.text()
    # the ps never ends by itself here: teardown stops it, never a restart. (A worker or chief
    # whose program ends on the stop file before the chief's success is seen may be restarted,
    # its status unknown: that is the documented rule, and which comes first is a race.)
    if victim == "ps/0":
        assert "ps/0: restarted" not in text, text[-3000:]
    assert "by its warm standby" not in text
    assert text.count(f"{victim}: its wrapper") == 1
    lives.assert_nothing_left()


@pytest.mark.parametrize("victim", ["ps/0", pytest.param("worker/0", marks=FULL)])
def test_a_forked_task_is_forked_again_and_nothing_is_left(ws: Path, victim: str) -> None:
    """Warm starts (the default): every task is forked from its host's warm seed (its pid is
    the program's own, no wrapper); killed, it is forked again, and when the run ends no
    program of any life and no seed is left, and the state holds no allocation."""
    run = ApplyRun(ws, _args(ws, warm=True))
    lives = Lives(ws)
    up, program = _up(run, victim)
    run.wait_for(r"^chief/0\s+\| step=", 60)
    handle = _record(ws, victim)["handle"]
    assert handle == {"pid": program, "pgid": program, "forked": True}, handle
    seeds = [int(s["pgid"]) for s in state_of(ws)["allocation"]["data"]["seeds"]]
    assert len(seeds) == 1 and _group(seeds[0]), "one live warm seed for the one host"
    lives.note()
    os.kill(program, signal.SIGKILL)
    run.wait_for(rf"{re.escape(victim)}: restarted on localhost", 60, up)
    _, again = _up(run, victim, up + 1)  # before or after 'restarted' (two streams)
    assert again != program and _record(ws, victim)["handle"]["forked"] is True
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    lives.assert_nothing_left()
    assert not _group(seeds[0]), "the warm seed outlived its experiment"
    assert state_of(ws)["allocation"] is None


def test_a_restart_waits_for_a_standby_that_is_still_starting(ws: Path) -> None:
    """The ps dies while its standby has printed nothing yet (it may not have blocked SIGUSR1:
    the go signal would end it, exit 138, seen on Slurm when a ps died a second after its
    standby started). The restart waits for the standby's first line, then hands over to it:
    one restart, no cold start, no standby killed by its own go signal."""
    gate = ws / "standby_gate"
    gate.touch()
    run = ApplyRun(ws, _args(ws, "lifecycle.ps_standby=true"))
    lives = Lives(ws)
    up, program = _up(run, "ps/0")
    # from the first line: the fake chief steps without the ps, so the standby (started at the
    # first step) can be announced before ps/0's own "up" line
    started = run.wait_for(r"ps/0: warm standby started on localhost", 60)
    standby = next(s for s in state_of(ws)["standbys"] if s["name"] == "ps/0~standby")
    lives.note()
    _kill(ws, "ps/0", program, "program")
    waiting = run.wait_for(r"ps/0: waiting for its warm standby to be ready", 60, started)
    assert _group(int(standby["handle"]["pgid"])), "the standby must not have been signalled"
    assert "by its warm standby" not in run.text()
    gate.unlink()
    taken = run.wait_for(r"ps/0: restarted on localhost by its warm standby", 60, waiting)
    _, again = _up(run, "ps/0", taken)
    record = _record(ws, "ps/0")
    assert record["handle"] == standby["handle"] and record["restarts"] == 1
    assert again in _group(int(standby["handle"]["pgid"]))
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    assert "exit code 138" not in run.text() and "starting a new process" not in run.text()
    lives.assert_nothing_left()


def test_a_ps_standby_takes_over_from_a_dead_program(ws: Path, via: Via) -> None:
    """The ps's program dies (a child of it left in its group), its warm standby becomes its
    next life (the same program, now bound to the port) once the previous life's every process
    is gone, its log becomes ps/0's (the previous one kept as task.log.0), `tfplan logs` shows
    the new life, a fresh standby starts once the chief steps again, and nothing is left after
    the run. (A dead wrapper is no takeover: its program is re-adopted, above.)"""
    run = ApplyRun(ws, _args(ws, "lifecycle.ps_standby=true", via=via, spawn=True), env=via.env)
    lives = Lives(ws)
    up, program = _up(run, "ps/0")
    ready = run.wait_for(r"^ps/0~standby\s+\| standby for ps/0: ready", 60)
    standby = next(s for s in state_of(ws)["standbys"] if s["name"] == "ps/0~standby")
    lives.note()
    before = _kill(ws, "ps/0", program, "program")
    taken = run.wait_for(rf"ps/0: restarted on {via.host} by its warm standby", 60, max(up, ready))
    assert _group(int(before["handle"]["pgid"])) == []  # type: ignore[index]
    _, again = _up(run, "ps/0", taken)
    record = _record(ws, "ps/0")
    assert record["handle"] == standby["handle"] and record["restarts"] == 1
    assert again in _group(int(standby["handle"]["pgid"]))  # the standby's program serves
    log = Path(str(record["log_path"]))
    assert f"ps/0 up pid {program}" in Path(f"{log}.0").read_text()
    logs = tfplan(ws, "logs", "ps/0", env=via.env, check=True).stdout
    assert "standby for ps/0: taking over" in logs and f"up pid {again}" in logs
    assert f"up pid {program}" not in logs
    run.wait_for(rf"ps/0: warm standby started on {via.host}", 60, taken)
    status = json.loads(tfplan(ws, "status", "--json", env=via.env, check=True).stdout)
    assert [(s["task"], s["state"]) for s in status["standbys"]] == [("ps/0~standby", "standby")]
    assert status["standbys"][0]["handle"] != standby["handle"]
    lives.note()
    (ws / "stop").touch()
    code = run.finish(timeout=120)
    assert code == 0, run.text()[-3000:]
    assert run.text().count("Stopped ps/0~standby") == 1  # when the chief succeeded
    assert "warm standby ended" not in run.text()  # stopping it is not a failure of it
    assert state_of(ws)["standbys"] == []
    lives.assert_nothing_left()


@pytest.mark.parametrize("victim", ["ps/0", pytest.param("chief/0", marks=FULL)])
def test_a_failed_run_stops_what_a_dead_program_left_and_the_standby(ws: Path, victim: str) -> None:
    """The victim's program dies, leaving a child in its group, and it may not restart: the
    run fails, and its teardown stops that child (recorded as failed), the warm standby and
    the others."""
    role = victim.split("/")[0]
    args = _args(ws, f"lifecycle.restart.{role}=Never", "lifecycle.ps_standby=true", spawn=True)
    run = ApplyRun(ws, args)
    lives = Lives(ws)
    _, program = _up(run, victim)
    run.wait_for(r"^ps/0~standby\s+\| standby for ps/0: ready", 60)
    lives.note()
    _kill(ws, victim, program, "program")
    run.wait_for(rf"{re.escape(victim)} failed .*: tearing down the cluster", 60)
    code = run.finish(timeout=120)
    assert code == 1 and "Training failed" in run.text()
    assert f"{victim} (left over by its failed life)" in run.text()
    assert "Stopped ps/0~standby" in run.text()
    assert not alive(program)
    lives.assert_nothing_left()


def test_destroy_stops_every_process_of_every_task_and_the_standbys(ws: Path) -> None:
    """A detached run: worker/1's program dies and it may not restart (the others go on); a
    child of it runs on, recorded as failed. destroy stops it, every other task and the
    standby."""
    args = _args(ws, "lifecycle.restart.worker=Never", "lifecycle.ps_standby=true", spawn=True)
    tfplan(ws, "apply", "--auto-approve", "--detach", *args, check=True)
    lives = Lives(ws)
    standby_log = ws / "work" / "ps-0" / "task.log.standby"
    wait_until(
        lambda: standby_log.exists() and "ready" in standby_log.read_text(), 60, "the standby"
    )
    lives.note()
    worker_log = ws / "work" / "worker-1" / "task.log"
    program = int(re.findall(r"up pid (\d+)", worker_log.read_text())[-1])
    child = int((ws / "work" / "worker-1" / "pids").read_text().split()[0])
    _kill(ws, "worker/1", program, "program")
    wait_until(lambda: _record(ws, "worker/1")["status"] == "failed", 60, "worker/1 failed")
    assert alive(child)  # the child outlived the program
    status = json.loads(tfplan(ws, "status", "--json", check=True).stdout)
    row = next(r for r in status["tasks"] if r["task"] == "worker/1")
    assert row["state"] == "failed"
    destroyed = tfplan(ws, "destroy", "--auto-approve", check=True).stdout
    assert "worker/1 (left over by its failed life)" in destroyed
    assert "Stopped ps/0~standby" in destroyed
    lives.assert_nothing_left()
    assert state_of(ws)["tasks"] == [] and state_of(ws)["standbys"] == []


def test_an_apply_that_changes_the_cluster_stops_the_standby(ws: Path) -> None:
    """A detached run with a warm standby; an apply that changes the cluster (every TF_CONFIG
    changes, so every task is replaced) stops the standby first: it would serve a cluster that
    is gone. A new one starts once the new cluster trains; destroy stops it."""
    args = _args(ws, "lifecycle.ps_standby=true")
    tfplan(ws, "apply", "--auto-approve", "--detach", *args, check=True)
    lives = Lives(ws)
    standby_log = ws / "work" / "ps-0" / "task.log.standby"
    wait_until(
        lambda: standby_log.exists() and "ready" in standby_log.read_text(), 60, "the standby"
    )
    lives.note()
    old = _standby_groups(ws)
    assert len(old) == 1
    changed = tfplan(
        ws, "apply", "--auto-approve", "--detach", *args, "cluster.workers=3", check=True
    ).stdout
    assert "Stopped ps/0~standby" in changed
    assert _group(old[0]) == []
    wait_until(
        lambda: bool(_standby_groups(ws)) and _standby_groups(ws) != old, 60, "a new standby"
    )
    lives.note()
    destroyed = tfplan(ws, "destroy", "--auto-approve", check=True).stdout
    assert "Stopped ps/0~standby" in destroyed
    lives.assert_nothing_left()
    assert state_of(ws)["standbys"] == []
