"""Benchmark `tfplan apply cluster=slurm` against the same tasks started by hand with srun.

    sudo .venv/bin/python bench/bench_slurm.py [--repeats 3]

On a real Slurm (the test bed of tests/slurm_testbed.py: slurmctld + three slurmd in network
namespaces; root needed), downpour with 1 ps + 2 workers, one task per node, alternating:
- apply -> the first training step of every worker, tfplan vs a shell script that does what a
  user would type: sbatch a holder job, wait until it runs, then one `srun --jobid ... --overlap`
  per task with the same command, environment and files (ratio of medians; target <= 1.2x);
- training done (the chief's process ended) -> the job gone from squeue (target <= 2 s).
Writes docs/bench_slurm.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from slurm_testbed import SlurmTestbed  # noqa: E402

TFPLAN = [sys.executable, "-m", "tfplan"]


def conf(tmp: Path, bed: SlurmTestbed) -> dict[str, str]:
    """A copy of conf/ with a cluster for the bed; the environment that selects it."""
    import shutil

    target = tmp / "conf"
    shutil.copytree(REPO / "conf", target)
    cluster = {
        "defaults": ["schema_cluster", "_self_"],
        "name": "bed",
        "backend": "slurm",
        "ps": 1,
        "workers": 2,
        "python": sys.executable,
        "workdir": str(tmp / "work"),
        "output_dir": str(tmp / "out"),
        "options": {"nodes": 3, "tasks_per_node": 1, "partition": bed.partition},
    }
    (target / "cluster" / "bed.yaml").write_text(yaml.safe_dump(cluster, sort_keys=False))
    return {**bed.env(), "TFPLAN_CONF": str(target)}


def args(steps: int) -> list[str]:
    return [
        "cluster=bed",
        "experiment.id=bench",
        "algo=downpour",
        f"trainer.max_steps={steps}",
        "trainer.log_steps=1000",
        "trainer.checkpoint_steps=1000",
    ]


def wait_first_steps(work: Path, started: float, timeout: float = 300) -> float:
    logs = [work / f"worker-{i}" / "task.log" for i in (0, 1)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and "step=" in p.read_text(errors="replace") for p in logs):
            return time.monotonic() - started
        time.sleep(0.02)
    raise RuntimeError(f"no first step within {timeout}s under {work}")


def run_tfplan(tmp: Path, bed: SlurmTestbed) -> float:
    env = conf(tmp, bed)
    started = time.monotonic()
    subprocess.run(
        [*TFPLAN, "apply", "--auto-approve", "--detach", *args(100000)],
        cwd=tmp,
        env=env,
        check=True,
        capture_output=True,
    )
    elapsed = wait_first_steps(tmp / "work", started)
    subprocess.run(
        [*TFPLAN, "destroy", "--auto-approve"], cwd=tmp, env=env, check=True, capture_output=True
    )
    return elapsed


def run_by_hand(tmp: Path, bed: SlurmTestbed) -> float:
    """sbatch + wait + one srun per task, with the commands and files tfplan would use."""
    env = conf(tmp, bed)
    plan = json.loads(
        subprocess.run(
            [*TFPLAN, "plan", "--no-save", "--json", *args(100000)],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    code = Path(plan["code_dir"])
    (code).mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-r", str(REPO / "recipes"), str(code)], check=True)
    run_yaml = yaml.safe_dump(plan["run_config"], sort_keys=True)
    lines = [
        "set -e",
        f"cd {shlex.quote(str(tmp))}",
        "job=$(sbatch --parsable --nodes=3 --ntasks-per-node=1 "
        f"--partition={bed.partition} --output=/dev/null --wrap 'exec sleep infinity')",
        'while [ "$(squeue -h -j $job -o %T)" != RUNNING ]; do sleep 0.05; done',
        "nodes=$(scontrol show hostnames $(squeue -h -j $job -o %N))",
        "set -- $nodes",
    ]

    def address(place: str) -> str:
        """node-i -> the i-th node of the job (n1.. on the bed, allocated in order)."""
        return bed.addresses[f"n{int(place.split('-')[1]) + 1}"]

    for i, task in enumerate(plan["tasks"]):
        workdir = task["workdir"]
        Path(workdir).mkdir(parents=True, exist_ok=True)
        Path(workdir, "run.yaml").write_text(run_yaml)
        node_index = int(task["host"].split("-")[1]) + 1
        cluster = {
            role: [f"{address(t['host'])}:{t['port']}" for t in plan["tasks"] if t["role"] == role]
            for role in ("ps", "worker")
        }
        tf_config = json.dumps(
            {"cluster": cluster, "task": {"type": task["role"], "index": task["index"]}}
        )
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in task["env"].items())
        command = " ".join(shlex.quote(w) for w in task["command"])
        lines.append(
            f"env {exports} TF_CONFIG={shlex.quote(tf_config)} setsid srun --jobid=$job "
            f"--overlap -N1 -n1 --nodelist=${node_index} --chdir={shlex.quote(workdir)} "
            f"{command} > {shlex.quote(task['log_path'])} 2>&1 < /dev/null &"
        )
        del i
    lines.append("echo $job")
    script = tmp / "by_hand.sh"
    script.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    done = subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True, text=True)
    elapsed = wait_first_steps(tmp / "work", started)
    job = done.stdout.strip().splitlines()[-1]
    bed.run("scancel", job)
    deadline = time.monotonic() + 30
    while bed.run("squeue", "-h", "-j", job, check=False).stdout.strip():
        assert time.monotonic() < deadline, "by-hand job did not end"
        time.sleep(0.05)
    return elapsed


def run_job_end(tmp: Path, bed: SlurmTestbed) -> float:
    """A short training through tfplan: the chief's end -> the job gone from squeue."""
    env = conf(tmp, bed)
    gone_at: list[float] = []
    job_box: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if not job_box:
                time.sleep(0.02)
                continue
            if not bed.run("squeue", "-h", "-j", job_box[0], check=False).stdout.strip():
                gone_at.append(time.time())
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    proc = subprocess.Popen(
        [*TFPLAN, "apply", "--auto-approve", *args(200)],
        cwd=tmp,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if "submitted Slurm job" in line:
            job_box.append(line.split("submitted Slurm job")[1].split()[0])
    proc.wait()
    watcher.join(30)
    stop.set()
    chief_exit = Path(tmp / "work" / "worker-0" / "exit_code").stat().st_mtime
    if not gone_at:
        raise RuntimeError("the job never left squeue")
    return gone_at[0] - chief_exit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_slurm.md"))
    opts = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_slurm needs root (network namespaces for the Slurm test bed)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as scratch:
        bed = SlurmTestbed(Path(scratch) / "bed")
        try:
            bed.start()
            bed.wait_ready()
            tfplan_s, hand_s, end_s = [], [], []
            for round_ in range(opts.repeats):
                for name, fn, sink in (
                    ("tfplan", run_tfplan, tfplan_s),
                    ("by hand", run_by_hand, hand_s),
                    ("job end", run_job_end, end_s),
                ):
                    with tempfile.TemporaryDirectory(prefix=f"r{round_}-", dir=scratch) as tmp:
                        value = fn(Path(tmp), bed)
                        sink.append(value)
                        print(f"round {round_ + 1} {name}: {value:.2f}s", flush=True)
        finally:
            problems = bed.stop()
            if problems:
                print("bed teardown:", "; ".join(problems), file=sys.stderr)
    ratio = statistics.median(tfplan_s) / statistics.median(hand_s)
    per_round = [a / b for a, b in zip(tfplan_s, hand_s, strict=True)]
    end = statistics.median(end_s)
    text = f"""# Benchmark: tfplan apply on Slurm

`sudo .venv/bin/python bench/bench_slurm.py --repeats {opts.repeats}` on {platform.node()} ({os.cpu_count()} cores), {time.strftime("%Y-%m-%d")}. The real Slurm test bed (slurmctld + 3 slurmd in network namespaces, Slurm's default 3 s batch scheduling delay), downpour with 1 ps + 2 workers, one task per node. Medians; tfplan and the by-hand script alternate in each round.

| measure | median | target |
|---|---|---|
| apply -> first step of every worker, tfplan | {statistics.median(tfplan_s):.2f} s |  |
| the same tasks by hand (sbatch, wait, srun per task) | {statistics.median(hand_s):.2f} s |  |
| ratio of the medians, tfplan / by hand (target <= 1.2) | {ratio:.2f}x | {"pass" if ratio <= 1.2 else "MISSED"} |
| median of the per-round ratios | {statistics.median(per_round):.2f}x | {"pass" if statistics.median(per_round) <= 1.2 else "MISSED"} |
| training done (chief exited) -> job gone from squeue (target <= 2 s) | {end:.2f} s | {"pass" if end <= 2 else "MISSED"} |

Raw (s): tfplan {", ".join(f"{v:.2f}" for v in tfplan_s)}; by hand {", ".join(f"{v:.2f}" for v in hand_s)}; per-round ratios {", ".join(f"{v:.2f}" for v in per_round)}; job end {", ".join(f"{v:.2f}" for v in end_s)}

The by-hand script starts the very commands tfplan plans, with the same environment, run.yaml and code, through the same Slurm commands a user would type, so the ratio is tfplan's own overhead: composing the config, `sbatch --test-only`, staging and the per-node check (one srun per node), and recording every step.
"""
    Path(opts.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
