"""Benchmark `tfplan apply` against starting the same processes from a shell script.

    .venv/bin/python bench/bench_apply.py [--repeats 3] [--out docs/bench_apply.md]

Measured side by side, in rotating order, on cluster=local (1 ps + 2 workers, MLP on digits):
- launch -> first training step of every worker: tfplan apply (warm starts, the default), tfplan
  apply with cluster.warm=false (cold), tfplan apply finding a seed kept from an earlier apply
  (cluster.warm_keep_secs: a repeated apply on one machine; the first, which starts the kept
  seed, is not timed), and a shell script that starts the same tasks (each
  one's command, workdir, environment and TF_CONFIG as the saved plan and
  `tfplan show --task NAME --json` give them, run.yaml and recipes staged beforehand); ratios of
  medians; target warm <= 0.8x the shell script;
- memory of the running cluster at that moment, warm and cold: the PSS (shared pages counted
  once) of every process of its tasks and warm seed, summed;
- training done (result.json written) -> every task exited and apply returned (target <= 1 s);
- `tfplan destroy` of a running cluster (target <= 2 s, zero processes left).
Writes docs/bench_apply.md (or --out); `--repeats 1` is the quickest run to the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _planned import planned_tasks, stage, tf_config_text

from recipes.snapshot_paths import snapshot_folder

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base, kill_groups, recorded_groups  # noqa: E402

TFPLAN = [sys.executable, "-m", "tfplan"]
ENV = {**os.environ, "TFPLAN_CONF": str(REPO / "conf")}


def overrides(tmp: Path, steps: int) -> list[str]:
    return [
        "experiment.id=bench",
        f"cluster.port_base={free_port_base()}",
        "cluster.port_range=10",
        f"cluster.workdir={tmp}/work",
        f"cluster.output_dir={tmp}/out",
        f"trainer.max_steps={steps}",
        "trainer.log_steps=1000",
        "trainer.checkpoint_steps=1000",
    ]


def wait_first_steps(tmp: Path, started: float, timeout: float = 180) -> float:
    logs = [tmp / "work" / f"worker-{i}" / "task.log" for i in (0, 1)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and "step=" in p.read_text(errors="replace") for p in logs):
            return time.monotonic() - started
        time.sleep(0.02)
    raise RuntimeError(f"no first step within {timeout}s in {tmp}")


def destroy(tmp: Path, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [*TFPLAN, "destroy", "--auto-approve"],
        cwd=tmp,
        env=env or ENV,
        check=True,
        capture_output=True,
    )


def apply_detached(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> None:
    """`tfplan apply --detach` of a run long enough to be stopped by hand."""
    subprocess.run(
        [*TFPLAN, "apply", "--auto-approve", "--detach", *overrides(tmp, 100000), *extra],
        cwd=tmp,
        env=env or ENV,
        check=True,
        capture_output=True,
    )


def pss_bytes(groups: list[int]) -> int:
    """The summed PSS of every live process in these process groups (/proc smaps_rollup)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z" or int(fields[2]) not in groups:
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


def run_tfplan_launch(tmp: Path, warm: bool) -> tuple[float, int]:
    """(launch -> first step of every worker, PSS of the cluster then) of one apply."""
    started = time.monotonic()
    try:
        apply_detached(tmp, f"cluster.warm={str(warm).lower()}")
        took = wait_first_steps(tmp, started)
        return took, pss_bytes(recorded_groups(tmp))
    finally:
        destroy(tmp)


KEEP = "cluster.warm_keep_secs=300"


def kept_groups(warm_dir: Path) -> list[int]:
    """The process groups of the kept seeds under ``warm_dir`` (their ``pgid`` files)."""
    groups = []
    for path in warm_dir.glob("*/*/pgid"):
        try:
            groups.append(int(path.read_text()))
        except (OSError, ValueError):
            continue
    return groups


def run_kept_launch(tmp: Path, warm_dir: Path) -> tuple[float, int]:
    """(launch -> first step of every worker, PSS of the cluster and its seed then) of an
    apply that finds the host's seed kept from an earlier one (started first, untimed, when
    none runs yet)."""
    env = {**ENV, "TFPLAN_WARM_DIR": str(warm_dir)}
    if not list(warm_dir.glob("*/*/ready")):
        prime = tmp / "prime"
        prime.mkdir()
        apply_detached(prime, KEEP, env=env)
        wait_first_steps(prime, time.monotonic())
        destroy(prime, env)
    started = time.monotonic()
    try:
        apply_detached(tmp, KEEP, env=env)
        took = wait_first_steps(tmp, started)
        return took, pss_bytes(recorded_groups(tmp) + kept_groups(warm_dir))
    finally:
        destroy(tmp, env)


