"""`apply --detach` leaves a background supervisor: it restarts a killed task exactly as an
attached apply would, ends the run by itself, shows in `status`, is followed (not duplicated) by
`watch`, is stopped by `destroy`; and when it dies, `status` says so and `watch` takes over.

The tasks are a small program the test controls through a stop file (the chief trains until
the file appears), so no check races the length of a run.
"""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    BackgroundTfplan,
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
    wait_until,
)

pytestmark = pytest.mark.cluster

PROGRAM = r"""
import json, os, pathlib, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
stop = pathlib.Path(sys.argv[1])
name = f"{task['type']}/{task['index']}"
print(f"{name} up", flush=True)
if task["type"] == "ps":
    while True:
        time.sleep(0.1)
step = 0
while not stop.exists():
    step += 1
    if task["index"] == 0:
        print(f"step={step}", flush=True)
    time.sleep(0.05)
print(f"{name} done", flush=True)
"""


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))
    record = _supervisor(tmp_path)
    if record and alive(record["pid"]):
        os.kill(record["pid"], signal.SIGKILL)


def _supervisor(ws: Path) -> dict[str, object] | None:
    path = ws / ".tfplan" / "t" / "state.json"
    return json.loads(path.read_text())["supervisor"] if path.exists() else None  # type: ignore[no-any-return]


def _args(ws: Path) -> list[str]:
    program = ws / "program.py"
    program.write_text(PROGRAM)
    return [
        *base_overrides(ws, free_port_base()),
        "recipe=command",
        f"recipe.command='{sys.executable} {program} {ws / 'stop'}'",
        "lifecycle.restart.backoff_secs=0.2",
    ]


def _task(ws: Path, name: str) -> dict[str, object]:
    return next(t for t in state_of(ws)["tasks"] if t["name"] == name)


