"""`tfplan apply` end to end through the real CLI: real processes on loopback, really stopped.

Lifecycle cases use a tiny TF_CONFIG program (recipe=command: the bring-your-own-script path),
so they take a second; one test runs the built-in TensorFlow recipe to its last step.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    FOREVER,
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

from tfplan.engine.store import StateStore


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    """A user's folder; whatever the test leaves running is killed by recorded process group."""
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _pids(state: dict[str, object]) -> list[int]:
    return [int(t["handle"]["pid"]) for t in state["tasks"]]  # type: ignore[index, union-attr]


@pytest.mark.cluster
def test_apply_trains_builtin_recipe_to_the_last_step_and_leaves_nothing(ws: Path) -> None:
    port = free_port_base()
    overrides = [
        *base_overrides(ws, port),
        "trainer.max_steps=120",
        "trainer.log_steps=40",
        "trainer.checkpoint_steps=60",
        "trainer.keep_checkpoints=2",
    ]
    planned = tfplan(ws, "plan", *overrides, check=True)
    assert "Plan: 3 to add, 0 to change, 0 to destroy." in planned.stdout
    # the default MLP's 9,610 floats and the step: 38,448 bytes, two kept
    assert (
        "Checkpoints: at least 37.5 KiB each (the variables), 2 kept "
        f"(trainer.keep_checkpoints): 75.1 KiB in {ws / 'out'}" in " ".join(planned.stdout.split())
    ), planned.stdout
    applied = tfplan(ws, "apply", check=True)  # the saved plan, exactly
    out = applied.stdout
    assert "Apply complete! Tasks: 3 started" in out
    assert "Training complete" in out
    assert "worker/0     | step=" in out  # prefixed, streamed log lines
    result = json.loads((ws / "out" / "result.json").read_text())
    assert result["global_step"] >= 120
    assert 0.0 < result["accuracy"] <= 1.0
    state = state_of(ws)
    statuses = {t["name"]: t["status"] for t in state["tasks"]}
    assert statuses["worker/0"] == "succeeded"
    assert statuses["ps/0"] in ("succeeded", "stopped")
    assert not [pid for pid in _pids(state) if alive(pid)]
    # checkpoints at steps 0, 60 and 120: the newest two are kept
    kept = sorted(int(p.name.split("-")[1].split(".")[0]) for p in (ws / "out").glob("*.index"))
    assert kept[-1] >= 120 and len(kept) == 2, kept
    # The saved plan was used up: applying it again is refused as stale.
    again = tfplan(ws, "apply")
    assert again.returncode == 1
    assert "stale" in again.stderr and again.stderr.count("\n") == 1


def test_chief_success_stops_the_ps_that_never_exits(ws: Path) -> None:
    port = free_port_base()
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, port),
        *fake_overrides(ws, steps="3", gate=str(ws / "worker1.done")),
        check=True,
    )
    assert "worker/0 succeeded (exit code 0)" in proc.stdout
    assert "stopping ps/0, which did not exit by themselves" in proc.stdout
    state = state_of(ws)
    assert {t["name"]: t["status"] for t in state["tasks"]}["ps/0"] == "stopped"
    assert not [pid for pid in _pids(state) if alive(pid)]


def test_chief_failure_tears_everything_down(ws: Path) -> None:
    port = free_port_base()
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, port),
        *fake_overrides(ws, chief_exit="3", worker_secs=FOREVER),
    )
    assert proc.returncode == 1
    assert "worker/0 failed (exit code 3): tearing down the cluster" in proc.stdout
    assert "not restarted: exit code 3 is permanent under policy ExitCode" in proc.stdout
    assert proc.stderr.startswith("error: training failed: worker/0 failed (exit code 3)")
    state = state_of(ws)
    statuses = {t["name"]: t["status"] for t in state["tasks"]}
    assert statuses == {"ps/0": "stopped", "worker/0": "failed", "worker/1": "stopped"}
    assert not [pid for pid in _pids(state) if alive(pid)]


