"""`tfplan plan -m` / `tfplan apply -m`: sweeps where every point is a whole cluster, through the
real CLI. The lifecycle cases run a small TF_CONFIG program (recipe=command, a second a point);
one sweep runs the built-in TensorFlow recipe end to end and looks at it with TensorBoard."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from apply_helpers import (
    CONF,
    FOREVER,
    BackgroundTfplan,
    free_port_base,
    kill_groups,
    recorded_groups,
    tfplan,
    wait_until,
)
from sweep_helpers import command, result_task, sweep_overrides, sweep_record


@pytest.fixture
def ws(tmp_path: Path) -> Iterator[Path]:
    """A user's folder; whatever the test leaves running is killed by recorded process group."""
    yield tmp_path
    kill_groups(recorded_groups(tmp_path))


def _ports(ws: Path, experiment: str) -> set[int]:
    state = json.loads((ws / ".tfplan" / experiment / "state.json").read_text())
    return {int(t["port"]) for t in state["tasks"] if t.get("port")}


@pytest.mark.full  # the fast tier: plan -m's dry run; the keyword in plan: test_cli_plan
def test_a_swept_model_keyword_means_the_factorys_keyword_as_in_plan_and_apply(
    ws: Path,
) -> None:
    """model.units=16,64 sweeps the factory's keyword (model.kwargs.units), as model.units=16
    sets it in plan and apply (docs/your_model.md section 8); it was "no such key" with -m."""
    package = ws / "mine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "models.py").write_text(
        "import keras\n\n\ndef build(units=8):\n"
        "    inputs = keras.Input((64,))\n"
        "    hidden = keras.layers.Dense(units, name='hidden')(inputs)\n"
        "    return keras.Model(inputs, keras.layers.Dense(10)(hidden))\n"
    )
    proc = tfplan(
        ws,
        "plan",
        "-m",
        "model._target_=mine.models.build",
        "model.units=16,64",
        *sweep_overrides(ws, free_port_base(40)),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    points = [line.split() for line in proc.stdout.splitlines() if line.lstrip().startswith("#")]
    assert [p[1] for p in points] == ["++model.kwargs.units=16", "++model.kwargs.units=64"]


def test_plan_m_is_a_dry_run_of_every_point_with_the_total(ws: Path) -> None:
    port = free_port_base(40)
    proc = tfplan(
        ws,
        "plan",
        "-m",
        "algo=hogwild,downpour",
        "algo.lr=0.01,-1",
        *sweep_overrides(ws, port),
        "--concurrency",
        "2",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one point cannot be planned
    lines = proc.stdout.splitlines()
    points = [line for line in lines if line.lstrip().startswith("#")]
    assert len(points) == 4
    first = points[0].split()
    assert first[:6] + first[7:] == [
        "#0",
        "algo=hogwild",
        "algo.lr=0.01",
        "3",
        "tasks",
        "ports",
        "experiment",
        "s-0",
    ]
    # Each point gets its own window of cluster.port_range (10) ports. Which window is a race
    # between the two threads of --concurrency 2 (a failed point gives its window back at once,
    # and the next two points take windows in whatever order their threads get there), so the
    # promise is: a window of the pool, and never one that a point running beside it holds.
    windows = [f"{port + 10 * k}-{port + 10 * k + 2}" for k in range(4)]
    assert first[6] in windows, first
    third = points[2].split()
    assert third[third.index("ports") + 1] in windows, third
    assert third[third.index("ports") + 1] != first[6]
    assert "#1" in points[1] and "error: algo.lr: -1.0 is not positive" in points[1]
    assert (
        "Sweep: 4 points, 6 tasks in all; concurrency 2: at most 6 tasks at once. "
        "2 point(s) cannot be planned."
    ) in proc.stdout
    # A dry run: no folder, no state, no saved plan.
    assert not (ws / "out").exists() and not (ws / ".tfplan").exists()


def test_sweep_errors_are_one_line_and_start_nothing(ws: Path) -> None:
    port = free_port_base(20)
    cases = {
        ("experiment.id=a,b",): "experiment.id: cannot be swept",
        ("algo.lrr=0.1,0.2",): "no such key",
        ("hydra/launcher=basic",): "tfplan runs the points with its own launcher",
        ("hydra/sweeper=nosuch",): "hydra/sweeper: no option 'nosuch'",
        ("sweep.prune=mean",): "sweep.prune: 'mean' is not a pruning rule",
        ("sweep.prune=median",): "sweep.prune: pruning compares the evaluator's",
        ("sweep.prune_startup_points=0",): "sweep.prune_startup_points: 0 < 1",
        (
            "+sweep.pruner={_target_: optuna.pruners.MedianPruner}",
        ): "sweep.pruner: an Optuna pruner needs Optuna's study",
        (
            "recipe=command",
            "recipe.command=python3 t.py",
            "hydra/sweeper=optuna",
            "+sweep.pruner={_target_: optuna.pruners.NoSuchPruner}",
        ): "sweep.pruner:",
    }
    for extra, message in cases.items():
        proc = tfplan(ws, "apply", "-m", "--auto-approve", *sweep_overrides(ws, port)[1:], *extra)
        assert proc.returncode == 1, extra
        assert message in proc.stderr and proc.stderr.count("\n") == 1, (extra, proc.stderr)
    assert not (ws / ".tfplan").exists()


def test_a_failing_point_is_reported_and_the_other_completes(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws)
    commands = f"{command(script, acc='0.9')},{command(script, acc='0.7', exit='3')}"
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={commands}",
        "algo.lr=0.05,-1",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Sweep complete! 1 succeeded, 3 failed." in out
    # Points: (acc=0.9, lr=0.05), (acc=0.9, lr=-1), (exit=3, lr=0.05), (exit=3, lr=-1).
    assert "#2 tfplan | failed: worker/0 failed (exit code 3)" in out
    assert "#1 tfplan | failed: algo.lr: -1.0 is not positive" in out  # refused before starting
    rows = {int(r["num"]): r for r in csv.DictReader((ws / "out" / "results.csv").open())}
    assert rows[0]["status"] == "succeeded" and float(rows[0]["accuracy"]) == 0.9
    assert rows[2]["status"] == "failed" and rows[2]["reason"] == "worker/0 failed (exit code 3)"
    assert rows[2]["accuracy"] == "" and rows[2]["global_step"] == "4"  # steps it reached
    assert rows[1]["status"] == rows[3]["status"] == "failed"
    assert "algo.lr: -1.0 is not positive" in rows[3]["reason"]
    # Sequential by default: each point starts once the one before it has ended.
    points = sorted(sweep_record(ws / "out")["points"], key=lambda p: p["num"])
    for before, after in zip(points, points[1:], strict=False):
        assert after["started_at"] >= before["ended_at"]
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]


# `tfplan apply -m` with Hydra's composing counted (a sweep's start-up is mostly composing)
COUNTED_APPLY = """
import sys
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from tfplan.cli.main import main
composed = []
load = ConfigLoaderImpl.load_sweep_config
def counted(self, master_config, sweep_overrides):
    composed.append(list(sweep_overrides))
    return load(self, master_config, sweep_overrides)
ConfigLoaderImpl.load_sweep_config = counted
code = main(sys.argv[1:])
print(f"points composed: {len(composed)}", flush=True)
sys.exit(code)
"""


def test_apply_m_composes_each_point_once(ws: Path) -> None:
    """The plan shown for approval composes every point; the run uses those compositions (and
    Hydra's basic sweeper does not compose each batch a second time to validate it): one
    composition per point, where there were four (about 0.3 s of CPU each)."""
    port = free_port_base(30)
    script = result_task(ws)
    args = [*sweep_overrides(ws, port), "recipe=command", f"recipe.command={command(script)}"]
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            COUNTED_APPLY,
            "apply",
            "-m",
            "--auto-approve",
            *args,
            "algo.lr=0.03,0.05,0.08",
        ],
        cwd=ws,
        env={**os.environ, "TFPLAN_CONF": str(CONF)},
        text=True,
        capture_output=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Sweep complete! 3 succeeded, 0 failed." in proc.stdout
    assert "points composed: 3" in proc.stdout, proc.stdout[-2000:]
    rows = {int(r["num"]): r for r in csv.DictReader((ws / "out" / "results.csv").open())}
    # each point ran its own composition: its own learning rate (acc=lr: 1 - |lr - 0.05|)
    assert [float(rows[n]["accuracy"]) for n in range(3)] == [0.98, 1.0, 0.97]
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_concurrency_two_runs_two_clusters_at_once_on_their_own_ports(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws)
    barrier = str(ws / "barrier")
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        "--concurrency",
        "2",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={command(script, steps='12', step_secs='0.25', barrier=barrier)}",
        "algo.lr=0.03,0.06",
        check=True,
    )
    assert "Sweep complete! 2 succeeded, 0 failed." in proc.stdout
    assert len(os.listdir(barrier)) == 2
    first, second = sorted(sweep_record(ws / "out")["points"], key=lambda p: p["num"])
    # Both clusters ran at the same time (each chief waited at the barrier for the other)...
    assert second["started_at"] < first["ended_at"] and first["started_at"] < second["ended_at"]
    # ...each on its own window of ports, and each trained to the end.
    ports0, ports1 = _ports(ws, "s-0"), _ports(ws, "s-1")
    assert len(ports0) == len(ports1) == 3 and not ports0 & ports1
    assert {min(ports0), min(ports1)} == {port, port + 10}
    results = json.loads((ws / "out" / "results.json").read_text())["points"]
    assert [round(p["accuracy"], 6) for p in results] == [0.98, 0.99]  # 1 - |lr - 0.05|


