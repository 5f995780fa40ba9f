"""The step client (tfplan.backends.transports.seed_client): a task forked by its node's warm seed
while a step of its own stands for it, as the Slurm backend runs it. Real processes, no Slurm: the
client's stdout is a pipe, as a step's is; the seed is the real agent (importing json only)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import alive, wait_until

from tfplan.backends.transports import seed_agent, seed_client

PY = sys.executable
AGENT = seed_agent.__file__
CLIENT = seed_client.__file__

PROGRAM = """\
import json, os, signal, sys, time
def leave(signum, frame):
    print("asked to leave", flush=True)
    sys.exit(0)
signal.signal(signal.SIGUSR2, leave)
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                  "who": os.environ.get("WHO"), "only_seed": os.environ.get("ONLY_SEED"),
                  "cwd": os.getcwd()}), flush=True)
what = sys.argv[1]
if what == "exit":
    sys.exit(int(sys.argv[2]))
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def seed(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "_seed"
    folder.mkdir()
    proc = subprocess.Popen(
        [PY, AGENT, str(folder), "json"],
        env={**os.environ, "ONLY_SEED": "1"},
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (folder / "ready").exists(), 60, "the seed to be ready")
        yield folder
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _step(tmp: Path, folder: Path, *args: str) -> subprocess.Popen[str]:
    """The client as a step runs it: its stdout a pipe, its environment the task's."""
    (tmp / "program.py").write_text(PROGRAM)
    workdir = tmp / "work"
    workdir.mkdir(exist_ok=True)
    request = tmp / "request.json"
    request.write_text(
        json.dumps({"argv": [PY, str(tmp / "program.py"), *args], "workdir": str(workdir)})
    )
    env = {k: v for k, v in os.environ.items() if k != "ONLY_SEED"}
    return subprocess.Popen(
        [PY, "-S", CLIENT, str(folder), str(request)],
        env={**env, "WHO": "worker/0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _first(step: subprocess.Popen[str]) -> dict[str, object]:
    assert step.stdout is not None
    line = step.stdout.readline()
    assert line.startswith("{"), line + (step.stderr.read() if step.stderr else "")
    data: dict[str, object] = json.loads(line)
    return data


def test_the_seed_forks_the_program_whose_output_and_exit_status_are_the_steps(
    tmp_path: Path, seed: Path
) -> None:
    step = _step(tmp_path, seed, "exit", "7")
    seen = _first(step)
    out, err = step.communicate(timeout=30)
    seed_pid = int((seed / "ready").read_text().split()[0])
    # forked by the seed (no import of its own), in its own group, not the client itself
    assert seen["ppid"] == seed_pid and seen["pid"] == seen["pgid"] != step.pid
    # the environment is the step's, whole: what only the seed had does not leak in
    assert seen["who"] == "worker/0" and seen["only_seed"] is None
    assert seen["cwd"] == str(tmp_path / "work")
    assert step.returncode == 7, err
    assert "cold start" not in err
    assert (tmp_path / "request.exit").read_text().strip() == "7"  # the program's own record


def test_signals_the_step_gets_reach_the_program(tmp_path: Path, seed: Path) -> None:
    step = _step(tmp_path, seed, "wait")
    _first(step)
    step.send_signal(signal.SIGUSR2)  # an elastic worker asked to leave
    out, err = step.communicate(timeout=30)
    assert "asked to leave" in out and step.returncode == 0, err
    step = _step(tmp_path, seed, "wait")
    _first(step)
    step.terminate()
    step.communicate(timeout=30)
    assert step.returncode == 128 + signal.SIGTERM  # recorded by the seed: killed by TERM


def test_a_step_killed_outright_takes_its_program_with_it(tmp_path: Path, seed: Path) -> None:
    step = _step(tmp_path, seed, "wait")
    program = int(_first(step)["pid"])  # type: ignore[call-overload]
    step.kill()  # what scancel does to a step once its grace is over
    step.wait(timeout=30)
    wait_until(lambda: not alive(program), 30, "the program to end with its step")


def test_without_a_seed_the_step_starts_the_program_itself(tmp_path: Path) -> None:
    folder = tmp_path / "_seed"
    (folder / "requests").mkdir(parents=True)
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    (folder / "started").write_text(f"{dead.pid}\n")  # a seed that died while importing
    began = time.monotonic()
    step = _step(tmp_path, folder, "exit", "3")
    seen = _first(step)
    out, err = step.communicate(timeout=30)
    assert "the warm seed on this node is gone; a cold start" in err
    assert seen["pid"] == step.pid and step.returncode == 3  # the step's own process, exec'd
    assert time.monotonic() - began < 20  # not the import wait: the seed was known gone
