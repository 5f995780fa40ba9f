"""Every entry of the catalogue of known failures, provoked for real and explained in one line.

Each test makes the real failure happen (real TensorFlow, real processes, the real kernel's
out-of-memory killer under a memory cgroup) through the CLI as a user would, then checks the
one line in apply's stream, in ``tfplan explain`` (and its ``--json``) and in ``tfplan status
--json``. Nothing here writes a log by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    BackgroundTfplan,
    alive,
    base_overrides,
    free_port_base,
    kill_groups,
    recorded_groups,
    small_tmpfs,
    state_of,
    tfplan,
)
from cgroup_helpers import memory_cgroup
from test_apply_ssh import _conf_with_cluster, _host
from testbed import NetnsTestbed

from tfplan.diagnosis.catalogue import CATALOGUE

REPO = Path(__file__).resolve().parent.parent
PROGRAMS = REPO / "tests" / "programs"


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def program(ws: Path, name: str, code: str) -> Path:
    path = ws / name
    path.write_text(textwrap.dedent(code))
    return path


def command_args(ws: Path, command: str, workers: int = 1, *extra: str) -> list[str]:
    return [
        *base_overrides(ws, free_port_base(10)),
        "recipe=command",
        f"recipe.command='{command}'",
        "cluster.ps=0",
        f"cluster.workers={workers}",
        "lifecycle.restart.worker=Never",
        "lifecycle.restart.chief=Never",
        *extra,
    ]


def explained(ws: Path, task: str) -> dict[str, object]:
    """``tfplan explain TASK --json``'s row (and the plain form says the same line)."""
    data = json.loads(tfplan(ws, "explain", task, "--json", check=True).stdout)
    assert len(data) == 1
    plain = tfplan(ws, "explain", task, check=True).stdout
    assert data[0]["line"] in " ".join(plain.split()), plain
    row: dict[str, object] = data[0]
    return row


def status_row(ws: Path, task: str) -> dict[str, object]:
    data = json.loads(tfplan(ws, "status", "--json", check=True).stdout)
    row: dict[str, object] = next(r for r in data["tasks"] if r["task"] == task)
    return row


def check_explained(ws: Path, applied_stdout: str, task: str, known: str, words: str) -> None:
    """The apply stream, ``explain`` and ``status`` all say entry ``known``'s line, which holds
    ``words``."""
    line = f"{task} failed: "
    said = [x for x in applied_stdout.splitlines() if line in x]
    assert said and words in said[-1], applied_stdout[-3000:]
    row = explained(ws, task)
    assert row["known"] == known and words in str(row["line"]), row
    assert words in str(status_row(ws, task)["explanation"])


def test_every_entry_is_documented() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md").read_text()
    for entry in CATALOGUE:
        assert f"`{entry.id}`" in text, f"docs/troubleshooting.md lacks {entry.id}"


def test_a_missing_flag_is_named_with_the_placeholders_that_fill_it(ws: Path) -> None:
    script = program(
        ws,
        "flags.py",
        """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--job_name", required=True)
        parser.add_argument("--task_index", type=int, required=True)
        parser.parse_args()
        """,
    )
    applied = tfplan(ws, "apply", "--auto-approve", *command_args(ws, f"{sys.executable} {script}"))
    assert applied.returncode == 1
    check_explained(ws, applied.stdout, "worker/0", "missing-flag", "--job_name, --task_index")
    assert "{job_name}" in str(explained(ws, "worker/0")["fix"])


@pytest.mark.skipif(os.geteuid() != 0, reason="a memory cgroup needs root (CI runs as root)")
def test_a_task_killed_by_the_out_of_memory_killer(ws: Path) -> None:
    """The task puts itself in a memory cgroup of 64 MiB and allocates 400 MiB: the kernel
    kills it (SIGKILL) and records it; tfplan finds the record and says so."""
    with memory_cgroup(64 * 2**20) as procs:
        hog = program(
            ws,
            "hog.py",
            f"""
            import os
            with open({str(procs)!r}, "w") as f:
                f.write(str(os.getpid()))
            print("allocating", flush=True)
            block = bytearray(400 * 2**20)
            print("never here", len(block))
            """,
        )
        applied = tfplan(
            ws, "apply", "--auto-approve", *command_args(ws, f"{sys.executable} {hog}")
        )
        assert applied.returncode == 1
        check_explained(ws, applied.stdout, "worker/0", "oom-killed", "out-of-memory killer")
        row = explained(ws, "worker/0")
        assert "host localhost at RSS" in str(row["cause"]) and "MiB" in str(row["cause"])


