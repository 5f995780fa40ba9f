"""Benchmark recovery: per fault, the time until training progresses again and the steps lost.

    .venv/bin/python bench/bench_reliability.py [--repeats 2] [--speed-runs 2] [--out FILE]

(``--repeats 1 --only "ps/0 (program), cold, warm" --speed-runs 1 --speed-steps 100 --fault-at 100
--step-pause 0.05 --out FILE`` is a quick run to the end: its fault rounds paced, their figures
not the measured ones.)

Each round runs `tfplan apply` on cluster=local (1 ps + 2 workers, MLP on digits, checkpoints
every 100 steps; the evaluator rounds add an evaluator), waits for global step 300 (and, where
the ps has a warm standby, for the standby to be ready), injects one fault, and reads the apply
log (arrival time of every line):
- fault -> victim back: for a ps (which prints no steps) the first worker step line after the
  new ps serves, for the chief, a worker and the evaluator the victim's own next step line;
- restart -> victim back: from the supervisor's "restarted" line to the same line;
- fault -> cluster trains: for a ps the same as victim back (every worker waits for it), for
  the others the first step line of another trainer after the fault;
- steps lost: where a replica saw the global step go back (a ps restart: the chief restored the
  last checkpoint), the steps it went back; else the highest global step printed before the
  fault minus the lowest one after the restart; and whether a step after the restart went
  below the last checkpoint taken before the fault;
- for a ps, where the time goes: fault -> the supervisor sees it; -> restarted (backoff, the
  previous life stopped, the new one started or the standby signalled); -> the ps serves;
  -> the first training step (the chief's session recovery, the workers' reconnect).
Rounds of different faults are interleaved (round 1 of every fault, then round 2, ...), so a
change in the machine's load hits them alike. Then training speed with and without a standby
(no fault, side by side, alternating), and a standby's cost while it waits.
Writes docs/reliability.md (or --out; with --only, only --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from apply_helpers import (  # noqa: E402
    base_overrides,
    free_port_base,
    kill_groups,
    paced,
    recorded_groups,
)
from chaos_helpers import ApplyRun, checkpoint_steps  # noqa: E402

# Checkpoints every CHECKPOINT_STEPS (a long job's are minutes apart: thousands of steps), the
# fault mid-way between two: what a restart from the last checkpoint loses on average. A
# snapshot's loss does not depend on where the fault falls (at most lifecycle.snapshot_secs).
CHECKPOINT_STEPS = 1000
FAULT_AT = 500
# --step-pause: a sleep after each step of the fault rounds (TFPLAN_STEP_PAUSE_SECS), for a quick
# check that the command works (tests/test_bench_smoke.py); the measured rounds train at full speed
STEP_PAUSE_SECS = 0.0
PS_GOAL_SECS = 5.0
LOADS: list[tuple[float, float, float]] = []  # load averages at the start and the end
STEP = re.compile(r"^(\S+)\s+\| .*\bstep=(\d+)")
TRAINERS = ("chief/0", "worker/0", "worker/1")
BACK = re.compile(r"\bstep=(\d+) .*back from global step (\d+)")
READY = r"^ps/0~standby\s+\| standby for ps/0: ready"
TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Fault:
    label: str
    victim: str
    # "program" (the task's own process), "wrapper" (the tracked process), "group", or
    # "forked" (a task forked from the warm seed: the tracked process is the program)
    target: str
    sig: int
    extra: tuple[str, ...] = ()
    standby: bool = False  # a warm standby (cold starts: cluster.warm=false)


COLD = "cluster.warm=false"
SNAPSHOTS_OFF = "lifecycle.snapshot_secs=0"
FAULTS = (
    Fault(
        "SIGKILL ps/0, forked again from the warm seed, snapshots every 1 s (the default)",
        "ps/0",
        "forked",
        9,
    ),
    Fault(
        "SIGKILL ps/0, forked again from the warm seed, checkpoints only (snapshot_secs=0)",
        "ps/0",
        "forked",
        9,
        (SNAPSHOTS_OFF,),
    ),
    Fault(
        "SIGKILL ps/0 (program), cold plain restart",
        "ps/0",
        "program",
        signal.SIGKILL,
        (COLD, "lifecycle.ps_standby=false"),
    ),
    Fault(
        "SIGKILL ps/0 (program), cold, warm standby",
        "ps/0",
        "program",
        signal.SIGKILL,
        (COLD, "lifecycle.ps_standby=true"),
        standby=True,
    ),
    Fault(
        "SIGKILL ps/0 (its wrapper), cold, warm standby",
        "ps/0",
        "wrapper",
        signal.SIGKILL,
        (COLD, "lifecycle.ps_standby=true"),
        standby=True,
    ),
    Fault("SIGKILL chief (worker/0)", "worker/0", "program", signal.SIGKILL),
    Fault("SIGKILL worker/1", "worker/1", "program", signal.SIGKILL),
    Fault(
        "SIGKILL evaluator/0",
        "evaluator/0",
        "program",
        signal.SIGKILL,
        ("cluster.evaluator=true", "trainer.eval_secs=0.5"),
    ),
    Fault(
        "SIGSTOP worker/1 (hang)",
        "worker/1",
        "group",
        signal.SIGSTOP,
        ("lifecycle.progress_timeout_secs=5",),
    ),
)


@dataclass
class Round:
    fault_to_progress: float
    restart_to_progress: float
    cluster_progress: float  # fault -> the first step line of another trainer
    lost: int
    lost_secs: float  # the steps lost, as seconds of this round's own training before the fault
    beyond_checkpoint: bool  # a step after the restart below the last checkpoint's
    stages: dict[str, float] = field(default_factory=dict)
    standby_idle: tuple[float, float] | None = None  # (CPU %, RSS MiB) while waiting


def _state(ws: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((ws / ".tfplan" / "t" / "state.json").read_text())
    return data


def _record(ws: Path, name: str, key: str = "tasks") -> dict[str, object]:
    records = _state(ws)[key]
    assert isinstance(records, list)
    return next(r for r in records if r["name"] == name)


def _procs() -> dict[int, tuple[int, int, int, int]]:
    """pid -> (ppid, pgid, CPU ticks, RSS pages) of every process."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(entry.name)] = (
            int(fields[1]),
            int(fields[2]),
            int(fields[11]) + int(fields[12]),
            int(fields[21]),
        )
    return out