@pytest.mark.full  # the fast tier: Optuna end to end: test_optuna_records_the_points_tfplan_pruned_as_pruned_trials
def test_optuna_sweeper_maximises_the_held_out_accuracy(ws: Path) -> None:
    """Hydra's sweeper plugins drive the points: Optuna samples algo.lr and gets back each
    point's held-out accuracy (the fake program reports 1 - |lr - 0.05|)."""
    try:
        import hydra_plugins.hydra_optuna_sweeper  # noqa: F401
    except ImportError:
        pytest.fail("hydra-optuna-sweeper is not installed: pip install hydra-optuna-sweeper")
    port = free_port_base(30)
    script = result_task(ws)
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={command(script, steps='2')}",
        "hydra/sweeper=optuna",
        "hydra.sweeper.n_trials=3",
        "hydra.sweeper.direction=maximize",
        "hydra.sweeper.sampler.seed=7",
        "algo.lr=interval(0.01,0.1)",
        check=True,
    )
    assert "Sweep complete! 3 succeeded, 0 failed." in proc.stdout
    results = json.loads((ws / "out" / "results.json").read_text())["points"]
    assert len(results) == 3
    best = (ws / "out" / "optimization_results.yaml").read_text()
    import yaml

    best_value = yaml.safe_load(best)["best_value"]
    assert best_value == pytest.approx(max(p["accuracy"] for p in results))