@pytest.mark.full  # the fast tier: the diagnosis path: the missing-flag and OOM entries
def test_a_program_that_never_reads_tf_config_is_told_apart(ws: Path) -> None:
    """Nothing fails: each task trains alone and ends by itself. What shows from outside is
    that no task ever listened on the port the plan gave it."""
    script = program(
        ws,
        "alone.py",
        """
        import os, sys, time
        gate = sys.argv[1]
        for step in range(1, 1000000):
            print(f"step={step} loss={1 / step:.3f}", flush=True)
            if os.path.exists(gate):
                break
            time.sleep(0.2)
        """,
    )
    gate = ws / "go"
    args = command_args(ws, f"{sys.executable} {script} {gate}", 2, "cluster.ps=1")
    run = BackgroundTfplan(ws, "apply", "--auto-approve", *args)
    # The supervisor looks at the ports every second (LOOK_EVERY_SECS): the tasks run on until
    # each has printed 40 steps of 0.2 s, eight looks' worth, before they are let go.
    deadline = time.monotonic() + 180
    while not all(
        sum(1 for x in run.lines if x.startswith(f"{task} ") and "| step=" in x) >= 40
        for task in ("ps/0", "worker/0", "worker/1")
    ):
        assert run.proc.poll() is None and time.monotonic() < deadline, run.lines[-30:]
        time.sleep(0.2)
    gate.touch()
    out = "\n".join(run.finish(timeout=120))
    for task in ("ps/0", "worker/0", "worker/1"):
        said = [x for x in out.splitlines() if f"tfplan       | {task} ended: " in x]
        assert said and "never listened on its port" in said[0], out[-3000:]
        row = explained(ws, task)
        assert row["known"] == "tf-config-ignored" and "TF_CONFIG" in str(row["fix"])
        assert "never listened" in str(status_row(ws, task)["explanation"])


@pytest.mark.full
def test_a_program_that_uses_tf_estimator(ws: Path) -> None:
    script = program(
        ws,
        "estimator.py",
        """
        import tensorflow as tf
        config = tf.estimator.RunConfig()
        """,
    )
    applied = tfplan(ws, "apply", "--auto-approve", *command_args(ws, f"{sys.executable} {script}"))
    assert applied.returncode == 1
    check_explained(ws, applied.stdout, "worker/0", "estimator-removed", "removed in 2.16")


@pytest.fixture(scope="session")
def legacy_python() -> str:
    """A second interpreter with TensorFlow 2.15 and tensorflow-estimator (the full tier's
    set-up makes it once, from the registry, with the versions its lock file names)."""
    subprocess.run(["bash", str(REPO / "scripts" / "setup_legacy_tf.sh")], check=True)
    return str(REPO / ".venv-tf215" / "bin" / "python")


@pytest.mark.full
def test_an_estimator_program_trains_on_a_second_interpreter_with_tensorflow_2_15(
    ws: Path, legacy_python: str
) -> None:
    """The fix the estimator-removed entry names, proven: seed 000's kind of program
    (train_and_evaluate; chief, worker, ps and evaluator from TF_CONFIG) trains under apply on an
    interpreter of its own, and the plan's preflight and apply show which TensorFlow each host
    runs."""
    script = PROGRAMS / "estimator_train_and_evaluate.py"
    args = [
        *base_overrides(ws, free_port_base(10)),
        "recipe=command",
        f"recipe.command='{{python}} {script} {{output_dir}}/model 300'",
        "cluster.ps=1",
        "cluster.workers=1",
        "cluster.chief=separate",
        "cluster.evaluator=true",
        f"cluster.python={legacy_python}",
        # Estimator's evaluator can read a checkpoint the chief is still writing ("not a valid
        # checkpoint", exit 1: seen once in a full tier); a restart reads it whole
        "lifecycle.restart.evaluator=OnFailure",
    ]
    ready = f"ready: localhost: {legacy_python} (Python "
    planned = tfplan(ws, "plan", "--preflight", "--no-save", *args, check=True)
    said = [x for x in planned.stdout.splitlines() if ready in x]
    assert said and said[0].endswith("tensorflow 2.15.1"), planned.stdout[-2000:]
    applied = tfplan(ws, "apply", "--auto-approve", *args)
    assert applied.returncode == 0, applied.stdout[-3000:]
    said = [x for x in applied.stdout.splitlines() if ready in x]
    assert said and said[0].endswith("tensorflow 2.15.1"), applied.stdout[-3000:]
    for role in ("chief", "worker", "ps", "evaluator"):
        assert f"tensorflow 2.15.1, task {{'index': 0, 'type': '{role}'}}" in applied.stdout
    scored = [x for x in applied.stdout.splitlines() if "evaluated: global_step=300" in x]
    assert scored, applied.stdout[-3000:]
    assert float(scored[0].rsplit("accuracy=", 1)[1]) > 0.9
    assert (ws / "out" / "model" / "model.ckpt-300.index").exists()