def _program(wrapper: int) -> int:
    children = [pid for pid, (ppid, *_) in _procs().items() if ppid == wrapper]
    assert len(children) == 1, f"wrapper {wrapper} has children {children}"
    return children[0]


def _group_usage(pgid: int) -> tuple[int, int]:
    """(CPU ticks, RSS bytes) summed over a process group."""
    mine = [v for v in _procs().values() if v[1] == pgid]
    return sum(v[2] for v in mine), sum(v[3] for v in mine) * os.sysconf("SC_PAGE_SIZE")


def _standby_idle(ws: Path, secs: float = 5.0) -> tuple[float, float]:
    """A ready standby's CPU (% of one core) and RSS (MiB) over ``secs`` of waiting."""
    pgid = int(_record(ws, "ps/0~standby", "standbys")["handle"]["pgid"])  # type: ignore[index]
    ticks0, _ = _group_usage(pgid)
    time.sleep(secs)
    ticks1, rss = _group_usage(pgid)
    return 100.0 * (ticks1 - ticks0) / TICK / secs, rss / 2**20


def _args(ws: Path, fault: Fault, max_steps: int, pause: float = 0.0) -> list[str]:
    return [
        *base_overrides(ws, free_port_base()),
        f"trainer.max_steps={max_steps}",
        "trainer.log_steps=25",
        f"trainer.checkpoint_steps={CHECKPOINT_STEPS}",
        "lifecycle.restart.backoff_secs=0.2",
        *fault.extra,
        *paced(pause),
    ]


def _line(run: ApplyRun, pattern: str, after: int, timeout: float = 120) -> int:
    return run.wait_for(pattern, timeout=timeout, after=after)


