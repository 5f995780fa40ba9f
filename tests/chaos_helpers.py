"""A running `tfplan apply` whose output the test can wait on, and checks every chaos test makes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from apply_helpers import CONF, alive, state_of

STEP = re.compile(r"^(\S+)\s+\| .*\bstep=(\d+)")


class ApplyRun:
    """`tfplan apply` (or another supervising verb, e.g. ``verb=("watch",)``) in the
    background; its stdout lines collected with arrival times."""

    started: list[ApplyRun] = []  # every run started, so that a failed test can stop its own

    def __init__(
        self,
        cwd: Path,
        args: list[str],
        env: dict[str, str] | None = None,
        verb: Sequence[str] = ("apply", "--auto-approve"),
    ) -> None:
        self.cwd = cwd
        self.lines: list[tuple[float, str]] = []
        self._cond = threading.Condition()
        env = {**os.environ, "TFPLAN_CONF": str(CONF), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfplan", *verb, *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        ApplyRun.started.append(self)

    @classmethod
    def kill_all(cls, cwd: Path) -> None:
        """Kill (by PID: our own children) the runs in ``cwd`` still going, e.g. after a failed
        assertion: a left-over supervisor would go on restarting the tasks the test cleans up."""
        for run in [r for r in cls.started if r.cwd == cwd]:
            if run.proc.poll() is None:
                run.proc.kill()
                run.proc.wait(10)
            cls.started.remove(run)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float, after: int = 0) -> int:
        """Index of the first line (from ``after``) matching ``pattern``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i in range(after, len(self.lines)):
                    if regex.search(self.lines[i][1]):
                        return i
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no line matching {pattern!r} within {timeout}s:\n{self._tail()}"
                    )
                self._cond.wait(min(left, 0.5))

    def _tail(self) -> str:
        """The last 40 lines, and before them the last 40 that are not progress lines (what
        tfplan and the tasks said: a restart, a restore), which progress lines would hide."""
        said = [line for _, line in self.lines if not STEP.match(line)][-40:]
        last = [line for _, line in self.lines[-40:]]
        if not last:
            return "(no output yet)"
        return "\n".join(
            ["-- the last lines other than progress:", *said, "-- the last lines:", *last]
        )

    def wait_step(self, step: int, timeout: float, task: str = r"\S+", after: int = 0) -> int:
        """Index of the first progress line (from ``after``) of ``task`` at ``step`` or later."""
        deadline = time.monotonic() + timeout
        while True:
            i = self.wait_for(
                rf"^{task}\s+\| .*\bstep=\d+", max(0.1, deadline - time.monotonic()), after
            )
            match = STEP.match(self.lines[i][1])
            if match and int(match.group(2)) >= step:
                return i
            after = i + 1

    def finish(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self._reader.join(5)
        return code

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def steps(self, after: int = 0, until: int | None = None) -> list[tuple[str, int]]:
        """(task, global step) of every progress line in lines[after:until]."""
        out = []
        for _, line in self.lines[after:until]:
            match = STEP.match(line)
            if match:
                out.append((match.group(1), int(match.group(2))))
        return out


def task_record(cwd: Path, name: str, experiment: str = "t") -> dict[str, Any]:
    return next(t for t in state_of(cwd, experiment)["tasks"] if t["name"] == name)


def kill_task(cwd: Path, name: str, sig: int = signal.SIGKILL) -> dict[str, Any]:
    """Send ``sig`` to a task's whole process group, as a crash or the OOM killer would."""
    task = task_record(cwd, name)
    os.killpg(task["handle"]["pgid"], sig)
    return task


@contextmanager
def held(cwd: Path, name: str) -> Iterator[dict[str, Any]]:
    """Freeze a task (SIGSTOP to its process group) for the block, then let it go on (SIGCONT).

    Why: a fault whose repair the test wants to see must be repaired before the job ends. Holding
    a task the job cannot end without (the chief) turns "the repair comes before the end" from a
    race against the length of training into an order of events, on any machine speed. A task
    that was killed meanwhile is simply gone at the end of the block.
    """
    task = kill_task(cwd, name, signal.SIGSTOP)
    try:
        yield task
    finally:
        try:
            os.killpg(task["handle"]["pgid"], signal.SIGCONT)
        except ProcessLookupError:
            pass


def checkpoint_steps(output_dir: Path) -> list[int]:
    return sorted(
        int(m.group(1))
        for p in output_dir.glob("model.ckpt-*.index")
        if (m := re.search(r"ckpt-(\d+)\.index$", p.name))
    )


def committed_checkpoint_step(output_dir: Path) -> int:
    """The step of the checkpoint that ``output_dir/checkpoint`` names (what
    ``tf.train.latest_checkpoint``, so the evaluator, finds): a saver writes a checkpoint's files
    before it names it there, so the newest files can be a step ahead (0 when none is named)."""
    try:
        text = (output_dir / "checkpoint").read_text()
    except FileNotFoundError:
        return 0
    match = re.search(r'^model_checkpoint_path: ".*?ckpt-(\d+)"', text, re.M)
    return int(match.group(1)) if match else 0


def final_checkpoint_step(output_dir: Path) -> int:
    """The global step stored in the latest checkpoint, read by TensorFlow itself (in this
    process: a subprocess per call paid TensorFlow's import, about 6 s of CPU, each time)."""
    import tensorflow as tf

    path = tf.train.latest_checkpoint(str(output_dir))
    assert path, f"no checkpoint in {output_dir}"
    return int(tf.train.load_checkpoint(path).get_tensor("global_step"))


def assert_nothing_left(cwd: Path, experiment: str = "t", log: str = "") -> None:
    """No task recorded as running and no task process alive; ``log`` (the supervisor's
    output) goes into the failure message."""
    state = state_of(cwd, experiment)
    assert all(t["status"] != "running" for t in state["tasks"]), f"{state['tasks']}\n{log}"
    left = {
        t["name"]: f"recorded {t['status']}, /proc: {_proc_stat(t['handle']['pid'])}"
        for t in state["tasks"]
        if alive(t["handle"]["pid"])
    }
    assert not left, f"still running: {left}\n{log}"


def _proc_stat(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().strip()[:120]
    except OSError:
        return "gone"