def run_shell_launch(tmp: Path) -> float:
    """The same tasks started by a plain shell script: each one's command, workdir, whole
    environment and TF_CONFIG as the saved plan and `tfplan show --task NAME --json` give them,
    with what `tfplan apply` stages for them (the recipes under code_dir, each task's
    run.yaml) written before the clock starts."""
    plan, tasks = planned_tasks(tmp, ENV, overrides(tmp, 100000))
    stage(plan)
    lines = ["#!/bin/sh"]
    for task in tasks:
        if task["tf_config"] is None:
            raise RuntimeError(f"{task['name']}: no TF_CONFIG before apply (addresses unknown)")
        env = {**task["env"], "TF_CONFIG": tf_config_text(task["tf_config"])}
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        cmd = " ".join(shlex.quote(c) for c in task["command"])
        lines.append(
            f"cd {shlex.quote(task['workdir'])}; env {exports} setsid {cmd} > "
            f"{shlex.quote(task['log_path'])} 2>&1 < /dev/null & echo $!"
        )
    script = tmp / "start.sh"
    script.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    out = subprocess.run(["sh", str(script)], check=True, capture_output=True, text=True).stdout
    try:
        return wait_first_steps(tmp, started)
    finally:
        for pid in (int(p) for p in out.split()):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # a ps killed outright keeps its snapshot folder (for its restart); tfplan removes it
        # when it gives the job back, the script cannot: the bench removes what it left
        shutil.rmtree(snapshots_of(tmp), ignore_errors=True)


def snapshots_of(tmp: Path) -> str:
    """The job's folder of in-memory snapshots (the default ``lifecycle.snapshot_dir``)."""
    return os.path.dirname(snapshot_folder("/dev/shm", str(tmp / "out"), 0))