def test_a_detached_run_recovers_a_fault_and_ends_by_itself(ws: Path) -> None:
    applied = tfplan(ws, "apply", "--auto-approve", "--detach", *_args(ws), check=True)
    assert "Detached: a background supervisor (pid" in applied.stdout
    wait_until(lambda: (_supervisor(ws) or {}).get("detached") is True, 30, "the record")
    record = _supervisor(ws)
    assert record is not None and alive(int(record["pid"]))  # type: ignore[call-overload]
    status = json.loads(tfplan(ws, "status", "--json", check=True).stdout)
    assert status["supervisor"]["alive"] and status["supervisor"]["detached"]
    # a fault while nobody's terminal is attached: the background supervisor restarts it
    victim = _task(ws, "worker/1")
    wait_until(lambda: "up" in Path(str(victim["log_path"])).read_text(), 60, "worker/1 up")
    os.killpg(int(victim["handle"]["pgid"]), signal.SIGKILL)  # type: ignore[index]
    wait_until(lambda: _task(ws, "worker/1")["restarts"] == 1, 60, "the restart")
    restarted = _task(ws, "worker/1")
    assert restarted["handle"]["pid"] != victim["handle"]["pid"]  # type: ignore[index]
    assert alive(int(restarted["handle"]["pid"]))  # type: ignore[index]
    # watch follows the live supervisor instead of starting a second one
    watch = BackgroundTfplan(ws, "watch")
    wait_until(lambda: watch.saw("worker/0     | step="), 60, "watch to follow the chief's log")
    (ws / "stop").write_text("")  # training ends: the supervisor ends the run by itself
    out = "\n".join(watch.finish(timeout=120))
    assert watch.proc.returncode == 0, out
    assert f"is supervised by pid {record['pid']}" in out, out
    assert "worker/0     | worker/0 done" in out  # it followed the logs to the end
    wait_until(lambda: _supervisor(ws) is None, 60, "the supervisor to finish and clear itself")
    wait_until(lambda: not alive(int(record["pid"])), 30, "the supervisor process to exit")  # type: ignore[call-overload]
    state = state_of(ws)
    assert {t["status"] for t in state["tasks"]} <= {"succeeded", "stopped"}
    assert not [t for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
    record_file = json.loads((ws / "out" / "tfplan" / "experiment.json").read_text())
    assert record_file["runs"][-1]["status"] == "succeeded"


def test_destroy_stops_the_background_supervisor_first(ws: Path) -> None:
    tfplan(ws, "apply", "--auto-approve", "--detach", *_args(ws), check=True)
    record = _supervisor(ws)
    assert record is not None
    destroyed = tfplan(ws, "destroy", check=True)
    assert f"taking over from the supervisor (pid {record['pid']})" in destroyed.stdout
    assert not alive(int(record["pid"]))  # type: ignore[call-overload]
    assert state_of(ws)["tasks"] == [] and _supervisor(ws) is None


def test_when_the_supervisor_dies_status_says_so_and_watch_takes_over(ws: Path) -> None:
    tfplan(ws, "apply", "--auto-approve", "--detach", *_args(ws), check=True)
    wait_until(
        lambda: "step=" in Path(str(_task(ws, "worker/0")["log_path"])).read_text(), 60, "a step"
    )
    record = _supervisor(ws)
    assert record is not None
    os.kill(int(record["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    wait_until(lambda: not alive(int(record["pid"])), 30, "the supervisor to die")  # type: ignore[call-overload]
    status = tfplan(ws, "status", check=True)
    assert f"pid {record['pid']}" in status.stdout and "is GONE" in status.stdout
    assert (
        json.loads(tfplan(ws, "status", "--json", check=True).stdout)["supervisor"]["alive"]
        is False
    )
    watch = BackgroundTfplan(ws, "watch")
    wait_until(
        lambda: (_supervisor(ws) or {}).get("pid") == watch.proc.pid, 60, "watch to take over"
    )
    (ws / "stop").write_text("")
    out = "\n".join(watch.finish(timeout=120))
    assert watch.proc.returncode == 0, out
    assert "Watching 3 running task(s)" in out and "Training complete" in out


def _on_terminal(ws: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    """``tfplan ARGS`` on a pseudo-terminal, as a user types at it: (the process, the master)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TFPLAN_CONF": str(CONF), "TERM": "dumb", "COLUMNS": "200"}
    env.pop("TFPLAN_DEBUG", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tfplan", *args],
        cwd=ws,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


def _read_until(master: int, seen: bytearray, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text.encode() not in seen:
        assert time.monotonic() < deadline, f"no {text!r} in:\n{seen.decode(errors='replace')}"
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the program ended
                chunk = b""
            assert chunk, f"ended before {text!r}:\n{seen.decode(errors='replace')}"
            seen.extend(chunk)


def _a_change_waiting_for_approval(
    ws: Path, task: str, logged: str
) -> tuple[dict[str, object], subprocess.Popen[bytes], int, bytearray]:
    """A detached job whose ``task`` has logged ``logged``, and `tfplan apply` of a change that
    replaces every task, on a terminal, at its approval prompt: (the task's record, the apply,
    the terminal, what it printed so far)."""
    args = _args(ws)
    tfplan(ws, "apply", "--auto-approve", "--detach", *args, check=True)
    record = _task(ws, task)
    wait_until(lambda: logged in Path(str(record["log_path"])).read_text(), 60, f"{task}: {logged}")
    proc, master = _on_terminal(ws, "apply", *args, "+recipe.env.CHANGED=1")
    seen = bytearray()
    _read_until(master, seen, "Enter a value:", 120)
    return record, proc, master, seen


def test_a_plan_whose_state_moved_on_while_it_waited_for_approval_is_made_again(ws: Path) -> None:
    """The background supervisor restarts a killed worker while the user reads the plan (every
    task to be replaced): the state's serial moved on, and the same changes, planned again, go
    ahead instead of a stale-plan error that would also leave the job unsupervised."""
    victim, proc, master, seen = _a_change_waiting_for_approval(ws, "worker/1", "up")
    try:
        assert b"3 to add, 0 to change, 3 to destroy" in seen or b"must be replaced" in seen
        os.killpg(int(victim["handle"]["pgid"]), signal.SIGKILL)  # type: ignore[index]
        wait_until(lambda: _task(ws, "worker/1")["restarts"] == 1, 60, "the supervisor's restart")
        os.write(master, b"yes\n")
        _read_until(master, seen, "Apply complete!", 120)
    finally:
        (ws / "stop").write_text("")
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")
    os.close(master)
    out = seen.decode(errors="replace")
    assert "the state moved on while the plan waited for approval" in out, out
    assert "planned again, the same changes" in out and "stale" not in out, out
    assert "Apply complete! Tasks: 3 started" in out, out


def test_a_plan_whose_changes_moved_on_while_it_waited_for_approval_is_asked_for_again(
    ws: Path,
) -> None:
    """The job is destroyed (by a colleague, say) while the user reads a plan that replaces
    its running tasks: planned again, the changes are other ones (nothing runs to replace: every
    task is created), so the new plan is shown and asked for again; a second "yes" applies it."""
    _, proc, master, seen = _a_change_waiting_for_approval(ws, "worker/0", "step=")
    try:
        first = bytes(seen)
        assert b"3 to add, 0 to change, 3 to destroy" in first, first.decode(errors="replace")
        tfplan(ws, "destroy", "--auto-approve", check=True)
        os.write(master, b"yes\n")
        _read_until(master, seen, "here they are", 120)
        del seen[: len(first)]
        _read_until(master, seen, "Enter a value:", 120)
        assert b"3 to add, 0 to change, 0 to destroy" in seen, seen.decode(errors="replace")
        os.write(master, b"yes\n")
        _read_until(master, seen, "Apply complete!", 120)
    finally:
        (ws / "stop").write_text("")
    _read_until(master, seen, "Training complete", 120)
    assert proc.wait(timeout=120) == 0, seen.decode(errors="replace")
    os.close(master)
    assert "Apply complete! Tasks: 3 started, 0 changed, 0 stopped" in seen.decode(), seen