def test_failed_worker_is_reported_and_training_goes_on(ws: Path) -> None:
    port = free_port_base()
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, port),
        *fake_overrides(
            ws, steps="15", worker_exit="1", worker_secs="0.2", gate=str(ws / "worker1.done")
        ),
        check=True,
    )
    assert "worker/1 failed (exit code 1); not restarted: exit code 1 is permanent" in proc.stdout
    assert "the other tasks go on" in proc.stdout
    assert "Training complete" in proc.stdout
    assert "step=15" in proc.stdout


@pytest.mark.full  # the fast tier: the evaluator's scores: test_strategies_apply's allreduce run; restarts: test_kill_matrix
def test_an_evaluator_restart_due_when_the_chief_succeeds_still_scores(ws: Path) -> None:
    """The evaluator fails as the job trains (under load, the supervisor may see it just after
    the chief's success), and its restart is due only after the chief
    has succeeded (the chief makes no step before the evaluator's gate, then three; the
    restart waits 8 s): it still starts, for the work an evaluator has left after training,
    the final checkpoint's score; the run waits for it and ends as the chief did. Its grace
    after the chief (5 s, less than the wait) counts from its restart: it is not stopped."""
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        *fake_overrides(
            ws, steps="3", worker_exit="1", worker_secs="0.2", gate=str(ws / "g"), again_exit="0"
        ),
        "cluster.workers=1",
        "cluster.evaluator=true",
        "lifecycle.restart.evaluator=OnFailure",
        "lifecycle.restart.backoff_secs=8",
        "lifecycle.evaluator_grace_secs=5",
        check=True,
    )
    out = proc.stdout
    assert "evaluator/0 failed (exit code 1): restarting in 8.0s" in out, out
    assert "stopping evaluator/0" not in out, out
    succeeded = out.index("worker/0 succeeded")
    restarted = out.index("evaluator/0: restarted on localhost")
    assert succeeded < restarted, out
    assert out.count("evaluator/0 up, cluster of") == 2, out  # both lives ran
    assert "evaluator/0 succeeded (exit code 0)" in out, out  # the second life's score
    assert "Training complete" in out


def test_an_evaluator_that_fails_after_the_chief_is_restarted_and_scores(ws: Path) -> None:
    """The evaluator fails only once the chief has succeeded (its first life waits for the
    chief's exit; an Estimator evaluator does so when the checkpoint it reads was deleted at the
    end): it is restarted by its policy all the same, for the final checkpoint's score."""
    proc = tfplan(
        ws,
        "apply",
        "--auto-approve",
        *base_overrides(ws, free_port_base()),
        *fake_overrides(
            ws,
            steps="3",
            worker_exit="1",
            worker_secs="1",
            chief_done=str(ws / "chief.done"),
            after=str(ws / "chief.done"),
            again_exit="0",
        ),
        "cluster.workers=1",
        "cluster.evaluator=true",
        "lifecycle.restart.evaluator=OnFailure",
        "lifecycle.restart.backoff_secs=0.2",
        check=True,
    )
    out = proc.stdout
    assert "evaluator/0 failed (exit code 1): restarting in" in out, out
    assert out.count("evaluator/0 up, cluster of") == 2, out
    assert "evaluator/0 succeeded (exit code 0)" in out, out
    assert "Training complete" in out