def run_teardown(tmp: Path) -> float:
    """Seconds from result.json appearing to `tfplan apply` (attached) returning."""
    args = overrides(tmp, 60)
    proc = subprocess.Popen(
        [*TFPLAN, "apply", "--auto-approve", *args],
        cwd=tmp,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        result = tmp / "out" / "result.json"
        while not result.exists():
            if proc.poll() is not None:
                raise RuntimeError(f"apply ended (exit {proc.returncode}) before result.json")
            time.sleep(0.01)
        seen = time.monotonic()
        proc.wait(timeout=120)
        return time.monotonic() - seen
    finally:
        if proc.poll() is None:  # it failed half-way: stop it and its tasks
            proc.kill()
            proc.wait()
            kill_groups(recorded_groups(tmp))


def processes_in(groups: list[int]) -> int:
    """Live (not zombie) processes in these process groups, from /proc."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            count += fields[0] != "Z" and int(fields[2]) in groups
    return count


def run_destroy(tmp: Path) -> tuple[float, int]:
    """Seconds `tfplan destroy` takes on a running cluster, and the processes of its tasks
    (and warm standbys) still alive after it."""
    try:
        apply_detached(tmp)
        wait_first_steps(tmp, time.monotonic())
        groups = recorded_groups(tmp)
        started = time.monotonic()
        destroy(tmp)
        return time.monotonic() - started, processes_in(groups)
    finally:
        destroy(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_apply.md")
    options = parser.parse_args()
    repeats = options.repeats
    load_start = os.getloadavg()
    tfplan_launch, cold_launch, shell_launch, teardown, destroyed, left = [], [], [], [], [], []
    warm_pss: list[int] = []
    cold_pss: list[int] = []
    kept_launch: list[float] = []
    kept_pss: list[int] = []
    kinds = ["tfplan", "cold", "shell", "kept"]
    shm_left = 0  # jobs whose snapshot folder stayed in /dev/shm after their round
    warm_dir = Path(tempfile.mkdtemp(prefix="bench-apply-warm-"))  # the kept seeds' own
    for i in range(repeats):
        for kind in kinds[i % 4 :] + kinds[: i % 4]:
            with tempfile.TemporaryDirectory() as tmp:
                if kind == "shell":
                    shell_launch.append(run_shell_launch(Path(tmp)))
                elif kind == "kept":
                    took, pss = run_kept_launch(Path(tmp), warm_dir)
                    kept_launch.append(took)
                    kept_pss.append(pss)
                else:
                    took, pss = run_tfplan_launch(Path(tmp), warm=kind == "tfplan")
                    (tfplan_launch if kind == "tfplan" else cold_launch).append(took)
                    (warm_pss if kind == "tfplan" else cold_pss).append(pss)
                shm_left += os.path.exists(snapshots_of(Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            teardown.append(run_teardown(Path(tmp)))
            shm_left += os.path.exists(snapshots_of(Path(tmp)))
        with tempfile.TemporaryDirectory() as tmp:
            secs, remaining = run_destroy(Path(tmp))
            destroyed.append(secs)
            left.append(remaining)
            shm_left += os.path.exists(snapshots_of(Path(tmp)))
        print(
            f"round {i + 1}: tfplan {tfplan_launch[-1]:.2f}s cold {cold_launch[-1]:.2f}s "
            f"kept {kept_launch[-1]:.2f}s "
            f"shell {shell_launch[-1]:.2f}s "
            f"teardown {teardown[-1]:.2f}s destroy {destroyed[-1]:.2f}s left {left[-1]}",
            flush=True,
        )
    kill_groups(kept_groups(warm_dir))  # the kept seed ends with the benchmark
    shutil.rmtree(warm_dir, ignore_errors=True)
    load_end = os.getloadavg()
    med = statistics.median
    ratio = med(tfplan_launch) / med(shell_launch)
    cold_ratio = med(cold_launch) / med(shell_launch)
    mib = 1024 * 1024
    rows = [
        ("launch -> first step of every worker, tfplan apply", f"{med(tfplan_launch):.2f} s", ""),
        (
            "launch -> first step of every worker, tfplan apply cluster.warm=false",
            f"{med(cold_launch):.2f} s",
            "",
        ),
        (
            "launch -> first step of every worker, tfplan apply with a seed kept from an "
            "earlier apply (cluster.warm_keep_secs)",
            f"{med(kept_launch):.2f} s",
            "",
        ),
        ("launch -> first step of every worker, shell script", f"{med(shell_launch):.2f} s", ""),
        (
            "ratio tfplan (warm) / shell (target <= 0.8)",
            f"{ratio:.2f}x",
            "pass" if ratio <= 0.8 else "MISS",
        ),
        ("ratio tfplan cold / shell", f"{cold_ratio:.2f}x", ""),
        (
            "ratio tfplan with a kept seed / shell",
            f"{med(kept_launch) / med(shell_launch):.2f}x",
            "",
        ),
        (
            "PSS of the running cluster (tasks + seed), warm / cold",
            f"{med(warm_pss) / mib:.0f} MiB / {med(cold_pss) / mib:.0f} MiB",
            "",
        ),
        (
            "PSS of the running cluster with a kept seed (tasks + the kept seed)",
            f"{med(kept_pss) / mib:.0f} MiB",
            "",
        ),
        (
            "training done -> all tasks exited, apply returned (target <= 1 s)",
            f"{med(teardown):.2f} s",
            "pass" if med(teardown) <= 1 else "MISS",
        ),
        (
            "tfplan destroy of a running cluster (target <= 2 s)",
            f"{med(destroyed):.2f} s",
            "pass" if med(destroyed) <= 2 else "MISS",
        ),
        (
            "processes left after destroy (all rounds)",
            str(sum(left)),
            "pass" if not sum(left) else "MISS",
        ),
        (
            "snapshot folders left in /dev/shm (all rounds and runs)",
            str(shm_left),
            "pass" if not shm_left else "MISS",
        ),
    ]
    text = [
        "# Benchmark: apply, teardown, destroy",
        "",
        f"`.venv/bin/python bench/bench_apply.py --repeats {repeats}` on {platform.node()} "
        f"({os.cpu_count()} cores), {time.strftime('%Y-%m-%d')}. cluster=local (1 ps + 2 "
        "workers), MLP on digits. Medians of the rounds; tfplan and the shell script alternate. "
        "Load average (1/5/15 min) at the start "
        + "/".join(f"{x:.1f}" for x in load_start)
        + ", at the end "
        + "/".join(f"{x:.1f}" for x in load_end)
        + " (the cluster itself runs 3 TensorFlow processes on these cores).",
        "",
        "| measure | median | target |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in rows],
        "",
        "Raw (s): tfplan "
        + ", ".join(f"{x:.2f}" for x in tfplan_launch)
        + "; cold "
        + ", ".join(f"{x:.2f}" for x in cold_launch)
        + "; kept seed "
        + ", ".join(f"{x:.2f}" for x in kept_launch)
        + "; shell "
        + ", ".join(f"{x:.2f}" for x in shell_launch)
        + "; teardown "
        + ", ".join(f"{x:.2f}" for x in teardown)
        + "; destroy "
        + ", ".join(f"{x:.2f}" for x in destroyed),
        "",
        "The shell script starts the very same commands in the same folders with the same "
        "environment (`{**plan.env, **task.env}` from the saved plan, and each task's TF_CONFIG "
        "from `tfplan show --task NAME --json`), run.yaml and code, all written before its clock "
        "starts, so the ratio is tfplan's own overhead: composing the config, preflight, "
        "shipping files, and recording PIDs. With warm starts tfplan imports TensorFlow once "
        "per host (the seed, started while tfplan stages) instead of once per task, all at "
        "once on the same cores: that is how it beats the script.",
        "",
    ]
    options.out.write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