@pytest.mark.full
def test_a_loss_that_becomes_nan_names_the_step_and_the_learning_rate(ws: Path) -> None:
    args = [
        *base_overrides(ws, free_port_base(10)),
        "algo=hogwild",
        "algo.lr=1e12",
        "trainer.max_steps=200",
        "lifecycle.restart.worker=Never",
    ]
    applied = tfplan(ws, "apply", "--auto-approve", *args, timeout=300)
    assert applied.returncode == 1
    failed = [t for t in ("worker/0", "worker/1") if f"{t} failed: the loss" in applied.stdout]
    assert failed, applied.stdout[-3000:]
    check_explained(ws, applied.stdout, failed[0], "nan-loss", "algo.lr")
    assert " at step " in str(explained(ws, failed[0])["cause"])


@pytest.fixture
def small_disk(ws: Path) -> Iterator[Path]:
    """``ws/out`` (the experiment's cluster.output_dir) on a tmpfs of 400 KiB: room for the
    launcher's record and the chief's graph and first summaries, not for its first checkpoint.
    Unmounted at the end, once every task is gone."""
    with small_tmpfs(ws / "out", "400k", ws) as where:
        yield where


@pytest.mark.full
def test_an_output_folder_whose_disk_fills_is_named_with_its_free_space(
    ws: Path, small_disk: Path
) -> None:
    """The chief's checkpoint write fails with ENOSPC (TensorFlow's ResourceExhaustedError, a
    TensorFlow frame last in the log): the line names the folder, what is free there now, and
    the key to change."""
    args = [
        *base_overrides(ws, free_port_base(10)),
        "trainer.max_steps=50",
        "trainer.checkpoint_steps=20",
        "lifecycle.restart.worker=Never",
    ]
    applied = tfplan(ws, "apply", "--auto-approve", *args, timeout=300)
    assert applied.returncode == 1
    assert "No space left on device" in (ws / "work" / "worker-0" / "task.log").read_text()
    words = f"worker/0 could not write to {small_disk}: its disk is full ("
    check_explained(ws, applied.stdout, "worker/0", "disk-full", words)
    row = explained(ws, "worker/0")
    assert "free now)" in str(row["cause"]) and "cluster.output_dir" in str(row["fix"])
    state = state_of(ws)
    assert not [t["name"] for t in state["tasks"] if alive(int(t["handle"]["pid"]))]


SAVER = """
import os, sys
import tensorflow as tf
v1 = tf.compat.v1
v1.disable_eager_execution()
v1.get_variable(sys.argv[1], shape=[4], initializer=v1.zeros_initializer())
train = v1.assign_add(v1.train.get_or_create_global_step(), 1)
output = os.environ["TFPLAN_OUTPUT_DIR"]
with v1.train.MonitoredTrainingSession(checkpoint_dir=output, save_checkpoint_steps=5) as sess:
    for _ in range(10):
        sess.run(train)
print("done", sys.argv[1])
"""