@pytest.mark.cluster
@pytest.mark.full
# Each step has its own deadline (apply 400 s, TensorBoard's start 120 s, its runs 60 s, its
# exit 240 s); the whole took 235 s on 2 cores at load 27, near the 300 s default.
@pytest.mark.timeout(900)
def test_real_two_point_sweep_end_to_end_with_report_and_tensorboard(ws: Path) -> None:
    port = free_port_base(30)
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "algo.lr=0.02,0.2",
        "trainer.max_steps=40",
        "trainer.log_steps=20",
        "trainer.checkpoint_steps=20",
        "cluster.evaluator=true",
        "trainer.eval_secs=0.5",
        timeout=400,
        check=True,
    )
    out = proc.stdout
    assert "Sweep complete! 2 succeeded, 0 failed." in out
    assert "Sweep: 2 points, 8 tasks in all" in out  # ps, 2 workers, evaluator per point
    # the built-in recipes and model: the points' seed imported TensorFlow without Keras
    assert re.search(
        r"warm seed on localhost ready in [\d.]+s \(pid \d+, TensorFlow without Keras\)", out
    )
    report = json.loads((ws / "out" / "results.json").read_text())["points"]
    csv_rows = list(csv.DictReader((ws / "out" / "results.csv").open()))
    for num, (row, csv_row) in enumerate(zip(report, csv_rows, strict=True)):
        point_dir = ws / "out" / str(num)
        result = json.loads((point_dir / "result.json").read_text())
        assert row["overrides"] == ["algo.lr=0.02", "algo.lr=0.2"][num].replace("'", "")
        assert row["status"] == "succeeded" and result["global_step"] >= 40
        for key in ("global_step", "accuracy", "loss", "examples_per_sec"):
            assert row[key] == result[key]
            assert float(csv_row[key]) == result[key]
        assert f"{result['accuracy']:.4f}" in out  # the table shows the real figure
        assert row["curve"] and row["curve"][-1][1] == result["accuracy"]
        assert (point_dir / "checkpoint").is_file()
        assert (point_dir / "tfplan" / "logs" / "worker-0.log").read_text().count("step=") >= 2
    assert (ws / "out" / "accuracy.png").stat().st_size > 10_000
    assert (ws / "out" / "multirun.yaml").is_file()  # Hydra's own record of the sweep
    _tensorboard_shows_both_points(ws)


