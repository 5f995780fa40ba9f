"""Benchmark `tfplan apply cluster=slurm` against the same tasks started by hand with srun.

    sudo .venv/bin/python bench/bench_slurm.py [--repeats 3] [--out docs/bench_slurm.md]

(``--repeats 1 --job-end-steps 20`` is the quickest run to the end; ``--slurm-conf FILE``
uses a test bed that already runs instead of starting one.)

On a real Slurm (the test bed of tests/slurm_testbed.py: slurmctld + three slurmd in network
namespaces; root needed), downpour with 1 ps + 2 workers, one task per node, alternating:
- apply -> the first training step of every worker, tfplan (warm starts, the default: a seed step
  per node forks each task; and cold, `cluster.warm=false`) vs a shell script that does what a
  user would type: sbatch a holder job, wait until it runs, then one `srun --jobid ... --overlap`
  per task with the same command, environment (TF_CONFIG included) and files, taken from the
  saved plan and `tfplan show --task NAME --json` (ratio of medians; target <= 0.9x warm);
- training done (the chief's process ended) -> the job gone from squeue (target <= 2 s).
Writes docs/bench_slurm.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import yaml
from _planned import planned_tasks, stage, tf_config_text

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


def args(steps: int, warm: bool = True) -> list[str]:
    return [
        "cluster=bed",
        f"cluster.warm={str(warm).lower()}",
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


def run_tfplan(tmp: Path, bed: SlurmTestbed, warm: bool = True) -> float:
    env = conf(tmp, bed)
    started = time.monotonic()
    try:
        subprocess.run(
            [*TFPLAN, "apply", "--auto-approve", "--detach", *args(100000, warm)],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
        )
        return wait_first_steps(tmp / "work", started)
    finally:
        subprocess.run(
            [*TFPLAN, "destroy", "--auto-approve"],
            cwd=tmp,
            env=env,
            check=True,
            capture_output=True,
        )


def _dq(text: str) -> str:
    """``text`` inside a shell's double quotes."""
    return '"' + "".join("\\" + c if c in '\\"$`' else c for c in text) + '"'


def run_by_hand(tmp: Path, bed: SlurmTestbed) -> float:
    """sbatch + wait + one srun per task, with the commands, environment and files tfplan
    would use: each task's whole environment from `tfplan show --task NAME --json`, its
    TF_CONFIG the plan's cluster spec with each ``node-<i>`` replaced by the address of the
    job's i-th node (`scontrol show node`), as a user's script would do."""
    env = conf(tmp, bed)
    plan, tasks = planned_tasks(tmp, env, args(100000))
    stage(plan)
    hosts = [h["name"] for h in plan["hosts"]]
    lines = [
        "set -e",
        f"cd {shlex.quote(str(tmp))}",
        f"job=$(sbatch --parsable --nodes={len(hosts)} --ntasks-per-node=1 "
        f"--partition={bed.partition} --output=/dev/null --wrap 'exec sleep infinity')",
        'while [ "$(squeue -h -j $job -o %T)" != RUNNING ]; do sleep 0.05; done',
        'nodes=$(scontrol show hostnames "$(squeue -h -j $job -o %N)")',
        "addr() { scontrol -o show node \"$1\" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p'; }",
    ]
    for i in range(len(hosts)):  # node-<i> is the job's i-th node
        lines.append(f'n{i}=$(echo "$nodes" | sed -n {i + 1}p); a{i}=$(addr "$n{i}")')
    for task in tasks:
        tf_config = task["tf_config"] or {
            "cluster": {name: ends for name, ends in plan["cluster_spec"].items() if ends},
            "task": {"index": task["index"], "type": task["role"]},
        }
        text = tf_config_text(tf_config)
        for i, host in enumerate(hosts):
            text = text.replace(f'"{host}:', f'"@a{i}@:')
        tf_env = _dq(text)
        for i in range(len(hosts)):
            tf_env = tf_env.replace(f"@a{i}@", f"${{a{i}}}")
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in task["env"].items())
        command = " ".join(shlex.quote(w) for w in task["command"])
        node = hosts.index(task["host"])
        lines.append(
            f"env {exports} TF_CONFIG={tf_env} setsid srun --jobid=$job --overlap -N1 -n1 "
            f"--nodelist=$n{node} --chdir={shlex.quote(task['workdir'])} "
            f"{command} > {shlex.quote(task['log_path'])} 2>&1 < /dev/null &"
        )
    lines.append("echo $job")
    script = tmp / "by_hand.sh"
    script.write_text("\n".join(lines) + "\n")
    started = time.monotonic()
    done = subprocess.run(["sh", str(script)], env=env, check=True, capture_output=True, text=True)
    job = done.stdout.strip().splitlines()[-1]
    try:
        return wait_first_steps(tmp / "work", started)
    finally:
        bed.run("scancel", job)
        deadline = time.monotonic() + 30
        while bed.run("squeue", "-h", "-j", job, check=False).stdout.strip():
            assert time.monotonic() < deadline, "by-hand job did not end"
            time.sleep(0.05)


