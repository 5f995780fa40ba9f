"""Per-task command templates (recipe=command with {placeholders}): flag-style programs run
unchanged. Unit tests of the filling, the plan showing each task's command, and real programs
through apply: a flag-style TensorFlow program whose parameter server joins forever and whose
non-chief worker may still wait when the chief is done: the job still ends cleanly."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
)

from tfplan.errors import ConfigError
from tfplan.planning.commands import (
    PLACEHOLDERS,
    TaskFacts,
    fill_command,
    placeholders_in,
    split_command,
    with_python,
)

PROGRAMS = Path(__file__).resolve().parent / "programs"
CLUSTER = {"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2223"]}


def test_every_placeholder_is_filled_per_task() -> None:
    words = ["--" + name + "={" + name + "}" for name in PLACEHOLDERS]
    assert placeholders_in(words) == list(PLACEHOLDERS)
    worker = fill_command(words, TaskFacts("worker", 1, CLUSTER, 2223, False, "/out"))
    assert worker == (
        "--job_name=worker",
        "--task_index=1",
        "--ps_hosts=10.0.0.1:2222",
        "--worker_hosts=10.0.0.2:2222,10.0.0.3:2223",
        "--chief_hosts=",
        "--task_address=10.0.0.3:2223",
        "--port=2223",
        "--num_ps=1",
        "--num_workers=2",
        "--is_chief=false",
        "--output_dir=/out",
        "--python=python3",
    )
    evaluator = dict(
        w.split("=", 1)
        for w in fill_command(words, TaskFacts("evaluator", 0, CLUSTER, None, False, "/o"))
    )
    assert evaluator["--task_address"] == "" and evaluator["--port"] == ""
    chief = dict(
        w.split("=", 1)
        for w in fill_command(words, TaskFacts("worker", 0, CLUSTER, 2222, True, "/o"))
    )
    assert chief["--is_chief"] == "true"


def test_literal_braces_and_words_that_never_split() -> None:
    words = ["-c", "print({{'a': 1}})", "--hosts={worker_hosts}"]
    assert placeholders_in(words) == ["worker_hosts"]
    filled = fill_command(words, TaskFacts("worker", 0, CLUSTER, 2222, True, "/o"))
    assert filled == ("-c", "print({'a': 1})", "--hosts=10.0.0.2:2222,10.0.0.3:2223")


@pytest.mark.parametrize("word", ["--x={nosuch}", "--x={job_name!r}", "--x={port:>5}", "--x={"])
def test_unknown_or_malformed_placeholders_are_one_line_errors(word: str) -> None:
    with pytest.raises(ConfigError) as error:
        placeholders_in([word])
    message = str(error.value)
    assert message.startswith("recipe.command: ") and "\n" not in message
    if "nosuch" in word:
        assert "unknown placeholder {nosuch}" in message and "{job_name}" in message


def test_plan_shows_each_tasks_resolved_command(tmp_path: Path) -> None:
    command = "python t.py --job_name={job_name} --task_index={task_index} --ps_hosts={ps_hosts}"
    unquoted = tfplan(tmp_path, "plan", "recipe=command", f"recipe.command={command}")
    assert unquoted.returncode == 1 and unquoted.stderr.count("\n") == 1
    assert "quote a value holding spaces, '=' or braces" in unquoted.stderr
    planned = tfplan(tmp_path, "plan", "recipe=command", f"recipe.command='{command}'", check=True)
    out = planned.stdout
    assert '"python t.py --job_name=ps --task_index=0 --ps_hosts=127.0.0.1:2222"' in out
    assert '"python t.py --job_name=worker --task_index=1 --ps_hosts=127.0.0.1:2222"' in out
    bad = tfplan(tmp_path, "plan", "recipe=command", "recipe.command='python t.py --x={jobname}'")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1
    assert "recipe.command: unknown placeholder {jobname}; use one of {job_name}" in bad.stderr


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


@pytest.mark.cluster
def test_a_flag_style_tensorflow_program_runs_and_the_job_ends_cleanly(ws: Path) -> None:
    program = PROGRAMS / "low_level_flags.py"
    command = (
        f"{sys.executable} {program} --ps_hosts={{ps_hosts}} --worker_hosts={{worker_hosts}} "
        f"--job_name={{job_name}} --task_index={{task_index}} --steps=300 --logdir={{output_dir}}"
    )
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        "recipe=command",
        f"recipe.command='{command}'",
        timeout=300,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr
    assert "ps/0         | ps/0 joining" in out
    assert "worker/0     | worker/0 done" in out and "Training complete" in out
    assert "never listened on its port" not in out  # every task joined: nothing to explain
    # the ps never exits by itself (server.join()): the lifecycle stopped it after the chief
    # (with worker/1 too when that one had not finished its last step yet on a busy machine)
    stopping = [line for line in out.splitlines() if "training is over; stopping" in line]
    assert stopping and "ps/0" in stopping[0], out[-3000:]
    state = state_of(ws)
    assert not [t["name"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
    ps = next(t for t in state["tasks"] if t["name"] == "ps/0")
    assert ps["status"] == "stopped"
    assert "--job_name=ps" in ps["command"] and "--ps_hosts=127.0.0.1:" in " ".join(ps["command"])
    assert (ws / "out" / "checkpoint").exists()  # --logdir={output_dir} reached the chief


def test_python_is_the_hosts_interpreter_and_fills_in_alone_for_late_templates() -> None:
    words = split_command("{python} train.py --ps={ps_hosts} --literal={{x}}")
    facts = TaskFacts("worker", 0, CLUSTER, 2222, True, "/o", "/opt/tf215/bin/python")
    assert fill_command(words, facts)[0] == "/opt/tf215/bin/python"
    late = with_python(words, "/opt/tf215/bin/python")
    assert late[0] == "/opt/tf215/bin/python"
    assert fill_command(late, facts) == fill_command(words, facts)
    assert late[2] == "--ps={ps_hosts}" and late[3] == "--literal={{x}}"