def test_detach_status_logs_destroy(ws: Path) -> None:
    port = free_port_base()
    overrides = [
        *base_overrides(ws, port),
        *fake_overrides(ws, tensorflow=True, steps=FOREVER, step_secs="0.1", worker_secs=FOREVER),
    ]
    tfplan(ws, "apply", "--auto-approve", "--detach", *overrides, check=True)
    pids = _pids(state_of(ws))
    assert len(pids) == 3 and all(alive(p) for p in pids)
    seeds = [int(s["pid"]) for s in state_of(ws)["allocation"]["data"]["seeds"]]
    assert len(seeds) == 1 and alive(seeds[0]), "one warm seed for the one host, running"
    wait_until(lambda: "step=" in (ws / "work" / "worker-0" / "task.log").read_text(), 30, "a step")
    status = tfplan(ws, "status", check=True)
    for name in ("ps/0", "worker/0", "worker/1"):
        assert name in status.stdout
    assert "running" in status.stdout
    assert f"allocation: warm seed localhost (pid {seeds[0]})" in status.stdout, status.stdout
    logs = tfplan(ws, "logs", "worker/0", check=True)
    assert "worker/0" in logs.stdout and "step=" in logs.stdout
    missing = tfplan(ws, "logs", "worker/9")
    assert missing.returncode == 1 and "choose one of" in missing.stderr
    # Re-planning with the same config while it runs: nothing to do.
    replan = tfplan(ws, "plan", "--detailed-exitcode", *overrides)
    assert replan.returncode == 0, replan.stdout + replan.stderr
    assert "No changes." in replan.stdout
    destroyed = tfplan(ws, "destroy", check=True)
    assert "Destroy complete! 3 task(s) stopped" in destroyed.stdout
    assert not [p for p in pids if alive(p)]
    assert state_of(ws)["tasks"] == []
    assert not alive(seeds[0]) and state_of(ws)["allocation"] is None, "destroy left the seed"


ENV_PROGRAM = (
    "import tensorflow  # noqa: F401 - a training program's import\n"
    "import json, os, sys\n"
    "task = json.loads(os.environ['TF_CONFIG'])['task']\n"
    "print('env', task['type'], task['index'], os.environ.get('FROM_RUN_A'),\n"
    "      os.environ.get('FROM_CLI_B'), os.getpgid(os.getppid()), flush=True)\n"
)