def one_round(fault: Fault, keep_log: Path | None = None) -> Round:
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        run = ApplyRun(ws, _args(ws, fault, 10**6, STEP_PAUSE_SECS))
        try:
            mark = run.wait_step(FAULT_AT, timeout=300, task="worker/0")
            idle = None
            if fault.standby:
                mark = max(mark, _line(run, READY, 0, timeout=300))
                if fault.victim == "ps/0" and fault.target == "program":
                    idle = _standby_idle(ws)
            # the trainers' global steps (an evaluator's step= lines name the checkpoint it scored)
            before = max(s for name, s in run.steps(0, len(run.lines)) if name in TRAINERS)
            checkpoint = max(checkpoint_steps(ws / "out"), default=0)
            fault_line = len(run.lines) - 1
            handle = _record(ws, fault.victim)["handle"]
            wrapper = int(handle["pid"])  # type: ignore[index]
            pgid = int(handle.get("pgid") or wrapper)  # type: ignore[union-attr]
            # a task forked from the warm seed (the default) has no wrapper: the handle's pid is
            # the program's
            forked = fault.target == "forked" or bool(handle.get("forked"))  # type: ignore[union-attr]
            fault_at = time.monotonic()
            if fault.target == "group":
                os.killpg(pgid, fault.sig)
            elif forked or fault.target == "wrapper":
                os.kill(wrapper, fault.sig)
            else:
                os.kill(_program(wrapper), fault.sig)
            victim = re.escape(fault.victim)
            adopted = fault.target == "wrapper"  # its program serves on: re-adopted, not replaced
            if adopted:
                seen = _line(
                    run, rf"^tfplan\s+\| {victim}: its wrapper .* re-adopted", fault_line, 60
                )
                restart = seen
            else:
                seen = _line(run, rf"^tfplan\s+\| {victim}(: no log line| failed)", fault_line, 60)
                restart = _line(run, rf"{victim}: restarted on", fault_line, 60)
            restart_at = run.lines[restart][0]
            first = restart
            if fault.victim == "ps/0" and not adopted:
                # training again: a worker's step line that came after the new ps serves
                serving = _line(run, r"^ps/0\s+\| ps/0 serving on", restart, 60)
                first = serving
            progress = None
            i = first
            while progress is None:
                i = _line(run, r"\| .*\bstep=\d+", i + 1)
                match = STEP.match(run.lines[i][1])
                if match is None:
                    continue
                name = match.group(1)
                if (fault.victim == "ps/0" and name.startswith("worker")) or name == fault.victim:
                    progress = i
            at = run.lines[progress][0]
            # the cluster: a ps stops every worker; another task's fault stops none of the
            # others (the first step line of another trainer that came after the fault)
            cluster = at
            if fault.victim != "ps/0":
                j = fault_line
                while True:
                    j = _line(run, r"\| .*\bstep=\d+", j + 1)
                    match = STEP.match(run.lines[j][1])
                    if (
                        match is not None
                        and match.group(1) in TRAINERS
                        and match.group(1) != fault.victim
                        and run.lines[j][0] > fault_at
                    ):
                        cluster = run.lines[j][0]
                        break
            stages = {}
            if fault.victim == "ps/0" and not adopted:
                stages = {
                    "seen": run.lines[seen][0] - fault_at,
                    "restarted": restart_at - run.lines[seen][0],
                    "serving": run.lines[serving][0] - restart_at,
                    "training": at - run.lines[serving][0],
                }
            # a few more progress lines, for the lowest step after the restart
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(run.steps(restart + 1)) < 12:
                time.sleep(0.2)
            after = [s for name, s in run.steps(restart + 1) if name in TRAINERS]
            run.proc.send_signal(signal.SIGINT)
            run.finish(timeout=120)
            if keep_log is not None:
                # each line with its arrival time, in seconds from the fault
                keep_log.write_text("".join(f"{t - fault_at:+9.3f} {x}\n" for t, x in run.lines))
            # a replica that saw the global step go back says from where (recipes/replica.py)
            backs = [
                int(m.group(2)) - int(m.group(1))
                for _, line in run.lines[fault_line + 1 :]
                if (m := BACK.search(line))
            ]
            lost = max(backs) if backs else max(0, before - min(after)) if after else before
            beyond = bool(after) and min(after) < checkpoint
            return Round(
                at - fault_at,
                at - restart_at,
                cluster - fault_at,
                lost,
                lost / _steps_per_sec(run, fault_line),
                beyond,
                stages,
                idle,
            )
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
            kill_groups(recorded_groups(ws))
            path = ws / ".tfplan" / "t" / "state.json"
            if path.exists():
                kill_groups([int(s["handle"]["pgid"]) for s in _state(ws).get("standbys", [])])  # type: ignore[union-attr]