def run_job_end(tmp: Path, bed: SlurmTestbed, steps: int = 200) -> float:
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
        [*TFPLAN, "apply", "--auto-approve", *args(steps)],
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
    parser.add_argument(
        "--job-end-steps", type=int, default=200, help="steps of the run whose end is timed"
    )
    parser.add_argument(
        "--slurm-conf",
        type=Path,
        help="the slurm.conf of a Slurm test bed that already runs (tests/slurm_testbed.py, "
        "e.g. the tests' own), instead of starting one",
    )
    opts = parser.parse_args()
    if os.geteuid() != 0 and opts.slurm_conf is None:
        print("bench_slurm needs root (network namespaces for the Slurm test bed)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as scratch:
        if opts.slurm_conf is not None:
            bed = SlurmTestbed.attach(opts.slurm_conf)
        else:
            bed = SlurmTestbed(Path(scratch) / "bed")
        try:
            if opts.slurm_conf is None:
                bed.start()
                bed.wait_ready()
            tfplan_s, cold_s, hand_s, end_s = [], [], [], []
            for round_ in range(opts.repeats):
                for name, fn, sink in (
                    ("tfplan", run_tfplan, tfplan_s),
                    ("tfplan cold", partial(run_tfplan, warm=False), cold_s),
                    ("by hand", run_by_hand, hand_s),
                    ("job end", partial(run_job_end, steps=opts.job_end_steps), end_s),
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
    cold_ratio = statistics.median(cold_s) / statistics.median(hand_s)
    per_round = [a / b for a, b in zip(tfplan_s, hand_s, strict=True)]
    end = statistics.median(end_s)
    text = f"""# Benchmark: tfplan apply on Slurm

`sudo .venv/bin/python bench/bench_slurm.py --repeats {opts.repeats}` on {platform.node()} ({os.cpu_count()} cores), {time.strftime("%Y-%m-%d")}. The real Slurm test bed (slurmctld + 3 slurmd in network namespaces, Slurm's default 3 s batch scheduling delay), downpour with 1 ps + 2 workers, one task per node. Medians; tfplan (warm, cold) and the by-hand script alternate in each round.

| measure | median | target |
|---|---|---|
| apply -> first step of every worker, tfplan (warm starts, the default) | {statistics.median(tfplan_s):.2f} s |  |
| the same, tfplan with `cluster.warm=false` (each program imports TensorFlow in its step) | {statistics.median(cold_s):.2f} s |  |
| the same tasks by hand (sbatch, wait, srun per task) | {statistics.median(hand_s):.2f} s |  |
| ratio of the medians, tfplan warm / by hand (target <= 0.9) | {ratio:.2f}x | {"pass" if ratio <= 0.9 else "MISSED"} |
| median of the per-round ratios, warm | {statistics.median(per_round):.2f}x | {"pass" if statistics.median(per_round) <= 0.9 else "MISSED"} |
| ratio of the medians, tfplan cold / by hand (reference: 1.2) | {cold_ratio:.2f}x | {"pass" if cold_ratio <= 1.2 else "MISSED"} |
| training done (chief exited) -> job gone from squeue (target <= 2 s) | {end:.2f} s | {"pass" if end <= 2 else "MISSED"} |

Raw (s): tfplan {", ".join(f"{v:.2f}" for v in tfplan_s)}; tfplan cold {", ".join(f"{v:.2f}" for v in cold_s)}; by hand {", ".join(f"{v:.2f}" for v in hand_s)}; per-round ratios {", ".join(f"{v:.2f}" for v in per_round)}; job end {", ".join(f"{v:.2f}" for v in end_s)}

The by-hand script starts the very commands tfplan plans, with the same environment, run.yaml and code, through the same Slurm commands a user would type, so the ratio is tfplan's own overhead: composing the config, `sbatch --test-only`, staging and the per-node check (one srun per node), and recording every step. Warm, the seed steps start as soon as the job runs and import TensorFlow while tfplan stages the code and checks the nodes; each task's step then has its node's seed fork the program (docs/backends.md, "Warm starts on Slurm"), so the import is overlapped with tfplan's own work instead of following it.
"""
    Path(opts.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