def _tensorboard_shows_both_points(ws: Path) -> None:
    proc = tfplan(ws, "tensorboard", "s", "--detach", "--port", str(free_port_base(1)), check=True)
    line = next(ln for ln in proc.stdout.splitlines() if "http://" in ln)
    url = line.split(": ", 1)[1].split()[0]
    pid = int(line.rsplit("pid ", 1)[1].rstrip(")"))
    try:
        assert url.startswith("http://127.0.0.1:")
        runs: list[str] = []

        def both_runs() -> bool:
            nonlocal runs
            with urllib.request.urlopen(url + "data/runs", timeout=5) as response:
                runs = json.loads(response.read())
            return {"0", "1"} <= set(runs)

        wait_until(both_runs, 60, "TensorBoard to list both points")
        assert "0/eval" in runs and "1/eval" in runs
    finally:
        os.kill(pid, signal.SIGTERM)
        try:
            # The events: TensorBoard's own line for the signal, then its exit. The exit is
            # Python's finalization of an interpreter with TensorFlow loaded (a stack dump shows
            # "Garbage-collecting", no Python frame): 10-25 s on 2 busy cores (load about 20),
            # where the old 10 s deadline failed. The bounds only guard against a hang.
            logs = ws / ".tfplan" / "tensorboard"
            wait_until(
                lambda: any("caught SIGTERM" in p.read_text() for p in logs.glob("*.log")),
                60,
                "TensorBoard to take the SIGTERM",
            )
            wait_until(lambda: not _pid_alive(pid), 180, "TensorBoard to exit after SIGTERM")
        finally:
            if _pid_alive(pid):
                os.kill(pid, signal.SIGKILL)  # ours, by PID: leave nothing behind