def _steps_per_sec(run: ApplyRun, until: int) -> float:
    """The global steps per second of the progress lines up to line ``until`` (the fault)."""
    timed = [
        (t, int(m.group(2)))
        for t, line in run.lines[: until + 1]
        if (m := STEP.match(line)) and m.group(1) in TRAINERS
    ]
    (t0, s0), (t1, s1) = timed[0], timed[-1]
    return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else float("nan")


# The no-fault speed runs: label -> overrides, sides alternating
SPEED_SIDES = {
    "ps_standby=false (cold starts)": (COLD, "lifecycle.ps_standby=false"),
    "ps_standby=true (cold starts)": (COLD, "lifecycle.ps_standby=true"),
    "snapshot_secs=0 (forked, checkpoints only)": (SNAPSHOTS_OFF,),
    "snapshot_secs=1 (forked, the default)": (),
}


def speed_round(side: str, max_steps: int) -> tuple[float, float, bool]:
    """(examples/s from the chief's result, wall seconds, whether a standby got ready before
    the end) of a run without faults."""
    with tempfile.TemporaryDirectory() as tmp:
        ws = Path(tmp)
        fault = Fault("", "", "", 0, SPEED_SIDES[side])
        run = ApplyRun(ws, _args(ws, fault, max_steps))
        try:
            began = time.monotonic()
            code = run.finish(timeout=900)
            assert code == 0, run.text()[-3000:]
            result = json.loads((ws / "out" / "result.json").read_text())
            ready = any(re.search(READY, line) for _, line in run.lines)
            return float(result["examples_per_sec"]), time.monotonic() - began, ready
        finally:
            if run.proc.poll() is None:
                run.proc.kill()
            kill_groups(recorded_groups(ws))


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main() -> None:
    global FAULT_AT, STEP_PAUSE_SECS  # noqa: PLW0603 - settings of the whole run
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--speed-runs", type=int, default=2, help="runs per side, no faults")
    parser.add_argument("--speed-steps", type=int, default=6000)
    parser.add_argument("--only", help="only the faults whose label contains this")
    parser.add_argument("--speed-only", help="only the speed sides whose label contains this")
    parser.add_argument("--keep-logs", type=Path, help="keep each round's apply output here")
    parser.add_argument("--fault-at", type=int, default=FAULT_AT, help="the fault's global step")
    parser.add_argument(
        "--step-pause", type=float, default=0.0, help="sleep after each step (a quick check)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="write the report here (default: docs/reliability.md, unless --only)",
    )
    options = parser.parse_args()
    FAULT_AT, STEP_PAUSE_SECS = options.fault_at, options.step_pause
    # Rounds end with SIGINT to `tfplan apply` (as Ctrl-C): a bench started in the background
    # (`... &`, nohup) inherits SIGINT ignored, and so would every apply it starts
    signal.signal(signal.SIGINT, signal.default_int_handler)
    faults = [f for f in FAULTS if not options.only or options.only in f.label]
    LOADS.append(os.getloadavg())
    rounds: dict[str, list[Round]] = {f.label: [] for f in faults}
    failures: dict[str, list[str]] = {f.label: [] for f in faults}
    for _ in range(options.repeats):
        for fault in faults:
            try:
                keep = None
                if options.keep_logs is not None:
                    options.keep_logs.mkdir(parents=True, exist_ok=True)
                    name = re.sub(r"[^a-z0-9]+", "-", fault.label.lower()).strip("-")
                    keep = options.keep_logs / f"{name}-{len(rounds[fault.label]) + 1}.log"
                done = one_round(fault, keep)
            except Exception as error:  # noqa: BLE001 - a failed round is reported, not hidden
                why = f"{type(error).__name__}: {' '.join(str(error).split())[-300:]}"
                failures[fault.label].append(why)
                print(fault.label, "FAILED:", why, flush=True)
                continue
            rounds[fault.label].append(done)
            print(fault.label, done, flush=True)
    sides = [k for k in SPEED_SIDES if not options.speed_only or options.speed_only in k]
    speeds: dict[str, list[tuple[float, float, bool]]] = {side: [] for side in sides}
    for _ in range(options.speed_runs):
        for side in sides:
            try:
                speeds[side].append(speed_round(side, options.speed_steps))
            except Exception as error:  # noqa: BLE001 - reported, the fault rounds are kept
                print("speed", side, "FAILED:", error, flush=True)
                continue
            print("speed", side, speeds[side][-1], flush=True)
    LOADS.append(os.getloadavg())
    write_report(options, faults, rounds, failures, speeds)


