"""Benchmark `tfplan apply cluster=spark` against the same tasks started by hand with spark-submit.

    sudo .venv/bin/python bench/bench_spark.py [--repeats 3] [--out docs/bench_spark.md]

(``--smoke`` is the quickest run to the end: one round, few steps, a short idle window; its
figures measure nothing.)

On a real Spark standalone cluster started here (the test bed of tests/spark_testbed.py: a master
on a bridge address and three workers in network namespaces; root needed), 1 ps + 2 workers of
the default MLP recipe (hogwild on digits), one task per executor, executors of 1 core and
512 MiB, every client with the bed's environment (its spark-defaults.conf):
1. apply -> every worker's first step: `tfplan apply --auto-approve cluster=spark` against a
   `spark-submit` of a PySpark script written here that starts the same three tasks itself: a
   barrier stage of one Spark task per executor, each computing TF_CONFIG from the executors'
   addresses (``BarrierTaskContext.getTaskInfos()``) and running the task's command as a
   subprocess with the environment `tfplan show --task NAME --json` gives and the run.yaml
   tfplan wrote; alternating, one round of each after the other (ratio of medians; goal
   <= 1.2x). Where apply's time goes: from its own lines (submitted, agents registered, tasks
   started) and the warm seeds' files; the script's from the events its driver and tasks note.
2. A ps SIGKILLed inside its executor (its program's PID from the state) during paced training
   (``TFPLAN_STEP_PAUSE_SECS``) of a job started with `tfplan apply --detach`: the kill -> the
   chief's "ps/0 restored from its snapshot" line and its next step line (goal: training again
   within 5 s), from the tasks' own logs, and the steps lost (the highest
   global step any line gave before the restore: the chief's "saw step N", a worker's "back
   from global step N", the progress lines; against the step restored).
3. `tfplan destroy` of that job once it trains again (goal <= 3 s), its lines timed, and until
   nothing is left: no process on any worker host, the application completed on the master.
4. What a waiting Spark cluster costs: the master's and each worker daemon's RSS and CPU over
   an idle window (/proc); and, while the job of 2. trains, the executors' JVMs beside the
   TensorFlow tasks (RSS and PSS, summed over the worker hosts) and the driver on this machine.
Each round: tfplan's launch and the by-hand one (alternating which goes first), then the job.
Writes docs/bench_spark.md (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _planned import planned_tasks, stage
from bench_reliability import BACK, STEP

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import kill_groups, paced, recorded_groups, state_of  # noqa: E402
from chaos_helpers import ApplyRun  # noqa: E402
from spark_testbed import SparkTestbed, spark_missing  # noqa: E402

TFPLAN = [sys.executable, "-m", "tfplan"]
EXPERIMENT = "bench"
WORKERS = ("worker/0", "worker/1")
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
MIB = 2**20
GOALS = {"ratio": 1.2, "back": 5.0, "destroy": 3.0}
RESTORED = re.compile(r"ps/0 restored from its (snapshot|checkpoint) of step ([\d,]+)")
SAW = re.compile(r"the chief saw step ([\d,]+)")
DESTROY_PHASES = (
    ("the background supervisor stopped", r"taking over from the supervisor"),
    ("the tasks stopped", r"\| Stopped "),
    ("the application released (driver ended)", r"released allocation"),
    ("destroy's last line", r"Destroy complete"),
)

# The by-hand launcher: what a user who knows Spark would write to start the plan's tasks.
BY_HAND_APP = '''"""Start a TensorFlow cluster on Spark by hand: one Spark task per executor (a barrier
stage, so all run at once and know each other's addresses), each running its TensorFlow task as
a subprocess with TF_CONFIG built from the executors' addresses. Ends when the tasks end."""
import json
import os
import subprocess
import sys
import time

from pyspark import BarrierTaskContext
from pyspark.sql import SparkSession

spec = json.load(open(sys.argv[1]))
events = sys.argv[2]


def note(what):
    with open(events, "a") as out:
        out.write(json.dumps({"what": what, "at": time.time()}) + "\\n")


spark = SparkSession.builder.appName(spec["name"]).getOrCreate()
note("context")  # minRegisteredResourcesRatio=1: every executor registered
places = spec["places"]


def run(_):
    context = BarrierTaskContext.get()
    hosts = [info.address.rsplit(":", 1)[0] for info in context.getTaskInfos()]
    cluster = {
        role: [hosts[places.index(end.rsplit(":", 1)[0])] + ":" + end.rsplit(":", 1)[1]
               for end in ends]
        for role, ends in spec["cluster_spec"].items() if ends
    }
    task = next(t for t in spec["tasks"] if t["host"] == places[context.partitionId()])
    tf_config = {"cluster": cluster, "task": {"index": task["index"], "type": task["role"]}}
    env = dict(os.environ, **task["env"])
    env["TF_CONFIG"] = json.dumps(tf_config, sort_keys=True, separators=(",", ":"))
    with open(task["log_path"], "ab") as log:
        proc = subprocess.Popen(
            task["command"], cwd=task["workdir"], env=env, stdin=subprocess.DEVNULL,
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    with open(os.path.join(task["workdir"], "pid"), "w") as out:
        out.write(str(proc.pid))
    note("started " + task["name"])
    yield task["name"], proc.wait()  # the ps ends once every worker said it is done


n = len(places)
print(spark.sparkContext.parallelize(range(n), n).barrier().mapPartitions(run).collect())
spark.stop()
'''


@dataclass
class Options:
    steps: int  # of the runs whose first steps are timed
    fault_at: int  # the chief's step at which the ps is killed
    pause: float  # TFPLAN_STEP_PAUSE_SECS of the kill and destroy runs
    backoff: float | None  # lifecycle.restart.backoff_secs (None: the default)


@dataclass
class Launch:
    """One launch: seconds from the command's start to each worker's first step, and to the
    phases before it."""

    first: dict[str, float]
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def every(self) -> float:
        return max(self.first.values())


@dataclass
class Kill:
    at_step: int  # the global step at the kill (the highest any line gives)
    restored: int  # the step the ps was restored to
    source: str  # snapshot or checkpoint
    stages: dict[str, float]  # seconds from the kill to: seen, restarted, serving, restored, step


@dataclass
class Destroy:
    secs: float  # `tfplan destroy` itself
    clean: float  # destroy's start -> no process on any worker host and the application completed
    left: int  # processes on the worker hosts when destroy returned
    stopped: str  # destroy's summary line
    phases: dict[str, float]  # seconds from destroy's start to its lines (DESTROY_PHASES)


def spark_args(ws: Path, bed: SparkTestbed, steps: int, *extra: str) -> list[str]:
    return [
        "cluster=spark",
        f"experiment.id={EXPERIMENT}",
        f"cluster.python={sys.executable}",
        f"cluster.workdir={ws / 'work'}",
        f"cluster.output_dir={ws / 'out'}",
        f"cluster.options.master={bed.master_url}",
        f"cluster.options.driver_host={bed.driver_host}",
        f"cluster.options.master_web_url={bed.web_url}",
        "cluster.options.executors=3",
        "cluster.options.tasks_per_executor=1",
        "cluster.options.executor_cores=1",
        "cluster.options.executor_memory=512m",
        "cluster.options.start_timeout_secs=300",
        "lifecycle.stop_grace_secs=2",
        f"lifecycle.snapshot_dir={ws / 'shm'}",  # the snapshots in the round's own folder
        f"trainer.max_steps={steps}",
        *extra,
    ]


def client_env(bed: SparkTestbed) -> dict[str, str]:
    """The bed's client environment (its SPARK_CONF_DIR, SPARK_LOCAL_IP) for both sides."""
    env = {k: v for k, v in bed.env().items() if not k.startswith("TFPLAN_")}
    return {**env, "TFPLAN_CONF": str(REPO / "conf")}


def first_steps(
    work: Path, began: float, timeout: float = 300, stop: Any = None
) -> dict[str, float]:
    """Seconds from ``began`` (monotonic) to the first ``step=`` line of each worker's log."""
    logs = {name: work / name.replace("/", "-") / "task.log" for name in WORKERS}
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(logs):
        for name, log in logs.items():
            if name not in seen and log.exists() and "step=" in log.read_text(errors="replace"):
                seen[name] = time.monotonic() - began
        if time.monotonic() > deadline or (stop is not None and stop()):
            raise RuntimeError(f"no first step of {sorted(set(logs) - set(seen))} under {work}")
        time.sleep(0.02)
    return seen


def wait_clean(bed: SparkTestbed, timeout: float = 120, app: str | None = None) -> float:
    """Seconds until no application is active on the master, ``app`` (an id) is among its
    completed ones, and no process is left on any worker host."""
    began = time.monotonic()
    while True:
        state = bed.master_state()
        done = {a["id"] for a in state.get("completedapps", [])}
        if (
            not state.get("activeapps")
            and (app is None or app in done)
            and not any(bed.processes_on_worker(i) for i in range(bed.workers))
        ):
            return time.monotonic() - began
        if time.monotonic() - began > timeout:
            left = {i: bed.processes_on_worker(i) for i in range(bed.workers)}
            raise RuntimeError(f"not clean after {timeout:.0f}s: {state.get('activeapps')} {left}")
        time.sleep(0.05)


def driver_group(ws: Path) -> int | None:
    path = ws / ".tfplan" / EXPERIMENT / "state.json"
    if not path.exists():
        return None
    allocation = json.loads(path.read_text()).get("allocation") or {}
    driver = (allocation.get("data") or {}).get("driver") or {}
    return int(driver["pgid"]) if driver.get("pgid") else None


def cleanup(ws: Path) -> None:
    """What a failed round left: the tasks and seeds by process group, and the driver."""
    groups = recorded_groups(ws)
    driver = driver_group(ws)
    kill_groups([*groups, *([driver] if driver else [])])


def mtime_since(path: Path, wall0: float) -> float | None:
    try:
        return path.stat().st_mtime - wall0
    except OSError:
        return None


def run_tfplan(ws: Path, bed: SparkTestbed, opts: Options) -> Launch:
    """An attached `tfplan apply` of ``opts.steps`` steps, to its end."""
    env = client_env(bed)
    args = [*spark_args(ws, bed, opts.steps), "trainer.log_steps=1000"]
    wall0, began = time.time(), time.monotonic()
    run = ApplyRun(ws, args, env=env)
    try:
        first = first_steps(ws / "work", began, stop=lambda: run.proc.poll() is not None)
        code = run.finish(timeout=600)
        if code != 0:
            raise RuntimeError(f"tfplan apply exited {code}:\n{run.text()[-3000:]}")
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
        cleanup(ws)
    phases = {}
    for name, pattern in (
        ("submitted", "submitted the Spark application"),
        ("agents registered", "runs its agents on"),
    ):
        phases[name] = run.lines[run.wait_for(pattern, 0)][0] - began
    starts = [t for t, line in run.lines if re.search(r": started on executor-\d", line)]
    seeds = sorted((ws / "work" / "_seed").glob("executor-*"))
    started = [mtime_since(s / "started", wall0) for s in seeds]
    ready = [mtime_since(s / "ready", wall0) for s in seeds]
    if started and None not in started and None not in ready:
        phases["seeds started (first)"] = min(t for t in started if t is not None)
        phases["seeds ready (last)"] = max(t for t in ready if t is not None)
    phases["tasks started (last)"] = max(starts) - began
    return Launch(first, phases)


def run_by_hand(ws: Path, bed: SparkTestbed, opts: Options, yamls: dict[str, str]) -> Launch:
    """spark-submit of the by-hand launcher, with the commands, environment and files tfplan
    would use: each task as `tfplan show --task NAME --json` gives it, the recipes staged and
    the run.yaml tfplan wrote (its folders replaced by this round's), all before the clock
    starts."""
    env = client_env(bed)
    plan, tasks = planned_tasks(ws, env, spark_args(ws, bed, opts.steps, "trainer.log_steps=1000"))
    stage(plan)
    for task in tasks:
        name = task["name"]
        Path(task["workdir"], "run.yaml").write_text(yamls[name].replace("@WS@", str(ws)))
    spec = {
        "name": "by-hand",
        "places": [h["name"] for h in plan["hosts"]],
        "cluster_spec": plan["cluster_spec"],
        "tasks": tasks,
    }
    spec_file, app, events = ws / "by_hand.json", ws / "by_hand_app.py", ws / "events.jsonl"
    spec_file.write_text(json.dumps(spec))
    app.write_text(BY_HAND_APP)
    conf = {
        "spark.executor.cores": "1",
        "spark.task.cpus": "1",
        "spark.cores.max": "3",
        "spark.executor.instances": "3",
        "spark.executor.memory": "512m",
        "spark.driver.host": bed.driver_host,
        "spark.pyspark.python": sys.executable,
        # the context waits for every executor (a barrier stage needs them all at once)
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s",
    }
    submit = [os.path.join(bed.spark_home, "bin", "spark-submit"), "--master", bed.master_url]
    submit += [w for k, v in conf.items() for w in ("--conf", f"{k}={v}")]
    submit += [str(app), str(spec_file), str(events)]
    wall0, began = time.time(), time.monotonic()
    with open(ws / "driver.log", "wb") as log:
        proc = subprocess.Popen(
            submit, cwd=ws, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        first = first_steps(ws / "work", began, stop=lambda: proc.poll() is not None)
        code = proc.wait(timeout=600)
        if code != 0:
            tail = (ws / "driver.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the by-hand spark-submit exited {code}:\n{tail}")
    finally:
        if proc.poll() is None:
            kill_groups([proc.pid])
            proc.wait()
        for task in tasks:
            pid = Path(task["workdir"], "pid")
            if pid.exists():
                kill_groups([int(pid.read_text())])
    noted = [json.loads(line) for line in events.read_text().splitlines()]
    phases = {"context (executors registered)": noted[0]["at"] - wall0}
    phases["tasks started (last)"] = max(e["at"] for e in noted if e["what"] != "context") - wall0
    return Launch(first, phases)


def tfplan_yamls(ws: Path) -> dict[str, str]:
    """The run.yaml tfplan wrote for each task, its round's folder as ``@WS@``."""
    return {
        name: (ws / "work" / name.replace("/", "-") / "run.yaml")
        .read_text()
        .replace(str(ws), "@WS@")
        for name in ("ps/0", *WORKERS)
    }


def proc_usage(pid: int) -> tuple[int, int, int, int]:
    """(process group, CPU ticks, RSS bytes, PSS bytes) of one live process; -1 and 0s when it
    is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            return -1, 0, 0, 0
        pss = 0
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
        return int(fields[2]), int(fields[11]) + int(fields[12]), int(fields[21]) * PAGE, pss
    except (OSError, ValueError, IndexError):
        return -1, 0, 0, 0


def idle_cost(bed: SparkTestbed, secs: float) -> dict[str, tuple[float, float]]:
    """Each daemon's (CPU % of one core, RSS MiB) over ``secs`` of an idle cluster."""
    assert bed.master is not None
    daemons = {"master": bed.master.pid}
    daemons.update({f"worker {i}": p.pid for i, p in enumerate(bed.worker_procs) if p})
    before = {name: proc_usage(pid)[1] for name, pid in daemons.items()}
    time.sleep(secs)
    out = {}
    for name, pid in daemons.items():
        _, ticks, rss, _ = proc_usage(pid)
        out[name] = (100.0 * (ticks - before[name]) / TICK / secs, rss / MIB)
    return out


def training_memory(ws: Path, bed: SparkTestbed) -> dict[str, tuple[float, float]]:
    """(RSS MiB, PSS MiB) per kind of process while the job trains, summed over the worker
    hosts (by process group: a warm seed is its shell and its Python), and the driver's
    process group on this machine."""
    state = state_of(ws, EXPERIMENT)
    tasks = {int(t["handle"]["pgid"]) for t in state["tasks"]}
    seeds = {int(s["pgid"]) for s in (state["allocation"]["data"].get("seeds") or [])}
    driver = driver_group(ws)
    sums: dict[str, list[int]] = {}

    def add(kind: str, rss: int, pss: int) -> None:
        total = sums.setdefault(kind, [0, 0])
        total[0] += rss
        total[1] += pss

    for i in range(bed.workers):
        for pid, line in bed.processes_on_worker(i):
            pgid, _, rss, pss = proc_usage(pid)
            if "CoarseGrainedExecutorBackend" in line:
                add("executors' JVMs", rss, pss)
            elif pgid in tasks:
                add("TensorFlow tasks (forked from the seeds)", rss, pss)
            elif pgid in seeds:
                add("warm seeds (one per executor)", rss, pss)
            elif "pyspark.daemon" in line:
                add("PySpark's Python: daemon, worker = the tfplan agent, its guard", rss, pss)
            else:
                add("other (tfplan's host watchers, shells)", rss, pss)
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and driver is not None:
            pgid, _, rss, pss = proc_usage(int(entry.name))
            if pgid == driver:
                add("the driver on this machine (JVM + Python)", rss, pss)
    return {kind: (rss / MIB, pss / MIB) for kind, (rss, pss) in sums.items()}


class LogTail:
    """The lines of a growing file, each with the monotonic time it was read at (every 20 ms):
    the background supervisor's log (the lines an attached apply prints) or a task's own log
    (its lines shown as the supervisor shows them, ``NAME | line``); a file made anew (a
    restarted task's) is read from its start."""

    def __init__(self, path: Path, task: str | None = None) -> None:
        self.path = path
        self.prefix = f"{task:<12} | " if task else ""
        self.lines: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        offset, partial, inode = 0, "", -1
        while not self._stop.wait(0.02):
            try:
                with open(self.path, "rb") as f:
                    info = os.fstat(f.fileno())
                    if info.st_ino != inode or info.st_size < offset:
                        offset, partial, inode = 0, "", info.st_ino
                    f.seek(offset)
                    chunk = f.read().decode(errors="replace")
                    offset = f.tell()
            except OSError:
                continue
            now = time.monotonic()
            *whole, partial = (partial + chunk).split("\n")
            self.lines.extend((now, self.prefix + line) for line in whole)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> int:
        """Index of the first line (from ``after``) matching ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            count = len(self.lines)
            for i in range(after, count):
                if regex.search(self.lines[i][1]):
                    return i
            if time.monotonic() > deadline:
                tail = "\n".join(line for _, line in self.lines[-30:])
                raise RuntimeError(f"no line matching {pattern!r} in {self.path}:\n{tail}")
            after = max(after, count)
            time.sleep(0.01)

    def steps(self, after: int = 0, until: int | None = None) -> list[tuple[str, int]]:
        """(task, global step) of every progress line in lines[after:until]."""
        found = [STEP.match(line) for _, line in self.lines[after:until]]
        return [(m.group(1), int(m.group(2))) for m in found if m]


CHIEF_STEP = r"^worker/0\s+\| .*\bstep=\d+"


def next_step(log: LogTail, after: int) -> int:
    """The chief's first progress line after line ``after``."""
    i = after
    while True:
        i = log.wait_for(CHIEF_STEP, 120, i + 1)
        if STEP.match(log.lines[i][1]):
            return i


def kill_ps(ws: Path, opts: Options, at_fault: Callable[[], None]) -> Kill:
    """SIGKILL of the ps's program inside its executor, once the chief printed step
    ``opts.fault_at`` and took a snapshot (``at_fault`` called just before); until the chief
    trains again. tfplan's lines from
    the background supervisor's log, the tasks' from their own logs (what the supervisor shows
    of them comes later: it is timed too)."""
    work = ws / "work"
    sup = LogTail(ws / ".tfplan" / EXPERIMENT / "supervisor.log")
    chief, other = (LogTail(work / n.replace("/", "-") / "task.log", n) for n in WORKERS)
    ps_log = LogTail(work / "ps-0" / "task.log", "ps/0")
    try:
        mark = 0
        while not any(s >= opts.fault_at for _, s in chief.steps(mark)):
            mark = chief.wait_for(CHIEF_STEP, 300, mark + 1)
        chief.wait_for(r"\| snapshots: every", 60)
        at_fault()
        ps = next(t for t in state_of(ws, EXPERIMENT)["tasks"] if t["name"] == "ps/0")
        faults = [len(t.lines) for t in (sup, chief, other, ps_log)]
        at = time.monotonic()
        os.kill(int(ps["handle"]["pid"]), signal.SIGKILL)
        seen = sup.wait_for(r"^tfplan\s+\| ps/0(: no log line| failed)", 120, faults[0])
        restarted = sup.wait_for(r"ps/0: restarted on executor-\d", 120, seen)
        serving = ps_log.wait_for(r"\| ps/0 serving on", 120, faults[3])
        restored = chief.wait_for(r"\| " + RESTORED.pattern, 120, faults[1])
        step = next_step(chief, restored)
        shown = next_step(sup, sup.wait_for(RESTORED.pattern, 120, restarted))
        line = chief.lines[restored][1]
        match = RESTORED.search(line)
        assert match is not None
        # the global step at the kill: the highest any account gives (the chief's restore
        # line says the step it last saw; a worker that went back says from where; the
        # progress lines printed before the kill, every 10 steps)
        saw = [int(m.group(1).replace(",", "")) for m in [SAW.search(line)] if m]
        back = [
            int(m.group(2))
            for log, fault in ((chief, faults[1]), (other, faults[2]))
            for _, text in log.lines[fault:]
            if (m := BACK.search(text))
        ]
        printed = [s for _, s in chief.steps(0, faults[1]) + other.steps(0, faults[2])]
        stages = {
            "seen": sup.lines[seen][0] - at,
            "restarted": sup.lines[restarted][0] - at,
            "serving": ps_log.lines[serving][0] - at,
            "restored": chief.lines[restored][0] - at,
            "step": chief.lines[step][0] - at,
            "shown": sup.lines[shown][0] - at,
        }
        restored_step = int(match.group(2).replace(",", ""))
        return Kill(max(saw + back + printed), restored_step, match.group(1), stages)
    finally:
        for tail in (sup, chief, other, ps_log):
            tail.close()


def run_job(
    ws: Path, bed: SparkTestbed, opts: Options
) -> tuple[Kill, Destroy, dict[str, tuple[float, float]]]:
    """`tfplan apply --detach` of a paced job; once the chief passed ``opts.fault_at``, the
    memory of the running job, then its ps killed (:func:`kill_ps`); once it trains again,
    `tfplan destroy` timed, then until nothing is left."""
    env = client_env(bed)
    extra = ["trainer.log_steps=10", "trainer.checkpoint_steps=100000", *paced(opts.pause)]
    if opts.backoff is not None:
        extra.append(f"lifecycle.restart.backoff_secs={opts.backoff}")
    try:
        subprocess.run(
            [*TFPLAN, "apply", "--auto-approve", "--detach", *spark_args(ws, bed, 10**6, *extra)],
            cwd=ws,
            env=env,
            check=True,
            capture_output=True,
            timeout=600,
        )
        memory: dict[str, tuple[float, float]] = {}
        kill = kill_ps(ws, opts, lambda: memory.update(training_memory(ws, bed)))
        app = state_of(ws, EXPERIMENT)["allocation"]["data"].get("app_id")
        began = time.monotonic()
        destroy = subprocess.Popen(
            [*TFPLAN, "destroy", "--auto-approve"],
            cwd=ws,
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert destroy.stdout is not None
        said = [(time.monotonic() - began, line.strip()) for line in destroy.stdout]
        if destroy.wait(timeout=300) != 0:
            raise RuntimeError("tfplan destroy failed:\n" + "\n".join(x for _, x in said))
        secs = time.monotonic() - began
        left = sum(len(bed.processes_on_worker(i)) for i in range(bed.workers))
        clean = secs + wait_clean(bed, app=app)
        phases = {
            name: next((t for t, line in said if re.search(pattern, line)), float("nan"))
            for name, pattern in DESTROY_PHASES
        }
        summary = next((x for _, x in said if "Destroy complete" in x), "")
        return kill, Destroy(secs, clean, left, summary, phases), memory
    finally:
        cleanup(ws)


def _med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _raw(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def _verdict(value: float, goal: float) -> str:
    return "pass" if value <= goal else "MISSED"


@dataclass
class Results:
    tfplan: list[Launch] = field(default_factory=list)
    by_hand: list[Launch] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    destroys: list[Destroy] = field(default_factory=list)
    memory: list[dict[str, tuple[float, float]]] = field(default_factory=list)
    idle: dict[str, tuple[float, float]] = field(default_factory=dict)
    loads: list[tuple[float, float, float]] = field(default_factory=list)
    bed_start: float = 0.0


def measure(bed: SparkTestbed, scratch: Path, repeats: int, opts: Options, idle: float) -> Results:
    results = Results(bed_start=bed.started_s)
    yamls: dict[str, str] = {}
    for round_ in range(repeats):
        order = ["tfplan", "by hand"] if round_ % 2 == 0 else ["by hand", "tfplan"]
        for side in [*order, "job"]:
            ws = Path(tempfile.mkdtemp(prefix=f"r{round_}-{side.replace(' ', '-')}-", dir=scratch))
            if side == "tfplan":
                results.tfplan.append(run_tfplan(ws, bed, opts))
                yamls = tfplan_yamls(ws)
                shown = f"{results.tfplan[-1].every:.2f}s"
            elif side == "by hand":
                results.by_hand.append(run_by_hand(ws, bed, opts, yamls))
                shown = f"{results.by_hand[-1].every:.2f}s"
            else:
                kill, destroyed, memory = run_job(ws, bed, opts)
                results.kills.append(kill)
                results.destroys.append(destroyed)
                results.memory.append(memory)
                shown = (
                    f"training again {kill.stages['step']:.2f}s after the kill, "
                    f"{kill.at_step - kill.restored} steps lost; destroy {destroyed.secs:.2f}s, "
                    f"nothing left after {destroyed.clean:.2f}s"
                )
            wait_clean(bed)  # the next round starts on an empty cluster
            print(f"round {round_ + 1} {side}: {shown}", flush=True)
    time.sleep(min(idle, 2.0))  # the last application's files cleaned up by the workers
    results.idle = idle_cost(bed, idle)
    return results


def summary_rows(results: Results) -> list[tuple[str, str, str]]:
    """The first table: (measure, median, verdict against its goal)."""
    tfplan = [r.every for r in results.tfplan]
    hand = [r.every for r in results.by_hand]
    ratio = _med(tfplan) / _med(hand)
    per_round = _med([a / b for a, b in zip(tfplan, hand, strict=True)])
    kills, destroys = results.kills, results.destroys
    back = _med([k.stages["step"] for k in kills])
    destroy = _med([d.secs for d in destroys])
    return [
        ("apply -> first step of every worker, tfplan", f"{_med(tfplan):.2f} s", ""),
        ("the same tasks by hand (spark-submit of a barrier stage)", f"{_med(hand):.2f} s", ""),
        (
            f"ratio of the medians, tfplan / by hand (goal <= {GOALS['ratio']})",
            f"{ratio:.2f}x",
            _verdict(ratio, GOALS["ratio"]),
        ),
        ("median of the per-round ratios", f"{per_round:.2f}x", _verdict(per_round, 1.2)),
        (
            "ps SIGKILLed in its executor -> the chief's 'restored' line",
            f"{_med([k.stages['restored'] for k in kills]):.2f} s",
            "",
        ),
        (
            f"ps SIGKILLed -> training again: the chief's next step (goal <= {GOALS['back']:.0f} s)",
            f"{back:.2f} s",
            _verdict(back, GOALS["back"]),
        ),
        (
            "global steps lost (the highest step seen before the restore - the step restored)",
            f"{_med([float(k.at_step - k.restored) for k in kills]):.0f}",
            "",
        ),
        (
            f"tfplan destroy of a running job (goal <= {GOALS['destroy']:.0f} s)",
            f"{destroy:.2f} s",
            _verdict(destroy, GOALS["destroy"]),
        ),
        (
            "destroy's start -> nothing left (no process on a worker host, application completed)",
            f"{_med([d.clean for d in destroys]):.2f} s",
            "",
        ),
        (
            "processes left on the worker hosts when destroy returned (all rounds)",
            str(sum(d.left for d in destroys)),
            "pass" if not sum(d.left for d in destroys) else "MISSED",
        ),
    ]


LAUNCH_PHASES = (
    "submitted",
    "agents registered",
    "context (executors registered)",
    "seeds started (first)",
    "seeds ready (last)",
    "tasks started (last)",
)
MEMORY_KINDS = (
    "executors' JVMs",
    "PySpark's Python: daemon, worker = the tfplan agent, its guard",
    "warm seeds (one per executor)",
    "TensorFlow tasks (forked from the seeds)",
    "other (tfplan's host watchers, shells)",
    "the driver on this machine (JVM + Python)",
)


def detail_rows(results: Results) -> dict[str, list[str]]:
    """The rows of the tables after the first, by table."""

    def phase(launches: list[Launch], name: str) -> str:
        values = [r.phases[name] for r in launches if name in r.phases]
        return f"{_med(values):.2f}" if values else "-"

    launch = [
        f"| {name} | {phase(results.tfplan, name)} | {phase(results.by_hand, name)} |"
        for name in LAUNCH_PHASES
    ]
    for worker in WORKERS:
        a = _med([r.first[worker] for r in results.tfplan])
        b = _med([r.first[worker] for r in results.by_hand])
        launch.append(f"| {worker}'s first step | {a:.2f} | {b:.2f} |")
    kill = " | ".join(
        f"{_med([k.stages[s] for k in results.kills]):.2f}"
        for s in ("seen", "restarted", "serving", "restored", "step", "shown")
    )
    destroy = [
        f"| {name} | {_med([d.phases[name] for d in results.destroys]):.2f} |"
        for name, _ in DESTROY_PHASES
    ]
    memory = []
    for kind in [k for k in MEMORY_KINDS if any(k in m for m in results.memory)]:
        rss = _med([m[kind][0] for m in results.memory if kind in m])
        pss = _med([m[kind][1] for m in results.memory if kind in m])
        memory.append(f"| {kind} | {rss:.0f} | {pss:.0f} |")
    idle = [f"| {name} | {cpu:.2f} | {rss:.0f} |" for name, (cpu, rss) in results.idle.items()]
    return {
        "launch": launch,
        "kill": [f"| {kill} |"],
        "destroy": destroy,
        "memory": memory,
        "idle": idle,
    }


def report(results: Results, opts: Options, args: argparse.Namespace) -> str:
    tfplan = [r.every for r in results.tfplan]
    hand = [r.every for r in results.by_hand]
    kills, destroys = results.kills, results.destroys
    rows = detail_rows(results)
    load = ", ".join(f"{a:.1f}/{b:.1f}/{c:.1f}" for a, b, c in results.loads)
    command = "sudo .venv/bin/python bench/bench_spark.py " + (
        "--smoke" if args.smoke else f"--repeats {args.repeats}"
    )
    backoff = "the default (1 s)" if opts.backoff is None else f"{opts.backoff} s"
    lines = [
        "# Benchmark: tfplan apply on Spark",
        "",
        f"`{command}` on {platform.node()} ({os.cpu_count()} cores, shared with other work), "
        f"{time.strftime('%Y-%m-%d')}. The real Spark standalone test bed "
        "(tests/spark_testbed.py: a master and 3 workers of 2 cores in network namespaces, "
        f"started by the bench in {results.bed_start:.1f} s), hogwild MLP on digits with 1 ps + "
        "2 workers, one task per executor (executors of 1 core and 512 MiB). Medians of "
        f"{len(tfplan)} round(s); in each, tfplan's apply and the by-hand launcher one after "
        "the other (round 1 tfplan first, round 2 by hand first, ...), then one detached job "
        "for the kill and the destroy. Load average (1/5/15 min) at the start and the end: "
        f"{load}.",
        "",
        "| measure | median | goal |",
        "|---|---|---|",
        *[f"| {a} | {b} | {c} |" for a, b, c in summary_rows(results)],
        "",
        f"Raw (s): tfplan {_raw(tfplan)}; by hand {_raw(hand)}; per-round ratios "
        f"{_raw([a / b for a, b in zip(tfplan, hand, strict=True)])}; kill -> training again "
        f"{_raw([k.stages['step'] for k in kills])}; steps lost "
        f"{', '.join(str(k.at_step - k.restored) for k in kills)} (restored from "
        f"{', '.join(f'its {k.source} of step {k.restored}' for k in kills)}); destroy "
        f"{_raw([d.secs for d in destroys])}; nothing left {_raw([d.clean for d in destroys])}. "
        f"Destroy said: {'; '.join(d.stopped for d in destroys)}",
        "",
        "## Where the seconds to the first step go (medians, s from the command's start)",
        "",
        f"Each launch trains {opts.steps} steps, to its end (tfplan's apply attached, the "
        "by-hand job until its tasks exit).",
        "",
        "| phase | tfplan | by hand |",
        "|---|---|---|",
        *rows["launch"],
        "",
        "tfplan: its own lines (the Spark application submitted, every agent registered, each "
        "task started) and the warm seeds' `started` and `ready` files. By hand: the events "
        "its driver and its Spark tasks noted (the SparkContext is returned once every executor "
        "registered: `spark.scheduler.minRegisteredResourcesRatio=1`; a barrier stage needs "
        "them all at once).",
        "",
        "## A ps SIGKILLed inside its executor (medians, s from the kill)",
        "",
        "`tfplan apply --detach` of a paced job (TFPLAN_STEP_PAUSE_SECS="
        f"{opts.pause}); once the chief printed step >= {opts.fault_at} and took its first "
        "snapshot, SIGKILL to the ps's program (the PID in the state: forked from its "
        f"executor's warm seed). Restart backoff {backoff}, snapshots every second (the "
        "default), no checkpoint before the kill. tfplan's own lines are timed in the background "
        "supervisor's log (the lines an attached apply prints), the tasks' in their own logs "
        "(each file read every 20 ms); the last column is when the chief's step reached "
        "tfplan's output.",
        "",
        "| seen by tfplan | restarted | the new ps serves | the chief's 'restored' line | "
        "the chief's next step | that step in tfplan's output |",
        "|---|---|---|---|---|---|",
        *rows["kill"],
        "",
        "## Destroy (medians, s from its start)",
        "",
        "The same job, once it trains again: `tfplan destroy --auto-approve`, its lines "
        "timed as they come; then the master's JSON and the worker hosts' namespaces polled "
        "every 50 ms until no process is left and the application is among the completed.",
        "",
        "| destroy's line | s |",
        "|---|---|",
        *rows["destroy"],
        "",
        "## What a waiting Spark cluster costs",
        "",
        f"Each daemon over {args.idle_secs:.0f} s of an idle cluster (after the last round: no "
        "application), from /proc:",
        "",
        "| daemon | CPU (% of one core) | RSS (MiB) |",
        "|---|---|---|",
        *rows["idle"],
        "",
        "While the job trains (paced, before the kill), summed over the three worker hosts, "
        "and the driver on this machine; medians over the rounds (PSS: shared pages counted "
        "once, so a task forked from its seed counts only what it changed):",
        "",
        "| processes | RSS (MiB) | PSS (MiB) |",
        "|---|---|---|",
        *rows["memory"],
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").strip().splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every measure")
    parser.add_argument("--steps", type=int, default=300, help="steps of the timed launches")
    parser.add_argument("--fault-at", type=int, default=300, help="the chief's step at the kill")
    parser.add_argument("--step-pause", type=float, default=0.02, help="of the paced runs")
    parser.add_argument("--backoff", type=float, help="lifecycle.restart.backoff_secs")
    parser.add_argument("--idle-secs", type=float, default=10.0)
    parser.add_argument("--smoke", action="store_true", help="1 round, few steps: the path only")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench_spark.md")
    args = parser.parse_args()
    if args.smoke:
        args.repeats, args.steps, args.fault_at, args.idle_secs = 1, 60, 60, 3.0
    if os.geteuid() != 0:
        print("bench_spark needs root (network namespaces for the Spark test bed)", file=sys.stderr)
        return 2
    missing = spark_missing()
    if missing:
        print(f"not installed: {', '.join(missing)} (run scripts/setup.sh)", file=sys.stderr)
        return 2
    # a bench started in the background inherits SIGINT ignored; the smoke test's timeout
    # sends SIGINT so that the bed is stopped (the finally below)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    opts = Options(args.steps, args.fault_at, args.step_pause, args.backoff)
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as scratch:
        bed = SparkTestbed(Path(scratch) / "bed", workers=3)
        try:
            bed.start()
            print(f"bed started in {bed.started_s:.1f}s", flush=True)
            results = measure(bed, Path(scratch), args.repeats, opts, args.idle_secs)
        finally:
            problems = bed.stop()
            if problems:
                print("bed teardown:", "; ".join(problems), file=sys.stderr)
    results.loads = [*loads, os.getloadavg()]
    text = report(results, opts, args)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
