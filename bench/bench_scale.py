"""What supervising N tasks costs: the machine's CPU, processes, and tfplan's own footprint.

    .venv/bin/python bench/bench_scale.py [--sizes 3,10,100,150,1000] [--baseline DIR]
        [--ssh-hosts 10 --ssh-tasks 100] [--training-repeats 3] [--out docs/bench_scale.md]

Every task is a program that waits for a signal (``sleep``), started with ``tfplan apply
--detach`` on this machine and supervised by the background supervisor. For each N:
- the whole machine's busy fraction while the N tasks are supervised, minus the same machine
  measured just before with nothing running (``--measure`` seconds each), and the CPU of
  tfplan's own process tree (the supervisor and its host watchers) over the same window;
- processes tfplan adds per task (processes on the machine minus N programs, per task);
- the supervisor's RSS and threads;
- apply until every task runs, ``tfplan status`` (a new process, one query per host), and
  ``tfplan destroy`` (with the processes of the recorded groups left after it: goal 0).
``--baseline DIR`` runs the same sizes (up to ``--baseline-max``) from an older checkout,
alternating, so before/after come from the same minutes of a shared machine. ``--ssh-hosts``
builds that many hosts in network namespaces (root) with sshd each and runs ``--ssh-tasks`` on
each. The training section runs hogwild and downpour on the default local cluster through
``tfplan apply`` (supervised, as a user runs it), this code and the baseline alternately, and
compares the chief's examples/s. Writes a Markdown report and a plot beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import free_port_base  # noqa: E402
from scale_helpers import (  # noqa: E402
    ScaleRun,
    group_sizes,
    local_cluster,
    machine_busy,
    netns_cluster,
    processes_on_machine,
    tree_usage,
)

CORES = os.cpu_count() or 1


@dataclass
class Point:
    code: str  # "new" | "baseline"
    where: str  # "local" | "ssh HxT"
    tasks: int
    idle_busy: float  # machine busy fraction with nothing running
    busy: float  # while the tasks are supervised
    tfplan_cpu: float  # tfplan's own tree, fraction of the machine
    added_per_task: float  # processes in each task's group beside its program (the wrapper)
    per_host_other: float  # other processes the run added, per host (watcher, sshd sessions)
    rss_mib: float
    threads: int
    tfplan_processes: int
    apply_secs: float
    status_secs: float
    destroy_secs: float
    left: int
    status_running: int  # tasks `tfplan status` saw running (all of them, or it failed)
    status_note: str  # why one was not seen running

    @property
    def added_busy(self) -> float:
        return max(0.0, self.busy - self.idle_busy)


def measure(
    where: str,
    hosts: int,
    tasks: int,
    env: dict[str, str],
    tmp: Path,
    settle: float,
    window: float,
    baseline: Path | None,
) -> Point:
    code = "baseline" if baseline is not None else "new"
    run = ScaleRun(tmp, env, python_path=baseline)
    idle = machine_busy(window)
    before = processes_on_machine()
    try:
        apply_secs = run.apply()
        pid = run.supervisor_pid()
        if pid is None:
            raise RuntimeError("no background supervisor recorded")
        time.sleep(settle)
        first = tree_usage(pid)
        busy = machine_busy(window)
        last = tree_usage(pid)
        during = processes_on_machine()
        groups = run.groups()
        in_groups = sum(group_sizes(groups).values())
        status_secs, status = run.status()
        rows = status.get("tasks", [])
        running = sum(1 for t in rows if t.get("state") == "running")
        odd = next((t for t in rows if t.get("state") != "running"), None)
        note = f"{odd['state']}: {odd['detail']}"[:120] if odd else ""
        destroy_secs = run.destroy()
        left = _alive_in(groups)
    finally:
        run.cleanup()
    return Point(
        code=code,
        where=where,
        tasks=tasks,
        idle_busy=idle,
        busy=busy,
        tfplan_cpu=(last.cpu_secs - first.cpu_secs) / (window * CORES),
        added_per_task=(in_groups - tasks) / tasks,
        per_host_other=(during - before - in_groups) / hosts,
        rss_mib=last.rss / 2**20,
        threads=last.threads,
        tfplan_processes=last.processes,
        apply_secs=apply_secs,
        status_secs=status_secs,
        destroy_secs=destroy_secs,
        left=left,
        status_running=running,
        status_note=note,
    )


def _alive_in(groups: list[int]) -> int:
    return sum(group_sizes(groups).values())


def local_points(
    sizes: list[int], baseline: Path | None, baseline_max: int, settle: float, window: float
) -> list[Point]:
    points = []
    for i, n in enumerate(sizes):
        codes: list[Path | None] = [None]
        if baseline is not None and n <= baseline_max:
            codes = [None, baseline] if i % 2 == 0 else [baseline, None]
        for code in codes:
            with tempfile.TemporaryDirectory() as tmp:
                conf = (code or REPO) / "conf"
                env = local_cluster(Path(tmp), n, tfplan_conf=conf)
                point = measure("local", 1, n, env, Path(tmp), settle, window, code)
            points.append(point)
            print(_line(point), flush=True)
    return points


def ssh_point(hosts: int, per_host: int, settle: float, window: float) -> Point:
    from testbed import NetnsTestbed

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bed").mkdir()
        bed = NetnsTestbed(Path(tmp) / "bed", count=hosts, tag="s")
        try:
            bed.setup()
            env = netns_cluster(Path(tmp), bed, per_host)
            where = f"ssh {hosts}x{per_host}"
            point = measure(where, hosts, hosts * per_host, env, Path(tmp), settle, window, None)
        finally:
            bed.teardown()
    print(_line(point), flush=True)
    return point


def _line(p: Point) -> str:
    return (
        f"{p.code:8} {p.where:10} N={p.tasks:5}: machine +{100 * p.added_busy:5.1f}% "
        f"(tfplan {100 * p.tfplan_cpu:4.1f}%), {p.added_per_task:.2f} proc/task, "
        f"{p.per_host_other:.1f} other/host, "
        f"RSS {p.rss_mib:.0f} MiB, {p.threads} threads, apply {p.apply_secs:.1f}s, "
        f"status {p.status_secs:.1f}s ({p.status_running} running), "
        f"destroy {p.destroy_secs:.1f}s, left {p.left} {p.status_note}"
    )


# ---- training throughput, supervised by tfplan ---------------------------------------------


def train_once(algo: str, steps: int, code: Path | None) -> float:
    """examples/s of one supervised run of the default local cluster (chief's result.json)."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TFPLAN_CONF": str((code or REPO) / "conf")}
        env.pop("TFPLAN_DEBUG", None)
        if code is not None:
            env["PYTHONPATH"] = str(code)
        args = [
            "experiment.id=train",
            f"algo={algo}",
            f"cluster.port_base={free_port_base(10)}",
            "cluster.port_range=10",
            f"cluster.workdir={tmp}/work",
            f"cluster.output_dir={tmp}/out",
            f"trainer.max_steps={steps}",
            f"trainer.checkpoint_steps={steps}",
        ]
        done = subprocess.run(
            [sys.executable, "-m", "tfplan", "apply", "--auto-approve", *args],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"{algo} training failed:\n{done.stdout[-2000:]}{done.stderr}")
        result = json.loads((Path(tmp) / "out" / "result.json").read_text())
        return float(result["examples_per_sec"])


def training(
    baseline: Path, repeats: int, steps: int
) -> dict[str, tuple[list[float], list[float]]]:
    out: dict[str, tuple[list[float], list[float]]] = {}
    for algo in ("hogwild", "downpour"):
        new: list[float] = []
        old: list[float] = []
        for i in range(repeats):
            order = [(None, new), (baseline, old)]
            for code, into in order if i % 2 == 0 else reversed(order):
                into.append(train_once(algo, steps, code))
            print(f"{algo} round {i + 1}: new {new[-1]:.0f} ex/s, before {old[-1]:.0f}", flush=True)
        out[algo] = (new, old)
    return out


# ---- report ----------------------------------------------------------------------------------


def plot(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for code, style in (("baseline", "o--"), ("new", "o-")):
        mine = sorted((p for p in points if p.code == code and p.where == "local"), key=_n)
        if not mine:
            continue
        label = "before" if code == "baseline" else "now"
        left.plot([p.tasks for p in mine], [100 * p.added_busy for p in mine], style, label=label)
        if code == "new":
            right.plot([p.tasks for p in mine], [p.rss_mib for p in mine], "o-", label="RSS MiB")
            right.plot([p.tasks for p in mine], [p.threads for p in mine], "s-", label="threads")
    for axis in (left, right):
        axis.set_xscale("log")
        axis.set_xlabel("idle tasks supervised on one host")
        axis.legend()
        axis.grid(True, alpha=0.3)
    left.set_ylabel("machine busy above idle (%)")
    left.set_title("CPU spent supervising idle tasks")
    right.set_title("the supervisor's footprint")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def _n(p: Point) -> int:
    return p.tasks


def report(
    points: list[Point],
    trained: dict[str, tuple[list[float], list[float]]] | None,
    args: argparse.Namespace,
    load: tuple[tuple[float, ...], tuple[float, ...]],
    png: Path,
) -> str:
    lines = [
        "# Supervision at scale (bench/bench_scale.py)",
        "",
        f"Machine: {platform.machine()}, {CORES} cores, Python {platform.python_version()}; "
        f"load average {load[0][0]:.2f} before, {load[1][0]:.2f} after. "
        f"Measured {args.measure:.0f} s per figure after {args.settle:.0f} s settling; "
        "one run per point (before and after alternate).",
        "",
        f"Command: `.venv/bin/python bench/bench_scale.py {' '.join(sys.argv[1:])}`".rstrip(),
        "",
        *(
            [f"Before: the checkout given as `--baseline`, at commit {_commit(args.baseline)}.", ""]
            if args.baseline
            else []
        ),
        "Every task is `sleep` (it waits for a signal), started by `tfplan apply --detach` "
        "and supervised by the background supervisor. *Machine busy* is the whole machine "
        "(all cores) above the same machine measured just before with nothing running; "
        "*tfplan* is the CPU of the supervisor and its host watchers alone. *Processes per "
        "task*: what each task's process group holds beside its program (tfplan's wrapper, "
        "which records the exit status); *other per host*: every other process the run added "
        "to the machine, per host (the host's watcher; over SSH the sshd sessions; and "
        "whatever else the machine started meanwhile).",
        "",
        "| code | where | tasks | machine busy | tfplan CPU | processes per task | "
        "other per host | supervisor RSS | threads | tfplan processes | apply | status | "
        "status saw running | destroy | left |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in points:
        lines.append(
            f"| {'before' if p.code == 'baseline' else 'now'} | {p.where} | {p.tasks} | "
            f"{100 * p.added_busy:.1f} % | {100 * p.tfplan_cpu:.2f} % | {p.added_per_task:.2f} | "
            f"{p.per_host_other:.1f} | {p.rss_mib:.0f} MiB | {p.threads} | {p.tfplan_processes} | {p.apply_secs:.1f} s | "
            f"{p.status_secs:.2f} s | {p.status_running} | {p.destroy_secs:.2f} s | {p.left} |"
        )
    failed = [p for p in points if p.status_running != p.tasks]
    for p in failed:
        lines.append("")
        lines.append(
            f"`tfplan status` of {p.tasks} tasks ({'before' if p.code == 'baseline' else 'now'}, "
            f"{p.where}) saw {p.status_running} running; the first other row said: "
            f"`{p.status_note}`"
        )
    lines += ["", f"![CPU and footprint against tasks]({png.name})", ""]
    lines += goals(points)
    if trained:
        lines += [
            "",
            "## Training, supervised by tfplan",
            "",
            f"`tfplan apply` of the default local cluster (1 ps, 2 workers, MLP), "
            f"{args.training_steps} steps, this code and the baseline alternately, "
            f"{args.training_repeats} runs each; the chief's examples/s, medians.",
            "",
            "| algorithm | now | before | now / before | runs now | runs before |",
            "|---|---|---|---|---|---|",
        ]
        for algo, (new, old) in trained.items():
            a, b = statistics.median(new), statistics.median(old)
            lines.append(
                f"| {algo} | {a:.0f} | {b:.0f} | {f'{a / b:.2f}x' if b else '-'} | "
                f"{', '.join(f'{x:.0f}' for x in new)} | {', '.join(f'{x:.0f}' for x in old)} |"
            )
    return "\n".join(lines) + "\n"


def _commit(folder: Path) -> str:
    done = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return done.stdout.strip() or "(not a git checkout)"


def goals(points: list[Point]) -> list[str]:
    now = [p for p in points if p.code == "new"]
    out = ["## Against the goals", ""]
    near150 = min((p for p in now if p.where == "local"), key=lambda p: abs(p.tasks - 150))
    out.append(
        f"- {near150.tasks} idle tasks: machine busy +{100 * near150.added_busy:.1f} % "
        f"(goal at most 2 %), tfplan itself {100 * near150.tfplan_cpu:.2f} %."
    )
    small = min((p for p in now if p.where == "local"), key=_n)
    out.append(
        f"- {small.tasks} tasks: +{100 * small.added_busy:.1f} % (goal: below the noise; "
        f"the idle machine itself read {100 * small.idle_busy:.1f} %)."
    )
    per_task = max(p.added_per_task for p in now)
    out.append(f"- processes tfplan adds per task: at most {per_task:.2f} (goal <= 1).")
    for p in now:
        if p.where.startswith("ssh"):
            out.append(
                f"- {p.where} over SSH: apply {p.apply_secs:.1f} s (goal <= 30), status "
                f"{p.status_secs:.2f} s (goal <= 2), destroy {p.destroy_secs:.1f} s "
                f"(goal <= 10), {p.left} left (goal 0)."
            )
    local = sorted((p for p in now if p.where == "local"), key=_n)
    out.append(
        "- supervisor against N (local): "
        + ", ".join(f"{p.tasks}: {p.rss_mib:.0f} MiB / {p.threads} threads" for p in local)
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    ap.add_argument("--sizes", default="3,10,100,150,1000")
    ap.add_argument("--baseline", type=Path, help="an older checkout, run alternately")
    ap.add_argument("--baseline-max", type=int, default=150)
    ap.add_argument("--ssh-hosts", type=int, default=10, help="0: no SSH measure")
    ap.add_argument("--ssh-tasks", type=int, default=100)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--measure", type=float, default=10.0)
    ap.add_argument("--training-repeats", type=int, default=3, help="0: no training measure")
    ap.add_argument("--training-steps", type=int, default=3000)
    ap.add_argument("--out", type=Path, default=REPO / "docs" / "bench_scale.md")
    args = ap.parse_args()
    load0 = os.getloadavg()
    sizes = [int(x) for x in args.sizes.split(",")]
    baseline = args.baseline.resolve() if args.baseline else None
    points = local_points(sizes, baseline, args.baseline_max, args.settle, args.measure)
    if args.ssh_hosts:
        points.append(ssh_point(args.ssh_hosts, args.ssh_tasks, args.settle, args.measure))
    trained = None
    if baseline is not None and args.training_repeats:
        trained = training(baseline, args.training_repeats, args.training_steps)
    png = args.out.with_suffix(".png")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(points, png)
    args.out.write_text(report(points, trained, args, (load0, os.getloadavg()), png))
    print(f"wrote {args.out} and {png}")


if __name__ == "__main__":
    main()