def _spread(values: list[float]) -> str:
    """median (min-max) of ``values``."""
    if not values:
        return "-"
    return f"{_median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def write_report(
    options: argparse.Namespace,
    faults: list[Fault],
    rounds: dict[str, list[Round]],
    failures: dict[str, list[str]],
    speeds: dict[str, list[tuple[float, float, bool]]],
) -> None:
    rows = []
    for fault in faults:
        done = rounds[fault.label]
        lost = [float(r.lost) for r in done]
        lost_secs = [r.lost_secs for r in done]
        rows.append(
            f"| {fault.label} | {len(done)} | {_spread([r.fault_to_progress for r in done])} | "
            f"{_spread([r.restart_to_progress for r in done])} | "
            f"{_spread([r.cluster_progress for r in done])} | "
            f"{_median(lost):.0f} ({max(lost, default=0):.0f}) | "
            f"{_median(lost_secs):.2f} ({max(lost_secs, default=0):.2f}) | "
            f"{sum(r.beyond_checkpoint for r in done)} |"
        )
    failed = [
        f"- {label}: {len(whys)} round(s) failed: {'; '.join(whys)}"
        for label, whys in failures.items()
        if whys
    ]
    stage_rows = []
    for fault in faults:
        done = [r for r in rounds[fault.label] if r.stages]
        if done:
            cells = " | ".join(
                f"{_median([r.stages[k] for r in done]):.2f}"
                for k in ("seen", "restarted", "serving", "training")
            )
            stage_rows.append(f"| {fault.label} | {cells} |")
    idle = [r.standby_idle for rs in rounds.values() for r in rs if r.standby_idle]
    speed_lines = []
    measured = {side: runs for side, runs in speeds.items() if runs}
    if measured:
        median = {side: _median([r[0] for r in runs]) for side, runs in measured.items()}
        ratios = []
        for off, on, what in (
            (0, 1, "with a standby / without"),
            (2, 3, "with snapshots every 1 s / checkpoints only"),
        ):
            names = list(SPEED_SIDES)
            if names[off] in median and names[on] in median:
                ratios.append(f"{what}: {median[names[on]] / median[names[off]]:.2f}")
        speed_lines = [
            "## Training speed without a fault: standby, snapshots",
            "",
            f"{options.speed_steps} steps, {options.speed_runs} runs per side, alternating. "
            "A standby starts at the first training step and imports TensorFlow while the "
            "workers train; snapshots: every ps's variables written into /dev/shm by the ps, "
            "started by the chief every second on a thread of its own.",
            "",
            "| side | examples/s (median) | runs (examples/s, wall s) |",
            "|---|---|---|",
            *(
                f"| {side} | {median[side]:.0f} | {_fmt(runs, 'ps_standby=true' in side)} |"
                for side, runs in measured.items()
            ),
            "",
            f"Ratios of the medians: {'; '.join(ratios) or '-'}.",
            "",
        ]
    idle_lines = []
    if idle:
        idle_lines = [
            "## A waiting standby's cost",
            "",
            f"Measured for 5 s while it waits (its process group, from /proc) during the warm "
            f"standby rounds: CPU {_median([i[0] for i in idle]):.2f} % of one core, RSS "
            f"{_median([i[1] for i in idle]):.0f} MiB (medians of {len(idle)}).",
            "",
        ]
    goal = []
    for fault in faults:
        done = rounds[fault.label]
        if fault.victim == "ps/0" and done:
            median = _median([r.fault_to_progress for r in done])
            within = sum(r.fault_to_progress <= PS_GOAL_SECS for r in done)
            verdict = "met" if median <= PS_GOAL_SECS else "NOT met"
            goal.append(
                f"- {fault.label}: median {median:.1f} s, {within} of {len(done)} rounds within "
                f"{PS_GOAL_SECS:.0f} s: goal {verdict}"
            )
    load = ", ".join(f"{a:.1f}/{b:.1f}/{c:.1f}" for a, b, c in LOADS)
    lines = [
        "# Reliability: recovery time and steps lost per fault",
        "",
        f"Goal: a parameter server back in training within {PS_GOAL_SECS:.0f} s of the fault, "
        "with both workers busy on this 2-core machine; no step rolled back past the last "
        "checkpoint.",
        "",
        *goal,
        "",
        f"`.venv/bin/python bench/bench_reliability.py --repeats {options.repeats} "
        f"--speed-runs {options.speed_runs}` on {platform.node()} ({os.cpu_count()} cores, "
        "shared with other work), "
        f"{time.strftime('%Y-%m-%d')}. cluster=local (1 ps + 2 workers; + an evaluator in its "
        f"round), hogwild MLP on digits, checkpoints every {CHECKPOINT_STEPS:,} steps, fault injected at global "
        f"step >= {FAULT_AT} (and once the ps's standby is ready), restart backoff 0.2 s; the "
        "hang round has progress_timeout_secs=5. 'program': the task's own process is killed, "
        "its wrapper (the tracked process) lives on; 'wrapper': the other way round, and the "
        "program, still serving, is re-adopted (not replaced): its 'victim back' is when tfplan "
        "says so, and its 'restart' is that line. Rounds of "
        "every fault interleaved. The machine is shared and noisy (other test suites ran "
        f"meanwhile): load average (1/5/15 min) at the start and the end: {load}; hence the "
        "ranges.",
        "",
        "| fault | rounds | fault -> victim back (s) | restart -> victim back (s) | fault -> "
        "cluster trains (s) | global steps lost median (max) | training lost (s) median (max) | "
        "rounds rolled back past the last checkpoint |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "Times: median (min-max) over the rounds. Victim back: for a ps, the first worker step "
        "line after the new ps serves (a ps stops every worker: it is also when the cluster "
        "trains again); for the others, the victim's own next step line (the evaluator: its next "
        "evaluation), which pays the new process's TensorFlow import. Cluster trains: the first "
        "step line of another trainer after the fault (the others do not wait for a chief, a "
        "worker or the evaluator). Steps lost: a ps restart goes back to its snapshot (at most "
        "about a second old) or, without one, to the last checkpoint (the fault comes mid-way "
        "between two): "
        "the replicas print from which global step they went back ('back from global step N'); "
        "without such a line, the highest step printed before the fault (every 25 steps) minus "
        "the lowest one after the restart. Training lost: those steps over the round's own "
        "global steps per second before the fault (its progress lines). A round "
        "counts as rolled back past the last checkpoint when a step after the restart is below "
        "the last checkpoint taken before the fault.",
        "",
        *(["Failed rounds (not in the figures):", *failed, ""] if failed else []),
        "## Where a ps restart's seconds go (medians, s)",
        "",
        "| fault | fault -> seen | seen -> restarted | restarted -> ps serves | serves -> "
        "training |",
        "|---|---|---|---|---|",
        *stage_rows,
        "",
        "seen: the supervisor notices the end (the task's log stream ends with it, else its "
        "next 0.5 s poll); restarted: the backoff (0.2 s), "
        "the previous life stopped, then a new process started or the standby signalled; "
        "serves: the ps's gRPC server is up (a new process imports TensorFlow first); "
        "training: the chief's session recovery (restore of the snapshot or the last "
        "checkpoint into the new ps) and the workers' reconnect.",
        "",
        *idle_lines,
        *speed_lines,
        "Raw rounds (fault -> victim back s, restart -> victim back s, fault -> cluster trains "
        "s, steps lost, training lost s), in order:",
        "",
        *[
            f"- {label}: "
            + ", ".join(
                f"({r.fault_to_progress:.2f}, {r.restart_to_progress:.2f}, "
                f"{r.cluster_progress:.2f}, {r.lost}, {r.lost_secs:.2f})"
                for r in done
            )
            for label, done in rounds.items()
        ],
        "",
    ]
    out = options.out or (None if options.only else REPO / "docs" / "reliability.md")
    if out is not None:
        out.write_text("\n".join(lines))
    print("\n".join(lines))


def _fmt(runs: list[tuple[float, float, bool]], standby: bool) -> str:
    """The runs of one side; a standby side's runs say when no standby got ready."""
    late = ", no standby ready"
    return ", ".join(
        f"{e:.0f} ({w:.0f} s{late if standby and not ready else ''})" for e, w, ready in runs
    )


if __name__ == "__main__":
    main()