def test_a_kept_seed_forks_the_next_runs_tasks_and_ends_by_itself_once_idle(
    ws: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """cluster.warm_keep_secs (the first apply's key; the second's TFPLAN_WARM_KEEP_SECS, which
    a null key reads): the first apply's seed outlives its run; a second apply (another
    experiment and folder, started with another environment) forks its tasks from it, with its
    own environment, none of the first run's, as a cold start would have them; destroy leaves
    the seed, which ends by itself once idle that long and leaves no folder."""
    warm = tmp_path_factory.mktemp("warm")  # this test's own kept seeds, none of the run's
    program = ws / "env_task.py"
    program.write_text(ENV_PROGRAM)
    runs = {}
    for run, env in (("a", {}), ("b", {"FROM_CLI_B": "b", "TFPLAN_WARM_KEEP_SECS": "6"})):
        overrides = [
            *base_overrides(ws / run, free_port_base(), experiment=run),
            "recipe=command",
            f"recipe.command='{sys.executable} {program}'",
            *(["cluster.warm_keep_secs=6", "+recipe.env.FROM_RUN_A=a"] if run == "a" else []),
        ]
        (ws / run).mkdir()
        runs[run] = tfplan(
            ws / run,
            "apply",
            "--auto-approve",
            *overrides,
            env={"TFPLAN_WARM_DIR": str(warm), **env},
            check=True,
        ).stdout
    seeds = [json.loads(p.read_text()) for p in warm.glob("localhost/*/seed.json")]
    assert len(seeds) == 1 and seeds[0]["kept"], seeds
    seed = int(seeds[0]["pgid"])  # the seed's group (its wrapper's; the seed in it)
    assert "kept from an earlier run" not in runs["a"], runs["a"]
    assert f"warm seed on localhost (pid {seed}) kept from an earlier run" in runs["b"], runs["b"]
    lines = {
        run: sorted(ln.split("| ", 1)[1] for ln in runs[run].splitlines() if "| env " in ln)
        for run in runs
    }
    # every task of both runs forked from the one seed (its parent's group), each run's own env
    assert lines["a"] == [
        f"env {r} {i} a None {seed}" for r, i in (("ps", 0), ("worker", 0), ("worker", 1))
    ], lines
    assert lines["b"] == [
        f"env {r} {i} None b {seed}" for r, i in (("ps", 0), ("worker", 0), ("worker", 1))
    ], lines
    for run in runs:
        assert all(t["handle"].get("forked") for t in state_of(ws / run, run)["tasks"])
    destroyed = tfplan(ws / "b", "destroy", env={"TFPLAN_WARM_DIR": str(warm)}, check=True)
    assert alive(seed), destroyed.stdout  # the host's, not the run's
    wait_until(lambda: not alive(seed), 60, "the kept seed's end, idle")
    assert not list(warm.glob("localhost/*")), "an idle seed removes its folder"


def test_dead_task_is_planned_for_replacement_and_replaced(ws: Path) -> None:
    port = free_port_base()
    overrides = [
        *base_overrides(ws, port),
        *fake_overrides(ws, steps=FOREVER, worker_secs=FOREVER),
        "lifecycle.restart.worker=Never",  # the background supervisor leaves it dead
    ]
    tfplan(ws, "apply", "--auto-approve", "--detach", *overrides, check=True)
    state = state_of(ws)
    worker1 = next(t for t in state["tasks"] if t["name"] == "worker/1")
    os.killpg(worker1["handle"]["pgid"], signal.SIGKILL)
    wait_until(lambda: not alive(worker1["handle"]["pid"]), 10, "worker/1 to die")
    wait_until(
        lambda: (
            next(t for t in state_of(ws)["tasks"] if t["name"] == "worker/1")["status"] == "failed"
        ),
        30,
        "the background supervisor to record worker/1 as failed",
    )
    replan = tfplan(ws, "plan", "--detailed-exitcode", *overrides)
    assert replan.returncode == 2
    assert "# worker/1 must be replaced" in replan.stdout
    assert "the process is not running" in replan.stdout
    assert "Plan: 1 to add, 0 to change, 1 to destroy." in replan.stdout
    applied = tfplan(ws, "apply", "--detach", check=True)  # takes over from the background one
    assert "taking over from the supervisor" in applied.stdout
    new = next(t for t in state_of(ws)["tasks"] if t["name"] == "worker/1")
    assert new["handle"]["pid"] != worker1["handle"]["pid"] and alive(new["handle"]["pid"])
    tfplan(ws, "destroy", check=True)


def test_port_taken_fails_preflight_and_starts_nothing(ws: Path) -> None:
    port = free_port_base()
    blocker = socket.socket()
    blocker.bind(("0.0.0.0", port + 1))
    blocker.listen()
    try:
        proc = tfplan(ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws))
    finally:
        blocker.close()
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert "preflight failed" in proc.stderr and str(port + 1) in proc.stderr
    state_file = ws / ".tfplan" / "t" / "state.json"
    assert not state_file.exists() or json.loads(state_file.read_text())["tasks"] == []


def test_an_output_disk_without_room_for_the_kept_checkpoints_starts_nothing(ws: Path) -> None:
    """The disk of cluster.output_dir must hold trainer.keep_checkpoints checkpoints of the
    model (a trillion of 37.5 KiB here): refused in one line naming the keys, before any task
    or warm seed starts."""
    args = [*base_overrides(ws, free_port_base()), "trainer.keep_checkpoints=1000000000000"]
    proc = tfplan(ws, "apply", "--auto-approve", *args)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "cluster.output_dir: 1000000000000 checkpoint(s) of at least 37.5 KiB" in proc.stderr
    assert f"but {ws / 'out'} on localhost has" in proc.stderr
    assert "set cluster.output_dir to a larger disk, or keep fewer (trainer.keep_checkpoints=" in (
        proc.stderr
    )
    assert not recorded_groups(ws)  # no task, no seed
    state_file = ws / ".tfplan" / "t" / "state.json"
    assert not state_file.exists() or json.loads(state_file.read_text())["tasks"] == []


