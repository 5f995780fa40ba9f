"""One watcher per host: every followed log and every exit through one agent process.

Real tasks (``sh``/Python programs started by the local transport), the real agent
(``watch_agent.py`` run by the host's Python), real signals. Waits are on events (lines
arriving, streams ending), never on how fast the machine is.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_transports import is_dead, py_task, wait_until

from tfplan.backends.transports import hostwatch
from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.pool import transport_for
from tfplan.backends.transports.specs import HostTarget, Launched, LaunchSpec

PY = sys.executable


@pytest.fixture
def local() -> Iterator[Transport]:
    transport = transport_for(HostTarget(name="local", address="127.0.0.1", python=PY))
    started: list[int] = []
    original = transport.start

    def tracked(spec: LaunchSpec) -> object:
        launched = original(spec)
        started.append(launched.pgid)
        return launched

    transport.start = tracked  # type: ignore[method-assign]
    yield transport
    for pgid in started:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    transport.close()


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry))
    return found


def talker(tmp: Path, name: str, lines: int, then: str = "") -> LaunchSpec:
    """A task that prints ``lines`` numbered lines, then runs ``then`` (e.g. waits)."""
    code = f"for i in range({lines}):\n    print('{name}', i)\n{then}"
    return py_task(tmp, name, code)


def test_many_tasks_share_one_agent_and_lines_never_cross(local: Transport, tmp_path: Path) -> None:
    before = set(children_of(os.getpid()))
    specs = [talker(tmp_path, f"t{i}", 50, "import time\ntime.sleep(60)\n") for i in range(12)]
    launched = [local.start(spec) for spec in specs]
    got: dict[str, list[str]] = {spec.name: [] for spec in specs}
    streams = [
        local.stream_log(spec.log_path, task.pid, got[spec.name].append)
        for spec, task in zip(specs, launched, strict=True)
    ]
    wait_until(lambda: all(len(lines) == 50 for lines in got.values()))
    for name, lines in got.items():
        assert lines == [f"{name} {i}" for i in range(50)]
    # tfplan added one process for all twelve: the agent (the tasks are the others)
    tasks = {t.pid for t in launched}
    helpers = [pid for pid in children_of(os.getpid()) if pid not in tasks | before]
    assert len(helpers) == 1, helpers
    # running tasks are answered from the agent's events: no round trip to the host
    heard = local.heard_status([t.pid for t in launched], [None] * len(launched))
    assert heard is not None and all(info.alive for info in heard.values())
    assert not any(s.done for s in streams)


def test_an_exit_ends_its_stream_at_once_and_status_reads_its_exit_code(
    local: Transport, tmp_path: Path
) -> None:
    spec = py_task(tmp_path, "quits", "import time\nprint('bye')\ntime.sleep(60)\n")
    other = py_task(tmp_path, "stays", "import time\ntime.sleep(60)\n")
    task, stays = local.start(spec), local.start(other)
    ended = threading.Event()
    lines: list[str] = []
    stream = local.stream_log(spec.log_path, task.pid, lines.append, exit_file=None)
    local.stream_log(other.log_path, stays.pid, lambda line: None)
    stream.add_done_callback(ended.set)
    wait_until(lambda: lines == ["bye"])
    assert not stream.done
    os.killpg(task.pgid, signal.SIGTERM)
    assert ended.wait(10), "the exit was not reported"
    exit_file = str(Path(spec.workdir) / "exit_code")
    # an ended task is read the ordinary way: its exit code and what its group left
    assert local.heard_status([task.pid], [exit_file]) is None
    info = local.status([task.pid], exit_files=[exit_file])[task.pid]
    assert not info.alive and info.exit_code == 143
    # the other task is still followed, and still heard
    heard = local.heard_status([stays.pid], [None])
    assert heard is not None and heard[stays.pid].alive


def test_a_task_already_gone_when_followed_ends_with_its_whole_log(
    local: Transport, tmp_path: Path
) -> None:
    spec = talker(tmp_path, "quick", 3)
    task = local.start(spec)
    wait_until(lambda: is_dead(task.pid))
    lines: list[str] = []
    stream = local.stream_log(spec.log_path, task.pid, lines.append)
    assert stream.join(10)
    assert lines == ["quick 0", "quick 1", "quick 2"]


def test_a_last_line_without_newline_is_delivered(local: Transport, tmp_path: Path) -> None:
    spec = py_task(tmp_path, "partial", "import sys\nsys.stdout.write('no newline')\n")
    task = local.start(spec)
    lines: list[str] = []
    assert local.stream_log(spec.log_path, task.pid, lines.append).join(10)
    assert lines == ["no newline"]


def _followed_sleeper(local: Transport, tmp_path: Path, name: str) -> tuple[Launched, Any]:
    """(launched, stream) of a task that printed one line and sleeps, followed (no adoption)."""
    spec = py_task(tmp_path, name, "import time\nprint('one')\ntime.sleep(60)\n")
    task = local.start(spec)
    lines: list[str] = []
    stream = local.stream_log(spec.log_path, task.pid, lines.append)
    wait_until(lambda: lines == ["one"])
    return task, stream


def test_without_inotify_or_pidfds_the_agent_polls_in_one_process(
    local: Transport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TFPLAN_WATCH_POLL", "1")
    task, stream = _followed_sleeper(local, tmp_path, "slow")
    os.killpg(task.pgid, signal.SIGTERM)
    assert stream.join(10)


@pytest.mark.parametrize("mode", ["events", "polling"])
def test_a_program_that_outlives_its_wrapper_is_followed_on_until_it_ends(
    local: Transport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    """Re-adoption: the wrapper killed, its program serving on is no end; its log keeps
    coming, the host's watcher answers "running" for it, and the end is its program's."""
    if mode == "polling":
        monkeypatch.setenv("TFPLAN_WATCH_POLL", "1")
    go = tmp_path / "go"
    code = (
        "import os, pathlib, time\nprint('serving', os.getpid())\n"
        f"while not pathlib.Path({str(go)!r}).exists():\n    time.sleep(0.05)\n"
        "print('after its wrapper')\n"
    )
    spec = py_task(tmp_path, "ps", code)
    task = local.start(spec)
    lines: list[str] = []
    exit_file = str(Path(spec.workdir) / "exit_code")
    stream = local.stream_log(spec.log_path, task.pid, lines.append, exit_file, adopt=True)
    wait_until(lambda: len(lines) == 1)
    program = int(lines[0].split()[1])
    assert program != task.pid and program in children_of(task.pid)
    os.kill(task.pid, signal.SIGKILL)  # the wrapper only
    wait_until(lambda: is_dead(task.pid))

    def readopted() -> bool:
        heard = local.heard_status([task.pid], [exit_file])
        return heard is not None and heard[task.pid].state.startswith("re-adopted")

    wait_until(readopted)
    info = local.heard_status([task.pid], [exit_file])[task.pid]  # type: ignore[index]
    assert info.alive and f"pid {program}" in info.state and not stream.done
    go.touch()
    assert stream.join(10), "the program's end was not reported"
    assert lines[-1] == "after its wrapper" and is_dead(program)


def test_without_adoption_a_killed_wrapper_ends_the_stream(
    local: Transport, tmp_path: Path
) -> None:
    task, stream = _followed_sleeper(local, tmp_path, "forked")
    os.kill(task.pid, signal.SIGKILL)  # the wrapper only: its program sleeps on
    assert stream.join(10)


def test_a_silent_agent_is_not_trusted_and_the_host_is_asked(
    local: Transport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hostwatch, "STALE_SECS", 1.5)
    spec = py_task(tmp_path, "sleeper", "import time\ntime.sleep(60)\n")
    task = local.start(spec)
    before = set(children_of(os.getpid()))
    local.stream_log(spec.log_path, task.pid, lambda line: None)
    assert local.heard_status([task.pid], [None]) is not None
    agent = [pid for pid in children_of(os.getpid()) if pid not in before]
    assert len(agent) == 1
    os.kill(agent[0], signal.SIGSTOP)  # the host went silent: no more heartbeats
    try:
        wait_until(lambda: local.heard_status([task.pid], [None]) is None)
        info = local.status([task.pid])[task.pid]  # asked with ps: still running
        assert info.alive and info.cpu_percent is not None
    finally:
        os.kill(agent[0], signal.SIGCONT)


def test_closing_the_transport_ends_the_agent_and_leaves_the_tasks(
    local: Transport, tmp_path: Path
) -> None:
    spec = py_task(tmp_path, "lives", "import time\ntime.sleep(60)\n")
    task = local.start(spec)
    before = set(children_of(os.getpid()))
    local.stream_log(spec.log_path, task.pid, lambda line: None)
    agent = [pid for pid in children_of(os.getpid()) if pid not in before]
    assert len(agent) == 1
    local.close()
    wait_until(lambda: is_dead(agent[0]))
    assert not is_dead(task.pid)


def test_a_host_without_python_falls_back_to_a_follower_per_task(tmp_path: Path) -> None:
    target = HostTarget(name="nopy", address="127.0.0.1", python=str(tmp_path / "no-python"))
    transport = transport_for(target)
    spec = talker(tmp_path, "plain", 2)
    spec = LaunchSpec(spec.name, ("sh", "-c", "echo a; echo b"), {}, spec.workdir, spec.log_path)
    try:
        task = transport.start(spec)
        lines: list[str] = []
        assert transport.stream_log(spec.log_path, task.pid, lines.append).join(10)
        assert lines == ["a", "b"]
        assert transport.watch_problem is not None
    finally:
        transport.close()


def test_many_groups_stop_in_one_round_trip(local: Transport, tmp_path: Path) -> None:
    polite = [
        local.start(py_task(tmp_path, f"p{i}", "import time\ntime.sleep(60)\n")) for i in range(5)
    ]
    stubborn = local.start(
        py_task(
            tmp_path,
            "stubborn",
            "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\ntime.sleep(60)\n",
        )
    )
    log = tmp_path / "stubborn" / "logs" / "task.log"
    wait_until(lambda: "ready" in log.read_text())
    done = local.start(py_task(tmp_path, "done", "pass\n"))
    wait_until(lambda: is_dead(done.pid))
    groups = [(t.pid, t.pgid) for t in (*polite, stubborn, done)]
    results = local.stop_groups(groups, grace_secs=0.5)
    outcomes = {pgid: r.outcome for pgid, r in results.items()}  # type: ignore[union-attr]
    assert [outcomes[t.pgid] for t in polite] == ["terminated"] * 5
    assert outcomes[stubborn.pgid] == "killed"
    assert outcomes[done.pgid] == "none"
    assert all(is_dead(pid) for pid, _ in groups)
