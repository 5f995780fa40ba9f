"""A newcomer's mistakes, through the CLI as they would make them: an exception in their own code
(a model factory of the built-in recipes, a program of ``recipe=command``) is shown with their
file and line in apply's stream, ``tfplan explain`` (and ``--json``) and ``tfplan status``, never
a frame of TensorFlow or tfplan; an apply whose preflight failed is explained by ``tfplan explain``
(no task ran to tell it); ``tfplan status`` of tasks that have all ended asks for no supervisor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    alive,
    base_overrides,
    example_with_data,
    free_port_base,
    kill_groups,
    recorded_groups,
    state_of,
    tfplan,
)
from test_apply_ssh import _conf_with_cluster

from tfplan.cli.cmd_status import _supervisor_line

NOT_USERS = ("site-packages", "dist-packages", "/recipes/", "tensorflow", "keras")


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def nothing_left_running(ws: Path) -> None:
    state = state_of(ws)
    running = [t["name"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]
    assert not running, f"still running: {running}"


def tfplan_line(stdout: str, task: str) -> str:
    """apply's own line explaining ``task``'s failure (``tfplan | worker/0 failed: ...``)."""
    said = [x for x in stdout.splitlines() if x.startswith("tfplan") and f"| {task} failed: " in x]
    assert said, stdout[-3000:]
    return said[-1]


def explained(ws: Path, task: str) -> tuple[dict[str, object], str]:
    """``tfplan explain TASK --json``'s row, and the plain text."""
    rows = json.loads(tfplan(ws, "explain", task, "--json", check=True).stdout)
    assert len(rows) == 1
    return rows[0], tfplan(ws, "explain", task, check=True).stdout


def status(ws: Path, task: str) -> tuple[dict[str, object], str]:
    data = json.loads(tfplan(ws, "status", "--json", check=True).stdout)
    row = next(r for r in data["tasks"] if r["task"] == task)
    return row, tfplan(ws, "status", check=True).stdout


def check_users_frame(frames: object, where: str) -> None:
    assert isinstance(frames, list) and frames, frames
    assert where in frames[-1], frames
    for frame in frames:
        assert not any(word in frame for word in NOT_USERS), frames


@pytest.fixture
def project(ws: Path) -> tuple[Path, int]:
    """examples/tabular as a user's project (its data written by its own script), its model
    factory raising KeyError on line N."""
    where = example_with_data("tabular", ws / "project")
    models = where / "tabular" / "models.py"
    head = "def build(units=32, classes=3, vocab=10, embed=4):\n"
    text = models.read_text()
    assert head in text
    # only in the tasks: the plan builds the model on this machine and refuses a factory that
    # raises there (tfplan/engine/plans.py), so this one fails where the plan cannot look
    raising = (
        "    if 'TFPLAN_TASK' in __import__('os').environ:\n        units = {}['hidden_units']\n"
    )
    models.write_text(text.replace(head, head + raising))
    line = models.read_text().splitlines().index("        units = {}['hidden_units']") + 1
    return where, line