def _pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.full
def test_ctrl_c_stops_every_running_cluster_of_a_concurrent_sweep(ws: Path) -> None:
    import sys

    from apply_helpers import CONF

    port = free_port_base(30)
    script = result_task(ws)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfplan",
            "apply",
            "-m",
            "--auto-approve",
            "--concurrency",
            "2",
            *sweep_overrides(ws, port),
            "recipe=command",
            f"recipe.command={command(script, steps=FOREVER, step_secs='0.2')}",
            "algo.lr=0.01,0.02",
        ],
        cwd=ws,
        env={**os.environ, "TFPLAN_CONF": str(CONF)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        # Ctrl-C once both clusters are whole (worker/1 is started last) and both chiefs train
        # (each writes eval/metrics.jsonl after its first step); they never end by themselves.
        started: set[str] = set()
        for line in proc.stdout:
            if "worker/1: started" in line:
                started.add(line.split()[0])
            if started == {"#0", "#1"}:
                break
        wait_until(
            lambda: all((ws / "out" / n / "eval" / "metrics.jsonl").exists() for n in "01"),
            60,
            "both chiefs to train",
        )
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "Interrupted: every running point was stopped." in out
    for experiment in ("s-0", "s-1"):
        state = json.loads((ws / ".tfplan" / experiment / "state.json").read_text())
        statuses = {t["name"]: t["status"] for t in state["tasks"]}
        assert statuses["ps/0"] == statuses["worker/0"] == "stopped", statuses
        assert not [t for t in state["tasks"] if _pid_alive(int(t["handle"]["pid"]))]
    assert {p["status"] for p in sweep_record(ws / "out")["points"]} == {"interrupted"}


def _seed_pids(folder: Path) -> list[int]:
    """Live processes whose command line names the seed folder (looked at, never signalled)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmdline and _pid_alive(int(entry.name)):
                pids.append(int(entry.name))
    return pids


def test_points_fork_their_tasks_from_a_warm_seed_that_ends_with_the_sweep(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws, tensorflow=True)
    overrides = [*sweep_overrides(ws, port), "recipe=command", f"recipe.command={command(script)}"]
    proc = tfplan(ws, "apply", "-m", "--auto-approve", *overrides, "algo.lr=0.03,0.06", check=True)
    assert "sweep tfplan | warm seed on localhost ready in" in proc.stdout
    for experiment in ("s-0", "s-1"):
        state = json.loads((ws / ".tfplan" / experiment / "state.json").read_text())
        handles = {t["name"]: t["handle"] for t in state["tasks"]}
        assert all(h.get("forked") is True for h in handles.values()), handles
        statuses = {t["name"]: t["status"] for t in state["tasks"]}
        assert statuses["worker/0"] == "succeeded" and statuses["ps/0"] == "stopped", statuses
    results = json.loads((ws / "out" / "results.json").read_text())["points"]
    assert [round(p["accuracy"], 6) for p in results] == [0.98, 0.99]
    # the seed ended with the sweep, and so did its record
    assert not (ws / "out" / "seeds.json").exists()
    assert not _seed_pids(ws / "work" / "_seed-s")
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]
    # sweep.warm=false: every task starts the usual way
    cold = [
        *sweep_overrides(ws, port, sweep="c"),
        "recipe=command",
        f"recipe.command={command(script)}",
    ]
    cold = [o.replace(f"{ws}/out", f"{ws}/out-c") for o in cold]
    proc = tfplan(
        ws, "apply", "-m", "--auto-approve", *cold, "sweep.warm=false", "algo.lr=0.03", check=True
    )
    assert "warm seed" not in proc.stdout
    state = json.loads((ws / ".tfplan" / "c-0" / "state.json").read_text())
    assert not [t for t in state["tasks"] if t["handle"].get("forked")]


@pytest.mark.full  # the fast tier: test_kill_matrix's forked ps/0 and the warm sweep above
def test_a_ps_killed_in_a_warm_sweep_is_forked_again_and_the_point_goes_on(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws, tensorflow=True)
    barrier = ws / "barrier"  # the chief makes no step before the test signs in too
    held = command(script, steps="3", barrier=str(barrier), parties="2")
    run = BackgroundTfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={held}",
        "algo.lr=0.05",
    )
    state_path = ws / ".tfplan" / "s-0" / "state.json"

    def ps() -> dict[str, object]:
        state = json.loads(state_path.read_text()) if state_path.exists() else {"tasks": []}
        return next((t for t in state["tasks"] if t["name"] == "ps/0"), {})

    try:
        wait_until(lambda: barrier.exists() and os.listdir(barrier), 120, "the chief to wait")
        # the chief can reach the barrier before apply has written the state of every task
        wait_until(lambda: bool(ps().get("handle")), 120, "the state to record ps/0's process")
        first = ps()
        assert first["handle"]["forked"] is True  # type: ignore[index]
        os.kill(int(first["handle"]["pid"]), signal.SIGKILL)  # type: ignore[index]
        wait_until(lambda: ps().get("restarts") == 1, 60, "the ps to be restarted")
        again = ps()
        assert again["handle"]["forked"] is True  # type: ignore[index]
        assert again["handle"]["pid"] != first["handle"]["pid"]  # type: ignore[index]
        (barrier / "test").touch()  # the chief trains now
        lines = run.finish(120)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    out = "\n".join(lines)
    assert run.proc.returncode == 0, out
    assert "ps/0: restarted on localhost" in out and "Sweep complete! 1 succeeded" in out
    assert "standby" not in out  # a forked restart is as quick: no standby is kept
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]


@pytest.mark.full
def test_the_seed_of_a_killed_sweep_is_stopped_by_its_next_run(ws: Path) -> None:
    port = free_port_base(30)
    script = result_task(ws, tensorflow=True)
    overrides = [*sweep_overrides(ws, port), "recipe=command", "algo.lr=0.03"]
    forever = command(script, steps=FOREVER, step_secs="0.2")
    run = BackgroundTfplan(
        ws, "apply", "-m", "--auto-approve", *overrides, f"recipe.command={forever}"
    )
    seeds = ws / "out" / "seeds.json"
    try:
        wait_until(
            lambda: seeds.exists() and (ws / "out" / "0" / "eval" / "metrics.jsonl").exists(),
            120,
            "the point to train from the seed",
        )
        seed_pid = int(json.loads(seeds.read_text())["seeds"][0]["pid"])
    finally:
        run.proc.kill()  # the sweep dies without stopping anything
        run.finish(30)
    state = json.loads((ws / ".tfplan" / "s-0" / "state.json").read_text())
    kill_groups([int(t["handle"]["pgid"]) for t in state["tasks"]])  # its tasks, not its seed
    assert _pid_alive(seed_pid)
    proc = tfplan(
        ws, "apply", "-m", "--auto-approve", *overrides, f"recipe.command={command(script)}"
    )
    assert "stopped 1 warm seed(s) an earlier run of this sweep left" in proc.stdout, proc.stdout
    assert not _pid_alive(seed_pid)
    assert "Sweep complete! 1 succeeded, 0 failed." in proc.stdout, proc.stdout
    assert not seeds.exists() and not _seed_pids(ws / "work" / "_seed-s")


def _pruning_sweep(
    ws: Path, *extra: str, hold_lr: str | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[int, dict[str, str]]]:
    port = free_port_base(60)
    script = result_task(ws)
    held = {"hold_lr": hold_lr} if hold_lr else {}
    proc = tfplan(
        ws,
        "apply",
        "-m",
        "--auto-approve",
        *sweep_overrides(ws, port),
        "recipe=command",
        f"recipe.command={command(script, steps='8', step_secs='0.1', **held)}",
        *extra,
    )
    assert proc.returncode in (0, 1) and "Sweep complete!" in proc.stdout, proc.stdout + proc.stderr
    rows = {int(r["num"]): r for r in csv.DictReader((ws / "out" / "results.csv").open())}
    return proc, rows


PRUNED_SWEEP = ("algo.lr=0.04,0.06,0.5,0.05", "sweep.prune=median", "sweep.prune_startup_points=2")
HELD = "0.5"  # the point to prune holds after its first step: its teardown comes before its end


def test_median_pruning_stops_a_point_below_the_finished_points(ws: Path) -> None:
    # accuracy at step s of 8 is (1 - |lr - 0.05|) * s / 8: lr=0.5 is far below the two
    # finished points' median from its first step; lr=0.05 is above it and trains to the end
    proc, rows = _pruning_sweep(ws, *PRUNED_SWEEP, hold_lr=HELD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Sweep complete! 3 succeeded, 1 pruned, 0 failed." in proc.stdout
    assert [rows[n]["status"] for n in range(4)] == [
        "succeeded",
        "succeeded",
        "pruned",
        "succeeded",
    ]
    assert rows[2]["reason"].startswith("pruned at step 1: accuracy 0.0688 below the median 0.1237")
    assert rows[2]["global_step"] == "1" and rows[2]["accuracy"] == ""
    assert "#2 tfplan | pruned: pruned at step 1" in proc.stdout
    record = {p["num"]: p for p in sweep_record(ws / "out")["points"]}
    assert record[2]["status"] == "pruned" and record[2]["last_step"] == 1
    # torn down like a finished point: nothing of it runs; its experiment says why it ended
    state = json.loads((ws / ".tfplan" / "s-2" / "state.json").read_text())
    statuses = {t["name"]: t["status"] for t in state["tasks"]}
    assert statuses["worker/0"] == statuses["ps/0"] == "stopped", statuses
    assert "running" not in statuses.values()
    experiment = json.loads((ws / "out" / "2" / "tfplan" / "experiment.json").read_text())
    assert experiment["runs"][-1]["status"] == "pruned", experiment
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]

    # Resume: the same sweep again keeps what finished (pruned stays pruned), starts nothing
    before = {n: (ws / ".tfplan" / f"s-{n}" / "state.json").read_text() for n in range(4)}
    again, rows_again = _pruning_sweep(ws, *PRUNED_SWEEP, hold_lr=HELD)
    assert "Sweep complete! 3 succeeded, 1 pruned, 0 failed." in again.stdout
    for n in range(4):
        assert (ws / ".tfplan" / f"s-{n}" / "state.json").read_text() == before[n]
    assert "#2 tfplan | pruned in an earlier run of this sweep (pruned at step 1" in again.stdout
    assert "#3 tfplan | succeeded in an earlier run of this sweep" in again.stdout
    assert "started on" not in again.stdout and "warm seed" not in again.stdout
    assert rows_again == rows
    # a point number that ran other overrides fails in one line, and nothing is started for it
    other, _ = _pruning_sweep(ws, "algo.lr=0.04,0.06,0.3,0.05", *PRUNED_SWEEP[1:], hold_lr=HELD)
    assert "point 2 ran algo.lr=0.5 before, and is algo.lr=0.3 now" in other.stdout
    assert (ws / ".tfplan" / "s-2" / "state.json").read_text() == before[2]


def test_optuna_records_the_points_tfplan_pruned_as_pruned_trials(ws: Path) -> None:
    proc, rows = _pruning_sweep(
        ws,
        "hydra/sweeper=optuna",
        "hydra.sweeper.sampler.seed=7",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.direction=maximize",
        "algo.lr=choice(0.05,0.5,0.6,0.7)",
        "sweep.prune=median",
        "sweep.prune_startup_points=1",
    )
    # the study as Optuna recorded it (an in-memory study: tfplan leaves it in optuna.json)
    trials = json.loads((ws / "out" / "optuna.json").read_text())["trials"]
    states = {t["number"]: t["state"] for t in trials}
    # job n of the sweep is trial n; Optuna's MedianPruner (tfplan's config) pruned some
    assert sorted(states) == [0, 1, 2, 3]
    assert "PRUNED" in states.values(), (states, proc.stdout)
    for trial in trials:
        row = rows[trial["number"]]
        assert float(row["overrides"].split("=")[1]) == trial["params"]["algo.lr"]
        if trial["state"] == "PRUNED":
            assert row["status"] == "pruned" and "by Optuna's MedianPruner" in row["reason"]
            assert trial["intermediate_values"]  # reported while it trained
        else:
            assert (trial["state"], row["status"]) == ("COMPLETE", "succeeded")
            assert trial["value"] == pytest.approx(float(row["accuracy"]))
            assert len(trial["intermediate_values"]) == 8
    assert not [g for g in recorded_groups(ws) if _group_alive(g)]
