"""Measure the Slurm behaviours the Slurm backend depends on, on the real test bed.

Starts its own SlurmTestbed (tests/slurm_testbed.py), runs each experiment, prints one line per
fact and a JSON summary at the end. The numbers in docs/slurm_notes.md come from this script.
Needs root and the packages scripts/setup.sh installs.

    .venv/bin/python bench/slurm_study.py [--reps 5] [--only NAME ...] [--json FILE]

``--slurm-conf FILE`` runs the experiments on a test bed that already runs (lifecycle and tuned
still start their own); ``--reps 1 --only allocation exit_codes`` is a quick run to the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from slurm_testbed import SlurmTestbed, alive  # noqa: E402

PY = sys.executable
RESULTS: dict[str, object] = {}

# A task that records every catchable signal it gets (and its pid) in a log file.
SIGTASK = textwrap.dedent(
    """
    import os, signal, sys, time
    log = sys.argv[1]
    ignore_term = len(sys.argv) > 2 and sys.argv[2] == "ignore"
    def w(msg):
        with open(log, "a") as f:
            f.write(f"{time.monotonic():.4f} {msg}\\n")
    def on(n, f):
        w("got " + signal.Signals(n).name)
        if n == signal.SIGTERM and not ignore_term:
            sys.exit(0)
    for s in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGCONT"):
        signal.signal(getattr(signal, s), on)
    w(f"started {os.getpid()}")
    while True:
        time.sleep(0.02)
    """
)


def say(key: str, value: object) -> None:
    RESULTS[key] = value
    print(f"{key}: {value}", flush=True)


def med_ms(values: list[float]) -> str:
    ms = sorted(round(v * 1000) for v in values)
    return f"median {statistics.median(ms):.0f} ms (n={len(ms)}, {ms[0]}..{ms[-1]})"


def wait_until(pred: Callable[[], object], timeout: float, step: float = 0.01) -> float:
    """Seconds until pred() is truthy; raises TimeoutError after ``timeout``."""
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"not true within {timeout}s: {pred}")
        time.sleep(step)
    return time.monotonic() - t0


class Study:
    def __init__(self, bed: SlurmTestbed, work: Path, reps: int) -> None:
        self.bed = bed
        self.work = work
        self.reps = reps
        self.sigtask = work / "sigtask.py"
        self.sigtask.write_text(SIGTASK)
        self.n = 0
        self.jobs: list[str] = []  # every job sbatch accepted

    # -- helpers ----------------------------------------------------------------------------

    def run(self, *argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
        done = self.bed.run(*argv, check=False, **kw)  # type: ignore[arg-type]
        if argv[:2] == ("sbatch", "--parsable") and done.returncode == 0:
            self.jobs.append(done.stdout.strip())
        return done

    def clean_up(self, timeout: float = 60) -> None:
        """Cancel what the experiments left and wait until squeue has none of their jobs: a
        bed shared with other users (--slurm-conf) is left as it was found."""
        if self.jobs:
            self.run("scancel", *self.jobs)
            wait_until(lambda: all(self.squeue("-j", j) == "" for j in self.jobs), timeout, 0.1)

    def squeue(self, *args: str) -> str:
        return self.run("squeue", "-h", *args).stdout.strip()

    def hold(self, name: str = "hold", per_node: int = 2, nodes: int = 3) -> str:
        job = self.run(
            "sbatch",
            "--parsable",
            f"-N{nodes}",
            f"--ntasks-per-node={per_node}",
            f"--job-name={name}",
            f"--output={self.work}/%x-%j.out",
            "--wrap",
            "exec sleep infinity",
        ).stdout.strip()
        wait_until(lambda: self.squeue("-j", job, "-o", "%T") == "RUNNING", 60, 0.02)
        return job

    def log(self) -> Path:
        self.n += 1
        return self.work / f"sig{self.n}.log"

    def srun_sigtask(
        self, job: str, node: str, name: str, log: Path, *extra: str, ignore: bool = False
    ) -> subprocess.Popen[str]:
        argv = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", node]
        argv += [f"--job-name={name}", *extra, PY, str(self.sigtask), str(log)]
        if ignore:
            argv.append("ignore")
        proc = self.bed.popen(*argv)
        wait_until(lambda: log.exists() and "started" in log.read_text(), 30)
        return proc

    @staticmethod
    def seen(log: Path) -> list[str]:
        return [" ".join(line.split()[1:]) for line in log.read_text().splitlines()]

    @staticmethod
    def task_pid(log: Path) -> int:
        first = log.read_text().splitlines()[0]
        return int(first.split()[-1])

    def step_of(self, job: str, name: str) -> str:
        for line in self.squeue("-s", "-j", job, "-o", "%i %j").splitlines():
            step, step_name = line.split(maxsplit=1)
            if step_name == name:
                return step
        return ""

    # -- experiments ------------------------------------------------------------------------

    def allocation(self) -> None:
        starts, seen = [], set()
        for i in range(self.reps):
            t0 = time.monotonic()
            job = self.run(
                "sbatch",
                "--parsable",
                "-N3",
                "--ntasks-per-node=2",
                f"--job-name=alloc{i}",
                f"--output={self.work}/%x-%j.out",
                "--wrap",
                "exec sleep infinity",
            ).stdout.strip()
            submit = time.monotonic() - t0

            def running() -> bool:
                out = self.squeue("-j", job, "-o", "%T|%r|%N")  # noqa: B023
                seen.add(out)
                return out.startswith("RUNNING")

            wait_until(running, 60, 0.02)
            starts.append(time.monotonic() - t0)
            if i == 0:
                say("sbatch --parsable prints", repr(job))
                say("sbatch submit call", f"{submit * 1000:.0f} ms")
                nodelist = self.squeue("-j", job, "-o", "%N")
                hosts = self.run("scontrol", "show", "hostnames", nodelist).stdout.split()
                say("squeue %N / scontrol show hostnames", f"{nodelist} -> {hosts}")
                env = self.run(
                    "srun",
                    f"--jobid={job}",
                    "--overlap",
                    "-N1",
                    "-n1",
                    "-w",
                    "n1",
                    "sh",
                    "-c",
                    "echo $SLURM_JOB_NODELIST $SLURM_JOB_NAME $SLURM_STEP_ID",
                ).stdout.strip()
                say("step env SLURM_JOB_NODELIST SLURM_JOB_NAME SLURM_STEP_ID", env)
                addr = self.run("scontrol", "show", "node", "n2").stdout
                say("scontrol show node n2", [w for w in addr.split() if w.startswith("NodeAddr")])
                say("sinfo -h -N -o '%N %o'", self.run("sinfo", "-h", "-N", "-o", "%N %o").stdout)
                # a second allocation that does not fit while this one runs
                busy = self.run(
                    "sbatch",
                    "--parsable",
                    "-N3",
                    "--ntasks-per-node=7",
                    "--job-name=busy",
                    "--wrap",
                    "true",
                ).stdout.strip()
                reasons = set()
                t1 = time.monotonic()
                while time.monotonic() - t1 < 4:
                    reasons.add(self.squeue("-j", busy, "-o", "%T|%r|%N"))
                    time.sleep(0.2)
                say("pending for resources: squeue %T|%r|%N", sorted(reasons))
                t1 = time.monotonic()
                try:
                    early = self.run(
                        "srun", f"--jobid={busy}", "--overlap", "-N1", "-n1", "true", timeout=8
                    )
                    what = f"rc={early.returncode} {early.stderr.strip()!r}"
                except subprocess.TimeoutExpired:
                    what = "still waiting after 8 s"
                say("srun --jobid=<PENDING job>", f"{what} ({time.monotonic() - t1:.1f} s)")
                self.run("scancel", busy)
            t0 = time.monotonic()
            self.run("scancel", job)
            wait_until(lambda: self.squeue("-j", job) == "", 60)  # noqa: B023
            if i == 0:
                say("after end: squeue -h -j ID (rc, out)", self._sq_rc(job))
                say(
                    "after end: squeue -h -j ID -t all -o %T",
                    self.squeue("-j", job, "-t", "all", "-o", "%T"),
                )
        say("sbatch -> RUNNING", med_ms(starts))
        say("states seen while starting", sorted(seen))

    def _sq_rc(self, job: str) -> str:
        done = self.run("squeue", "-h", "-j", job)
        return f"rc={done.returncode} out={done.stdout.strip()!r} err={done.stderr.strip()!r}"

    def bad_requests(self) -> None:
        cases = {
            "-N4 (cluster has 3 nodes)": ["-N4"],
            "--ntasks-per-node=9 (8 CPUs/node)": ["-N1", "--ntasks-per-node=9"],
            "-n25 (24 CPUs in all)": ["-n25"],
            "--mem=100000 (RealMemory=4000)": ["-N1", "--mem=100000"],
            "-p nosuch": ["-N1", "-p", "nosuch"],
            "-w n9 (unknown node)": ["-w", "n9"],
            "--bogus-option": ["--bogus-option"],
            "-t badtime": ["-t", "badtime"],
            "--chdir=/nonexistent": ["-N1", "--chdir=/nonexistent"],
        }
        for label, opts in cases.items():
            done = self.run("sbatch", "--parsable", *opts, "--wrap", "true")
            line = f"rc={done.returncode} stdout={done.stdout.strip()!r} stderr={done.stderr.strip()!r}"
            if done.returncode == 0:
                job = done.stdout.strip()
                states, t0 = [], time.monotonic()
                while time.monotonic() - t0 < 6:  # every state|reason seen in 6 s, in order
                    state = self.squeue("-j", job, "-t", "all", "-o", "%T|%r")
                    if not states or states[-1] != state:
                        states.append(state)
                    time.sleep(0.1)
                line += f" -> squeue over 6 s: {states}"
                self.run("scancel", job)
            say(f"sbatch {label}", line)
            test = self.run("sbatch", "--test-only", *opts, "--wrap", "true")
            say(f"sbatch --test-only {label}", f"rc={test.returncode} {test.stderr.strip()!r}")
        done = self.run("srun", "-N1", "--chdir=/nonexistent", "true")
        say("srun --chdir=/nonexistent", f"rc={done.returncode} {done.stderr.strip()!r}")
        done = self.run("srun", "-N1", "/nonexistent/prog")
        say("srun /nonexistent/prog", f"rc={done.returncode} {done.stderr.strip()!r}")

    def steps(self) -> None:
        job = self.hold("steps", per_node=1)
        walls, visible = [], []
        for i in range(max(self.reps, 5) * 2):
            marker = self.work / f"m{i}"
            t0 = time.monotonic()
            proc = self.bed.popen(
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                "n2",
                f"--job-name=step{i}",
                "sh",
                "-c",
                f"touch {marker}; exec sleep 1",
            )
            wait_until(marker.exists, 30, 0.005)
            walls.append(time.monotonic() - t0)
            visible.append(wait_until(lambda: self.step_of(job, f"step{i}"), 30, 0.005))  # noqa: B023
            if i == 1:
                example = self.squeue("-s", "-j", job, "-o", "%i %j")
            proc.wait(30)
        say("srun --overlap: Popen -> task running", med_ms(walls))
        say("step name visible in squeue -s after task start", med_ms(visible))
        say("squeue -h -s -j ID -o '%i %j' while step1 runs", example)
        # many overlapping steps on one node at once
        for count in (4, 8):
            markers = [self.work / f"c{count}-{k}" for k in range(count)]
            t0 = time.monotonic()
            procs = [
                self.bed.popen(
                    "srun",
                    f"--jobid={job}",
                    "--overlap",
                    "-N1",
                    "-n1",
                    "-w",
                    "n3",
                    f"--job-name=many{k}",
                    "sh",
                    "-c",
                    f"touch {m}; exec sleep 2",
                )
                for k, m in enumerate(markers)
            ]
            wait_until(lambda: all(m.exists() for m in markers), 60)  # noqa: B023
            say(
                f"{count} overlapping steps on one node (1-CPU alloc): all running after",
                f"{(time.monotonic() - t0) * 1000:.0f} ms",
            )
            for p in procs:
                p.wait(30)
        # without --overlap: the allocation's 1 CPU on n3 is taken by the first step
        first = self.bed.popen(
            "srun", f"--jobid={job}", "-N1", "-n1", "-w", "n3", "--job-name=excl1", "sleep", "5"
        )
        wait_until(lambda: self.step_of(job, "excl1"), 30)
        t0 = time.monotonic()
        second = self.bed.popen(
            "srun", f"--jobid={job}", "-N1", "-n1", "-w", "n3", "--job-name=excl2", "true"
        )
        rc = second.wait(60)
        say(
            "2nd step without --overlap on a busy CPU: srun waited",
            f"{time.monotonic() - t0:.1f} s, rc={rc}, stderr={second.stderr.read().strip()!r}",
        )  # type: ignore[union-attr]
        first.wait(30)
        # environment
        big = "x" * 100_000
        env = self.bed.env() | {"BIG_VAR": big, "TFPLAN_MARK": "yes"}
        done = subprocess.run(
            [
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                "n1",
                "sh",
                "-c",
                'echo "${#BIG_VAR} $TFPLAN_MARK $PWD"',
            ],
            env=env,
            capture_output=True,
            text=True,
            cwd=self.work,
            timeout=60,
        )
        say(
            "env: 100 KB var + marker + cwd in the task",
            f"rc={done.returncode} {done.stdout.strip()!r} {done.stderr.strip()[:200]!r}",
        )
        # one variable is capped by Linux at 128 KiB (MAX_ARG_STRLEN); 10 x 100 KB = 1 MB in all
        env = self.bed.env() | {f"BIG_{k}": "x" * 100_000 for k in range(10)}
        done = subprocess.run(
            [
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                "n1",
                "sh",
                "-c",
                "env | grep -c ^BIG_; env | wc -c",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        say(
            "env: 10 vars x 100 KB",
            f"rc={done.returncode} {done.stdout.split()} {done.stderr.strip()[:300]!r}",
        )
        done = subprocess.run(
            [
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N1",
                "-n1",
                "-w",
                "n1",
                "--export=NONE",
                "sh",
                "-c",
                'echo "mark=$TFPLAN_MARK path=$PATH"',
            ],
            env=self.bed.env() | {"TFPLAN_MARK": "yes"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        say(
            "env: --export=NONE",
            f"rc={done.returncode} {done.stdout.strip()!r} {done.stderr.strip()!r}",
        )
        # stdout / stderr
        done = self.run(
            "srun",
            f"--jobid={job}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            "n1",
            "sh",
            "-c",
            "echo to-out; echo to-err >&2; exit 0",
        )
        say(
            "stdout/stderr of the task at the srun client",
            f"out={done.stdout!r} err={done.stderr!r}",
        )
        out = self.work / "step-%j.%s.%t.%N.out"
        done = self.run(
            "srun",
            f"--jobid={job}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            "n1",
            f"--output={out}",
            "sh",
            "-c",
            "echo to-file; echo to-err-file >&2",
        )
        files = {p.name: p.read_text() for p in self.work.glob("step-*.out")}
        say(
            "--output=step-%j.%s.%t.%N.out (stderr follows)",
            f"client out={done.stdout!r} err={done.stderr!r} files={files}",
        )
        # delivery delay of one line, and of a partial line, to the srun client
        proc = self.bed.popen(
            "srun",
            f"--jobid={job}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            "n2",
            PY,
            "-c",
            "import sys, time\nfor i in range(5):\n    print(f'{time.time():.4f}', flush=True); time.sleep(0.2)\n"
            "sys.stdout.write('partial'); sys.stdout.flush(); time.sleep(1.5); print(f' {time.time():.4f}', flush=True)",
        )
        delays, partial = [], ""
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            if line.startswith("partial"):
                partial = f"'partial' arrived with its newline, {now - float(line.split()[1]):.3f} s after it"
            else:
                delays.append(now - float(line))
        proc.wait(30)
        say("task line -> srun stdout delay", med_ms(delays))
        say("partial line (no newline, flushed, 1.5 s pause)", partial)
        proc = self.bed.popen(
            "srun",
            "-u",
            f"--jobid={job}",
            "--overlap",
            "-N1",
            "-n1",
            "-w",
            "n2",
            PY,
            "-c",
            "import sys, time\nsys.stdout.write('partial'); sys.stdout.flush(); time.sleep(1.0); print('end')",
        )
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        t0, got = time.monotonic(), ""
        while "partial" not in got and time.monotonic() - t0 < 5:
            got += os.read(proc.stdout.fileno(), 100).decode() if _readable(proc) else ""
            time.sleep(0.01)
        say(
            "srun -u (unbuffered): partial line arrives after",
            f"{(time.monotonic() - t0) * 1000:.0f} ms (got {got!r})",
        )
        proc.wait(30)
        self.run("scancel", job)

    def exit_codes(self) -> None:
        job = self.hold("codes", per_node=1)
        cases = {
            "exit 0": "exit 0",
            "exit 3": "exit 3",
            "exit 255": "exit 255",
            "kill -KILL self": "kill -KILL $$",
            "kill -TERM self": "kill -TERM $$",
            "kill -SEGV self": "kill -SEGV $$",
        }
        for label, script in cases.items():
            done = self.run(
                "srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "n2", "sh", "-c", script
            )
            say(f"srun rc: task {label}", f"{done.returncode} {done.stderr.strip()!r}")
        for extra in ([], ["--kill-on-bad-exit=1"]):
            t0 = time.monotonic()
            done = self.run(
                "srun",
                f"--jobid={job}",
                "--overlap",
                "-N2",
                "-n2",
                "-w",
                "n2,n3",
                *extra,
                "sh",
                "-c",
                'if [ "$SLURM_PROCID" = 1 ]; then exit 5; fi; sleep 3; exit 0',
            )
            say(
                f"srun {' '.join(extra)} rc: 2 tasks, rank 1 exits 5 at once, rank 0 sleeps 3 s",
                f"{done.returncode} after {time.monotonic() - t0:.1f} s {done.stderr.strip()!r}",
            )
        done = self.run(
            "srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", "n2", "/nonexistent/prog"
        )
        say("srun rc: program not found", f"{done.returncode} {done.stderr.strip()!r}")
        self.run("scancel", job)

    def client_signals(self) -> None:
        job = self.hold("sigs", per_node=1)
        for sig in ("TERM", "INT", "INT-INT", "HUP", "QUIT", "USR1", "USR2", "CONT"):
            log = self.log()
            proc = self.srun_sigtask(job, "n3", f"sig{sig}", log)
            pid = self.task_pid(log)
            t0 = time.monotonic()
            for k, s in enumerate(sig.split("-")):
                if k:
                    time.sleep(0.3)
                proc.send_signal(getattr(signal, f"SIG{s}"))
            try:
                rc: object = proc.wait(5)
            except subprocess.TimeoutExpired:
                rc = "still running after 5 s"
            took = time.monotonic() - t0
            time.sleep(0.3)
            task = "alive" if alive(pid) else "gone"
            err = proc.stderr.read().strip() if isinstance(rc, int) else ""  # type: ignore[union-attr]
            say(
                f"SIG{sig} to srun client",
                f"srun rc={rc} after {took * 1000:.0f} ms; task saw {self.seen(log)[1:]}; task {task}; srun stderr={err!r}",
            )
            if not isinstance(rc, int):
                self.run("scancel", self.step_of(job, f"sig{sig}"))
                proc.wait(60)
        # SIGTERM to srun: how fast is the step gone?
        times = []
        for _ in range(self.reps):
            log = self.log()
            proc = self.srun_sigtask(job, "n3", "termspeed", log)
            t0 = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            times.append(time.monotonic() - t0)
        say("SIGTERM to srun -> srun exited", med_ms(times))
        self.run("scancel", job)

    def client_killed(self) -> None:
        job = self.hold("orphan", per_node=1)
        task_gone, step_gone = [], []
        for _ in range(self.reps):
            log = self.log()
            proc = self.srun_sigtask(job, "n2", "orphan", log)
            pid = self.task_pid(log)
            t0 = time.monotonic()
            proc.kill()
            proc.wait()
            wait_until(lambda: not alive(pid), 120)  # noqa: B023
            task_gone.append(time.monotonic() - t0)
            wait_until(lambda: not self.step_of(job, "orphan"), 120)
            step_gone.append(time.monotonic() - t0)
            seen = self.seen(log)[1:]
        say("srun client SIGKILLed: remote task ended after", med_ms(task_gone))
        say("srun client SIGKILLed: step gone from squeue after", med_ms(step_gone))
        say("srun client SIGKILLed: signals the task saw (last rep)", seen)
        # the same with --output (no stdio through srun) and --input=none
        log = self.log()
        proc = self.srun_sigtask(
            job, "n2", "orphan-out", log, "--input=none", f"--output={self.work}/orphan.out"
        )
        pid = self.task_pid(log)
        proc.kill()
        proc.wait()
        try:
            gone = f"{wait_until(lambda: not alive(pid), 60) * 1000:.0f} ms"
        except TimeoutError:
            gone = "still alive after 60 s"
        say("srun client SIGKILLed with --input=none --output=FILE: task ended after", gone)
        self.run("scancel", job)

    def cancel_steps(self) -> None:
        job = self.hold("cancel", per_node=1)
        for how, extra, ignore in (
            ("scancel ID.STEP", [], False),
            ("scancel --signal=TERM ID.STEP", ["--signal=TERM"], False),
            ("scancel --signal=TERM ID.STEP (task ignores TERM)", ["--signal=TERM"], True),
            ("scancel ID.STEP (task ignores TERM)", [], True),
        ):
            srun_exit, step_gone, seen, rcs = [], [], [], []
            reps = 1 if ignore else self.reps
            for _ in range(reps):
                log = self.log()
                name = f"c{self.n}"
                proc = self.srun_sigtask(job, "n1", name, log, ignore=ignore)
                step = wait_and(lambda: self.step_of(job, name), 30)  # noqa: B023
                t0 = time.monotonic()
                self.run("scancel", *extra, step)
                try:
                    rcs.append(proc.wait(45 if not extra else 5))
                    srun_exit.append(time.monotonic() - t0)
                except subprocess.TimeoutExpired:
                    rcs.append("srun still running")
                if extra and ignore:
                    time.sleep(1)
                    seen = self.seen(log)[1:]
                    still = bool(self.step_of(job, name))
                    say(f"{how}", f"task saw {seen}; step still listed: {still}; srun: {rcs[-1]}")
                    self.run("scancel", step)
                    proc.wait(60)
                    break
                wait_until(lambda: not self.step_of(job, name), 60)  # noqa: B023
                step_gone.append(time.monotonic() - t0)
                seen = self.seen(log)[1:]
                err = proc.stderr.read().strip()  # type: ignore[union-attr]
            else:
                say(
                    f"{how}",
                    f"srun rc={rcs} exited {med_ms(srun_exit)}; step gone from squeue "
                    f"{med_ms(step_gone)}; task saw {seen}; srun stderr={err!r}",
                )
        self.run("scancel", job)

    def cancel_job(self) -> None:
        gone, srun_rc = [], []
        for i in range(self.reps):
            job = self.hold(f"end{i}", per_node=1)
            log = self.log()
            proc = self.srun_sigtask(job, "n2", "victim", log)
            t0 = time.monotonic()
            self.run("scancel", job)
            wait_until(lambda: self.squeue("-j", job) == "", 60)  # noqa: B023
            gone.append(time.monotonic() - t0)
            srun_rc.append(proc.wait(60))
            if i == 0:
                say("scancel JOB: step task saw", self.seen(log)[1:])
                say("scancel JOB: srun stderr", proc.stderr.read().strip())  # type: ignore[union-attr]
                say(
                    "scancel JOB: scontrol show job -> JobState",
                    [
                        w
                        for w in self.run("scontrol", "show", "job", job).stdout.split()
                        if w.startswith(("JobState", "ExitCode"))
                    ],
                )
        say("scancel JOB -> squeue -j ID empty", med_ms(gone))
        job = self.hold("endignore", per_node=1)
        stubborn = job
        log = self.log()
        proc = self.srun_sigtask(job, "n2", "stubborn", log, ignore=True)
        pid = self.task_pid(log)
        t0 = time.monotonic()
        self.run("scancel", job)
        wait_until(lambda: not alive(pid), 120)
        killed = time.monotonic() - t0
        wait_until(lambda: self.squeue("-j", job) == "", 120)
        say(
            "scancel JOB, task ignores TERM",
            f"task saw {self.seen(log)[1:]}, killed after {killed:.1f} s; squeue empty after "
            f"{time.monotonic() - t0:.1f} s; srun rc={proc.wait(60)}",
        )
        say("scancel JOB: srun rc of a running step", srun_rc)
        # the holder itself ends: what happens to steps?
        job = self.run(
            "sbatch",
            "--parsable",
            "-N1",
            "--job-name=short",
            f"--output={self.work}/%x-%j.out",
            "--wrap",
            "exec sleep 3",
        ).stdout.strip()
        wait_until(lambda: self.squeue("-j", job, "-o", "%T") == "RUNNING", 60)
        log = self.log()
        proc = self.srun_sigtask(job, "n1", "outlived", log)
        rc = proc.wait(60)
        say(
            "holder script exits while a step runs",
            f"srun rc={rc}; task saw {self.seen(log)[1:]}; srun stderr={proc.stderr.read().strip()!r}",
        )  # type: ignore[union-attr]
        # sacct without slurmdbd, and the jobcomp file
        done = self.run("sacct", "-j", job, "-P", "-n", "-o", "JobID,State,ExitCode")
        say(
            "sacct (accounting_storage/none)",
            f"rc={done.returncode} out={done.stdout!r} err={done.stderr.strip()!r}",
        )
        say(
            "squeue -h -j ID -t all -o '%T|%r' after end",
            self.squeue("-j", job, "-t", "all", "-o", "%T|%r"),
        )
        wait_until(lambda: f"JobId={job} " in self.bed.jobcomp_log.read_text(), 30)
        line = next(
            x
            for x in self.bed.jobcomp_log.read_text().splitlines()
            if x.startswith(f"JobId={job} ")
        )
        say("jobcomp/filetxt line", line)
        for ended in (job, stubborn):
            done = self.run(
                "sacct", "-c", "-j", ended, "-P", "-n", "-o", "JobID,JobName,State,ExitCode"
            )
            say(
                f"sacct -c -j {ended} (reads JobCompLoc)",
                f"rc={done.returncode} {done.stdout.strip()!r}",
            )


def wait_and(fn: Callable[[], str], timeout: float) -> str:
    wait_until(fn, timeout)
    return fn()


def _readable(proc: subprocess.Popen[str]) -> bool:
    import select

    assert proc.stdout is not None
    return bool(select.select([proc.stdout.fileno()], [], [], 0)[0])


def lifecycle(reps: int) -> None:
    starts, stops = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="tfpslurm") as tmp:
            bed = SlurmTestbed(Path(tmp))
            t0 = time.monotonic()
            try:
                bed.start()
                bed.wait_ready()
                starts.append(time.monotonic() - t0)
            finally:
                t0 = time.monotonic()
                problems = bed.stop()
                stops.append(time.monotonic() - t0)
            assert not problems, problems
    say("bed start + wait_ready", med_ms(starts))
    say("bed stop", med_ms(stops))


def tuned(reps: int) -> None:
    """A bed with MinJobAge=5 (how an ended job leaves squeue) and batch_sched_delay=0."""
    conf = "MinJobAge=5\nSchedulerParameters=batch_sched_delay=0"
    with (
        tempfile.TemporaryDirectory(prefix="tfpslurm") as tmp,
        SlurmTestbed(Path(tmp), extra_conf=conf) as bed,
    ):
        starts = []
        for i in range(reps):
            t0 = time.monotonic()
            job = bed.run(
                "sbatch",
                "--parsable",
                "-N3",
                f"--job-name=t{i}",
                f"--output={tmp}/%j",
                "--wrap",
                "exec sleep infinity",
            ).stdout.strip()
            wait_until(
                lambda job=job: (
                    bed.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"
                ),
                60,
                0.02,
            )
            starts.append(time.monotonic() - t0)
            bed.run("scancel", job)
        say("batch_sched_delay=0: sbatch -> RUNNING", med_ms(starts))
        t0 = time.monotonic()

        def purged() -> bool:
            return bed.run("squeue", "-h", "-j", job, "-t", "all", check=False).returncode != 0

        wait_until(purged, 120, 0.2)
        done = bed.run("squeue", "-h", "-j", job, check=False)
        say(
            "MinJobAge=5: ended job unknown to squeue after",
            f"{time.monotonic() - t0:.1f} s: rc={done.returncode} {done.stderr.strip()!r}",
        )
        done = bed.run("scontrol", "show", "job", job, check=False)
        say("  then scontrol show job", f"rc={done.returncode} {done.stderr.strip()!r}")
        done = bed.run("scancel", job, check=False)
        say("  then scancel", f"rc={done.returncode} {done.stderr.strip()!r}")
        done = bed.run("squeue", "-h", "-j", "999999", check=False)
        say("squeue -j <never existed>", f"rc={done.returncode} {done.stderr.strip()!r}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=[])
    parser.add_argument("--json", type=Path, help="also write the JSON summary here")
    parser.add_argument(
        "--slurm-conf",
        type=Path,
        help="the slurm.conf of a Slurm test bed that already runs (tests/slurm_testbed.py), "
        "for every experiment but lifecycle and tuned (they start beds of their own)",
    )
    args = parser.parse_args()
    names = [
        "lifecycle",
        "allocation",
        "bad_requests",
        "steps",
        "exit_codes",
        "client_signals",
        "client_killed",
        "cancel_steps",
        "cancel_job",
        "tuned",
    ]
    chosen = args.only or names
    if "lifecycle" in chosen:
        lifecycle(min(args.reps, 3))
    if "tuned" in chosen:
        tuned(args.reps)
    with tempfile.TemporaryDirectory(prefix="tfpslurm") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        if args.slurm_conf is not None:
            bed = SlurmTestbed.attach(args.slurm_conf)
        else:
            bed = SlurmTestbed(Path(tmp) / "bed")
        with bed if args.slurm_conf is None else _clients_of(bed):
            study = Study(bed, work, args.reps)
            try:
                for name in chosen:
                    if name not in ("lifecycle", "tuned"):
                        print(f"## {name}", flush=True)
                        getattr(study, name)()
            finally:
                study.clean_up()
    summary = json.dumps(RESULTS, indent=1, default=str)
    print(summary)
    if args.json is not None:
        args.json.write_text(summary + "\n")


@contextlib.contextmanager
def _clients_of(bed: SlurmTestbed) -> Iterator[SlurmTestbed]:
    """An attached bed: its daemons run on; the clients started here end with the study."""
    try:
        yield bed
    finally:
        problems = bed.stop()
        if problems:
            print("ending the clients:", "; ".join(problems), file=sys.stderr)


if __name__ == "__main__":
    main()