@pytest.mark.cluster
@pytest.mark.full  # ~20 s of TensorFlow start-up per apply; the program test below is the fast one
def test_a_model_factory_that_raises_is_shown_with_the_users_file_and_line(
    project: tuple[Path, int],
) -> None:
    where, line = project
    args = [
        "apply",
        "--auto-approve",
        *base_overrides(where, free_port_base()),
        "cluster.workers=1",
        "model._target_=tabular.models.build",
        *("data=tfrecord", "data.train=data/train-*.tfrecord", "data.eval=data/eval.tfrecord"),
        "trainer.max_steps=20",
        "lifecycle.restart.worker=Never",
    ]
    applied = tfplan(where, *args, timeout=240)
    assert applied.returncode != 0, applied.stdout[-3000:]
    said = tfplan_line(applied.stdout, "worker/0")
    at = f"tabular/models.py:{line}"
    for words in ("KeyError: 'hidden_units'", at, "model._target_=tabular.models.build"):
        assert words in said, said
    assert "TFPLAN_DEBUG=1" in said
    nothing_left_running(where)

    row, text = explained(where, "worker/0")
    assert row["known"] == "user-code" and f"fix {at} in your project" in str(row["fix"])
    check_users_frame(row["frames"], at)
    assert (
        "KeyError" in text and at in text and "model._target_" in text and "TFPLAN_DEBUG=1" in text
    )
    row, text = status(where, "worker/0")
    assert "KeyError: 'hidden_units'" in str(row["explanation"])
    check_users_frame(row["frames"], at)
    assert "in your code (innermost last)" in text
    assert "supervisor: none (no task is running)" in text

    # the hint holds: TFPLAN_DEBUG=1 in apply's environment reaches the tasks, which print the
    # whole traceback (tests' tfplan() drops the variable, so this one runs it by hand)
    env = {**os.environ, "TFPLAN_CONF": str(CONF), "TFPLAN_DEBUG": "1"}
    debug = subprocess.run(
        [sys.executable, "-m", "tfplan", *args],
        cwd=where,
        env=env,
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert debug.returncode != 0
    assert "Traceback (most recent call last):" in debug.stdout, debug.stdout[-3000:]
    assert f'models.py", line {line}, in build' in debug.stdout
    nothing_left_running(where)


PROGRAM = """
import json, os
from helpers import settings

def main():
    print("step=1 loss=0.5", flush=True)
    settings(json.loads(os.environ["TF_CONFIG"]))

main()
"""

HELPERS = """
def settings(tf_config):
    return tf_config["no_such_key"]
"""


def test_a_program_that_raises_is_shown_with_the_users_file_and_line(ws: Path) -> None:
    """recipe=command: a plain Python traceback, the user's frames kept, the standard library's
    (json) never; apply, explain and status say the same. Then every task has ended: status
    asks for no supervisor."""
    (ws / "train.py").write_text(textwrap.dedent(PROGRAM))
    (ws / "helpers.py").write_text(textwrap.dedent(HELPERS))
    args = [
        *base_overrides(ws, free_port_base(10)),
        "recipe=command",
        f"recipe.command='{sys.executable} {ws / 'train.py'}'",
        "cluster.ps=0",
        "cluster.workers=1",
        "lifecycle.restart.worker=Never",
    ]
    applied = tfplan(ws, "apply", "--auto-approve", *args)
    assert applied.returncode == 1, applied.stdout[-3000:]
    at = f"{ws / 'helpers.py'}:3"
    said = tfplan_line(applied.stdout, "worker/0")
    assert "KeyError: 'no_such_key'" in said and at in said, said
    nothing_left_running(ws)

    row, text = explained(ws, "worker/0")
    assert row["known"] == "user-traceback" and row["error"] == "KeyError: 'no_such_key'"
    assert row["frames"] == [
        f"{ws / 'train.py'}:9 in <module>: main()",
        f'{ws / "train.py"}:7 in main: settings(json.loads(os.environ["TF_CONFIG"]))',
        f'{at} in settings: return tf_config["no_such_key"]',
    ]
    assert "in your code (innermost last)" in text and "tfplan logs worker/0" in text
    row, text = status(ws, "worker/0")
    assert "KeyError: 'no_such_key'" in str(row["explanation"]) and row["frames"]
    assert "supervisor: none (no task is running)" in text


def test_explain_after_a_failed_preflight_says_why_the_apply_failed(ws: Path) -> None:
    """No task ran, so none can tell: explain reads the reason the apply recorded."""
    args = [
        *base_overrides(ws, free_port_base(10)),
        "recipe=command",
        "recipe.command='{python} -c pass'",
        "cluster.ps=0",
        "cluster.python=/nonexistent",
    ]
    applied = tfplan(ws, "apply", "--auto-approve", *args)
    assert applied.returncode == 1 and "preflight failed" in applied.stderr
    text = tfplan(ws, "explain", check=True).stdout
    assert " ".join(text.split()) == (
        "No task of experiment t failed; its last apply did: preflight failed on 1 host(s): "
        "localhost: /nonexistent not found: install Python 3 or set the host's python"
    )
    rows = json.loads(tfplan(ws, "explain", "--json", check=True).stdout)
    assert [r["task"] for r in rows] == [None] and "/nonexistent not found" in rows[0]["cause"]


def test_explain_after_an_unreachable_host_says_why_the_apply_was_refused(ws: Path) -> None:
    """A host that refuses SSH fails apply while it looks for output_dir, before any state or
    record is written: the refusal kept in the workspace tells it."""
    closed = free_port_base(1)  # nothing listens there
    host = {"address": "127.0.0.1", "name": "gone", "ssh_port": closed, "executor": "ssh"}
    cluster = {
        "hosts": [{**host, "cpu_slots": 2}],
        "ps": 0,
        "workers": 1,
        "port_base": free_port_base(10),
        "workdir": str(ws / "work"),
        "output_dir": str(ws / "out"),
    }
    env = _conf_with_cluster(ws, "gone", cluster)
    args = ["cluster=gone", "experiment.id=t", "recipe=command", "recipe.command='python3 -c 1'"]
    applied = tfplan(ws, "apply", "--auto-approve", *args, env=env)
    assert applied.returncode == 1 and "preflight failed on 1 host(s): gone:" in applied.stderr
    reason = applied.stderr.strip().removeprefix("error: ")
    text = tfplan(ws, "explain", check=True, env=env).stdout
    assert " ".join(text.split()) == f"No task of experiment t failed; its last apply did: {reason}"
    rows = json.loads(tfplan(ws, "explain", "-e", "t", "--json", check=True, env=env).stdout)
    assert [r["cause"] for r in rows] == [reason]


def test_the_supervisor_line_fits_whether_tasks_run() -> None:
    assert _supervisor_line(None, running=False) == "supervisor: none (no task is running)"
    assert "tfplan watch" in _supervisor_line(None, running=True)
    gone = {"detached": True, "alive": False, "pid": 7, "host": "h"}
    assert _supervisor_line(gone, running=False) == (
        "supervisor: background pid 7 on h has ended (no task is running)"
    )
    assert "GONE" in _supervisor_line(gone, running=True)