def test_second_apply_is_refused_while_one_holds_the_lock(ws: Path) -> None:
    port = free_port_base()
    with StateStore(ws / ".tfplan" / "t").lock("apply"):
        proc = tfplan(ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws))
    assert proc.returncode == 1
    assert "is locked by tfplan apply" in proc.stderr
    assert proc.stderr.count("\n") == 1


def test_apply_waits_for_a_finishing_supervisor_to_let_go_of_the_lock(ws: Path) -> None:
    """A background supervisor tears its ended job down under the lock (seen: a resize applied
    as the job reached its last step was refused): apply waits for a `tfplan watch` holder; any
    other holder is refused at once (test_second_apply_is_refused_while_one_holds_the_lock)."""
    port = free_port_base()
    store = StateStore(ws / ".tfplan" / "t")
    held, release = threading.Event(), threading.Event()

    def finishing_watch() -> None:
        with store.lock("watch"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=finishing_watch, daemon=True)
    holder.start()
    assert held.wait(10)
    timer = threading.Timer(2.0, release.set)
    timer.start()
    proc = tfplan(ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws))
    holder.join(10)
    assert release.is_set()  # apply could only go on after the watch let go
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert "is locked by" not in proc.stderr


def test_failed_start_stops_what_was_started(ws: Path) -> None:
    port = free_port_base()
    # worker/1's workdir cannot be created (a file is in the way of its parent): ps/0 and
    # worker/0 start, worker/1 fails, and the apply must stop the two it started.
    (ws / "work").mkdir()
    (ws / "work" / "worker-1").write_text("not a folder")
    proc = tfplan(ws, "apply", "--auto-approve", *base_overrides(ws, port), *fake_overrides(ws))
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    state_file = ws / ".tfplan" / "t" / "state.json"
    tasks = json.loads(state_file.read_text())["tasks"] if state_file.exists() else []
    assert tasks == []
    assert "worker-1" in proc.stderr or "worker/1" in proc.stderr


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"]
)
def test_ctrl_c_stops_every_task_and_keeps_state_consistent(
    ws: Path, sig: signal.Signals, code: int
) -> None:
    """Ctrl-C, and SIGTERM (`kill`, `timeout`, a scheduler's stop), stop every task and the
    host's warm seed: nothing of the cluster runs on unsupervised."""
    port = free_port_base()
    env = {**os.environ, "TFPLAN_CONF": str(CONF)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfplan",
            "apply",
            "--auto-approve",
            *base_overrides(ws, port),
            *fake_overrides(ws, steps=FOREVER, worker_secs=FOREVER),
        ],
        cwd=ws,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "step=2" in line:
                break
        allocation = state_of(ws)["allocation"] or {}
        seeds = [int(s["pid"]) for s in allocation.get("data", {}).get("seeds", [])]
        proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:  # what it was doing is the whole story: say it
            proc.kill()
            out, err = proc.communicate()
            said = f"{out[-3000:]}\n{err[-3000:]}"
            raise AssertionError(f"apply still running 60s after {sig.name}:\n{said}") from None
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, err
    state = state_of(ws)
    assert {t["status"] for t in state["tasks"]} == {"stopped"}
    assert not [pid for pid in _pids(state) if alive(pid)]
    assert state["allocation"] is None and not [g for g in seeds if alive(g)], seeds


def test_logs_follow_streams_until_the_task_ends(ws: Path) -> None:
    port = free_port_base()
    overrides = [
        *base_overrides(ws, port),
        *fake_overrides(ws, steps="20", step_secs="0.1", worker_secs="1"),
    ]
    tfplan(ws, "apply", "--auto-approve", "--detach", *overrides, check=True)
    followed = tfplan(ws, "logs", "-f", "worker/0", timeout=60, check=True)
    lines = [line for line in followed.stdout.splitlines() if line.startswith("worker/0")]
    assert lines[-1].endswith("step=20 loss=0.050"), lines[-3:]
    assert sum("step=" in line for line in lines) == 20
    assert not any(line.startswith("worker/1") for line in followed.stdout.splitlines())
    tfplan(ws, "destroy", check=True)