@pytest.mark.full
def test_checkpoints_of_another_model_in_the_output(ws: Path) -> None:
    """The user's program trains a model into the experiment's output, then a changed program
    (another variable) is applied as the same experiment: it cannot restore. (The built-in
    recipes never get there: the plan refuses another model's checkpoints up front.)"""
    script = program(ws, "saver.py", SAVER)
    first = command_args(ws, f"{sys.executable} {script} alpha")
    tfplan(ws, "apply", "--auto-approve", *first, timeout=300, check=True)
    second = command_args(ws, f"{sys.executable} {script} beta")
    applied = tfplan(ws, "apply", "--auto-approve", *second, timeout=300)
    assert applied.returncode == 1
    check_explained(ws, applied.stdout, "worker/0", "foreign-checkpoint", "another model")
    assert str(ws / "out") in str(explained(ws, "worker/0")["cause"])


@pytest.mark.full
def test_gpus_assigned_on_a_host_without_them_are_refused_before_anything_starts(
    ws: Path,
) -> None:
    args = [*base_overrides(ws, free_port_base(10)), "cluster.hosts.0.gpus=1"]
    applied = tfplan(ws, "apply", "--auto-approve", *args, timeout=300)
    assert applied.returncode == 1
    assert applied.stderr.count("\n") == 1
    assert "1 GPU(s) assigned on this host but TensorFlow sees 0" in applied.stderr
    assert "set the host's gpus to 0" in applied.stderr
    assert (
        not (ws / ".tfplan" / "t" / "state.json").exists()
        or '"tasks": []' in (ws / ".tfplan" / "t" / "state.json").read_text()
    )


MULTI_WORKER_FIT = """
import numpy as np
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.random.rand(64, 4).astype("float32")
y = np.random.rand(64, 1).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()
model.fit(data, epochs=2, steps_per_epoch=4, verbose=2)
print("trained", flush=True)
"""


@pytest.mark.full
def test_keras3_multiworker_fit_fails_and_trains_with_legacy_keras(ws: Path) -> None:
    """TensorFlow's own multi-worker Keras tutorial: under Keras 3 both workers fail, and the
    line says which key to set; with it set, the same program trains."""
    script = program(ws, "mwms.py", MULTI_WORKER_FIT)
    command = f"{sys.executable} {script}"
    args = command_args(ws, command, 2)
    applied = tfplan(ws, "apply", "--auto-approve", *args, timeout=300)
    assert applied.returncode == 1
    check_explained(
        ws, applied.stdout, "worker/0", "keras3-multiworker-fit", "recipe.legacy_keras=true"
    )
    tfplan(ws, "destroy", "--auto-approve", check=True)
    fixed = tfplan(ws, "apply", "--auto-approve", *args, "recipe.legacy_keras=true", timeout=300)
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr
    assert "trained" in (ws / "work" / "worker-1" / "task.log").read_text()


@pytest.mark.full
@pytest.mark.netns
def test_a_worker_that_cannot_reach_its_parameter_server(
    ws: Path, netns_testbed: NetnsTestbed
) -> None:
    """Three namespace hosts, one task each: ps/0 on h1, the workers on h2 and h3, whose
    routes to h1 are dropped (a blackhole route). The chief names the ps, its address and its
    own host."""
    hosts = [_host(t, cpu_slots=1) for t in netns_testbed.targets()]
    env = _conf_with_cluster(
        ws,
        "cut",
        {
            "hosts": hosts,
            "ps": 1,
            "workers": 2,
            "port_base": 2500,
            "ssh_known_hosts": str(netns_testbed.known_hosts),
            "workdir": str(ws / "work"),
            "output_dir": str(netns_testbed.shared_dir / "cut"),
        },
    )
    ps_address = hosts[0]["address"]
    cut = [(ns, f"{ps_address}/32") for ns in netns_testbed.namespaces[1:]]
    for ns, target in cut:
        subprocess.run(["ip", "-n", ns, "route", "add", "blackhole", target], check=True)
    try:
        args = [
            "cluster=cut",
            "experiment.id=t",
            "trainer.peer_wait_secs=8",
            "trainer.max_steps=50",
            "lifecycle.restart.worker=Never",
            "lifecycle.restart.chief=Never",
            "lifecycle.ps_grace_secs=1",
        ]
        applied = tfplan(ws, "apply", "--auto-approve", *args, env=env)
        assert applied.returncode == 1
        words = f"worker/0 on h2 cannot reach ps/0 at {ps_address}:2500"
        check_explained(ws, applied.stdout, "worker/0", "peer-unreachable", words)
    finally:
        for ns, target in cut:
            subprocess.run(["ip", "-n", ns, "route", "del", "blackhole", target], check=False)
