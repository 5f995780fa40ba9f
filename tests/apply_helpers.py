"""Helpers for the apply tests: run the real `tfplan` CLI in a folder, read its state, check PIDs."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONF = REPO / "conf"

# A stand-in for a training program: any command honouring TF_CONFIG can be launched. Roles:
# ps serves until killed; the chief prints steps then exits with CHIEF_EXIT; workers exit 0
# after WORKER_SECS, or WORKER_EXIT. With gate=PATH a worker creates PATH just before it exits
# and the chief makes no step before PATH exists: the workers have ended before the chief can,
# as an order of events rather than a race between WORKER_SECS and the chief's steps. With
# again_exit=CODE, a worker that starts when PATH is there already (a later life) exits CODE.
# With chief_done=PATH the chief creates PATH as it exits, and with after=PATH a worker waits for
# PATH before its WORKER_SECS: it ends after the chief (again_exit: when PATH was there at start).
FAKE_TASK = r"""
import json, os, sys, time
task = json.loads(os.environ["TF_CONFIG"])["task"]
role, index = task["type"], task["index"]
args = dict(a.split("=", 1) for a in sys.argv[1:])
print(f"{role}/{index} up, cluster of {len(json.loads(os.environ['TF_CONFIG'])['cluster'])} jobs",
      flush=True)
if role == "ps":
    while True:
        time.sleep(0.2)
chief = role == "chief" or (role == "worker" and index == 0 and "chief" not in
                            json.loads(os.environ["TF_CONFIG"])["cluster"])
gate = args.get("gate")
later_life = any(args.get(k) and os.path.exists(args[k]) for k in ("gate", "after"))
if chief:
    deadline = time.monotonic() + 120
    while gate and not os.path.exists(gate):
        if time.monotonic() > deadline:
            sys.exit(9)
        time.sleep(0.02)
    for step in range(1, int(args.get("steps", "3")) + 1):
        print(f"step={step} loss={1.0 / step:.3f}", flush=True)
        time.sleep(float(args.get("step_secs", "0.1")))
    if args.get("chief_done"):
        open(args["chief_done"], "w").close()
    sys.exit(int(args.get("chief_exit", "0")))
deadline = time.monotonic() + 120
while args.get("after") and not later_life and not os.path.exists(args["after"]):
    if time.monotonic() > deadline:
        sys.exit(9)
    time.sleep(0.02)
time.sleep(float(args.get("worker_secs", "0.5")))
if gate:
    open(gate, "w").close()
sys.exit(int(args.get("again_exit" if later_life and "again_exit" in args else "worker_exit", "0")))
"""

# Long enough to outlast any test: tasks that the test itself stops (destroy, Ctrl-C) must not
# end by themselves first, however slowly the test's own CLI calls run.
FOREVER = "1000000"


def paced(secs: float) -> list[str]:
    """The override that has every replica of the TF1 recipes sleep ``secs`` after each step
    (TFPLAN_STEP_PAUSE_SECS, docs/runtime.md): a job that trains without end until an event,
    on a fraction of the CPU; none for 0."""
    return [f"+recipe.env.TFPLAN_STEP_PAUSE_SECS={secs}"] if secs else []


def free_port_base(count: int = 8) -> int:
    """A base port with ``count`` free ports after it on loopback.

    Searched outside the kernel's ephemeral range first: outgoing connections (and their
    TIME_WAIT leftovers, which block a bind) take ports there at random, so after a long test run
    a window of a thousand free ports inside it may not exist. The scan starts at a random point so
    two calls in a row do not hand out the same window. Each test process (CI runs three at once:
    the test beds' and two xdist workers; the README's fast tier four workers) searches its own
    slice of each region first (:data:`PORT_SLOTS`: the beds' and up to four workers'): a window
    is free only until its test binds it, and a test that stops its tasks and starts them again
    (destroy, then apply) leaves it free meanwhile, for another process to take (seen: "port
    28863 is in use" at the second apply).
    """
    low, high = _ephemeral_range()
    regions = [(10000, low), (high + 1, 65000), (low, high + 1)]
    slot = _port_slot()
    for start, end in regions:
        width = (end - start) // PORT_SLOTS
        own = (start + slot * width, start + (slot + 1) * width)
        for first, last in (own, (start, end)):
            base = _random_window(first, last, count)
            if base is not None:
                return base
    raise RuntimeError(f"no {count} consecutive free ports on this machine")


PORT_SLOTS = 5


def _port_slot() -> int:
    """This test process's slice of the port regions: xdist's ``gwN`` -> N + 1, else 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    number = worker[2:] if worker.startswith("gw") else ""
    return (int(number) + 1) % PORT_SLOTS if number.isdigit() else 0


def _random_window(start: int, end: int, count: int) -> int | None:
    """A window of ``count`` free ports in ``[start, end)``, searched from a random point."""
    if end - start < count:
        return None
    offset = random.randrange(start, end - count)
    for first, last in ((offset, end), (start, offset + count)):
        base = _free_window(first, last, count)
        if base is not None:
            return base
    return None


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_window(first: int, last: int, count: int) -> int | None:
    """The lowest port in ``[first, last)`` that starts ``count`` free ports, if any."""
    run = 0
    for port in range(first, last):
        run = run + 1 if _free(port) else 0
        if run == count:
            return port - count + 1
    return None


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def tfplan(
    cwd: Path,
    *args: str,
    timeout: float = 240,
    check: bool = False,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI as a user would, in ``cwd``."""
    full_env = {**os.environ, "TFPLAN_CONF": str(CONF), **(env or {})}
    full_env.pop("TFPLAN_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "tfplan", *args],
        cwd=cwd,
        env=full_env,
        text=True,
        capture_output=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"tfplan {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def base_overrides(tmp: Path, port_base: int, experiment: str = "t") -> list[str]:
    return [
        f"experiment.id={experiment}",
        f"cluster.port_base={port_base}",
        "cluster.port_range=20",
        f"cluster.workdir={tmp}/work",
        f"cluster.output_dir={tmp}/out",
        "lifecycle.ps_grace_secs=1",
        "lifecycle.stop_grace_secs=2",
        # a stopped ps leaves its in-memory snapshots (docs/fault_tolerance.md): in the test's
        # own folder, not the machine's /dev/shm
        f"lifecycle.snapshot_dir={tmp}/shm",
    ]


# The first line of a test program that stands for a TensorFlow program: tfplan starts a warm
# seed only for programs that may import TensorFlow (a script, or a .py file beside it, naming
# it), and forked from the seed the import is done already (it costs nothing there).
TENSORFLOW_PROGRAM = "import tensorflow  # noqa: F401 - a training program's import\n"


def seed_ready_line(project: Path, host: str = "localhost", experiment: str = "t") -> str:
    """The ``seed ready`` line of the warm seed an apply of ``experiment`` forked its tasks from
    on ``host``: a kept seed's folder, as its tasks' handles record it (started by this apply or
    an earlier one), else the experiment's own (``cluster.workdir=<project>/work``, as
    :func:`base_overrides` sets it)."""
    log = project / "work" / "_seed" / host / "seed.log"
    state = project / ".tfplan" / experiment / "state.json"
    if state.exists():
        for task in json.loads(state.read_text())["tasks"]:
            if task["host"] == host and task.get("handle", {}).get("seed"):
                log = Path(task["handle"]["seed"]) / "seed.log"
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("seed ready")]
    assert lines, f"no warm seed's ready line in {log}"
    return lines[-1]


def fake_overrides(tmp: Path, tensorflow: bool = False, **args: str) -> list[str]:
    """The fake task as ``recipe.command``; ``tensorflow``: as a TensorFlow program (forked
    from the host's warm seed; without, it starts cold: it never imports TensorFlow)."""
    script = tmp / ("fake_tf_task.py" if tensorflow else "fake_task.py")
    script.write_text((TENSORFLOW_PROGRAM if tensorflow else "") + FAKE_TASK)
    extra = " ".join(f"{k}={v}" for k, v in args.items())
    return ["recipe=command", f"recipe.command='{sys.executable} {script} {extra}'".rstrip()]


def state_of(cwd: Path, experiment: str = "t") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((cwd / ".tfplan" / experiment / "state.json").read_text())
    return data


def alive(pid: int) -> bool:
    """True when the process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def kill_groups(pgids: list[int]) -> None:
    """Last-resort cleanup by process group (never by name)."""
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


@contextmanager
def small_tmpfs(where: Path, size: str, cwd: Path) -> Iterator[Path]:
    """``where`` (made here) on a tmpfs of ``size`` (``mount -o size=``: 400k, 1m): a disk that
    fills. At the end the process groups the states under ``cwd`` record are killed, then it is
    unmounted (lazily when still busy). Skips the test without root."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        kill_groups(recorded_groups(cwd))
        if subprocess.run(["umount", str(where)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=False)


def recorded_groups(cwd: Path) -> list[int]:
    """The process groups of every task and warm standby the experiments' states record (a
    test that failed half-way leaves its standbys too: on Slurm their srun clients), and of
    the warm seeds a sweep folder (``cwd`` or a folder in it) or an apply's allocation records,
    and of a Spark application's driver."""
    groups: list[int] = []
    for path in [*cwd.glob("seeds.json"), *cwd.glob("*/seeds.json")]:  # a sweep's warm seeds
        groups += [int(seed["pgid"]) for seed in json.loads(path.read_text())["seeds"]]
    for path in (cwd / ".tfplan").glob("*/state.json"):
        state = json.loads(path.read_text())
        data = (state.get("allocation") or {}).get("data") or {}
        # an apply's seeds, but the host's kept one (cluster.warm_keep_secs): other tests fork
        # from it; the run's end stops it (tests/conftest.py stop_kept_seeds)
        groups += [int(s["pgid"]) for s in data.get("seeds") or [] if not s.get("kept")]
        if data.get("driver"):  # a Spark application's driver (spark-submit, detached)
            groups.append(int(data["driver"]["pgid"]))
        # the lost tasks too: a host cut off and back keeps running what it ran (destroy stops
        # them; a test that failed before its destroy must not leave them holding their ports)
        for task in [*state["tasks"], *state.get("standbys", []), *state.get("lost", [])]:
            pgid = task.get("handle", {}).get("pgid")
            if pgid is not None:
                groups.append(int(pgid))
    return groups


class BackgroundTfplan:
    """A tfplan command (``apply``, ``watch``, ``logs -f``, ...) running in the background in
    ``cwd``, its output collected line by line as it comes."""

    def __init__(self, cwd: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tfplan", *args],
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TFPLAN_CONF": str(CONF)},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def finish(self, timeout: float) -> list[str]:
        """Wait for the command to end (killed if it is still running after ``timeout``);
        its lines."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self._reader.join(10)
        return self.lines


def topology(algo: str) -> list[str]:
    """Overrides that fit the local cluster (1 ps, 2 workers, worker 0 the chief) to what the
    registry says ``algo`` needs: no ps for a collective one (allreduce), a chief task of its
    own for one whose chief coordinates (pss). The planner refuses the others' topology."""
    from tfplan.config.algorithms import ALGORITHMS

    needs = ALGORITHMS[algo]
    return [
        *([] if needs.needs_ps else ["cluster.ps=0"]),
        *(["cluster.chief=separate"] if needs.chief else []),
    ]


def minibatches_per_step(algo: str) -> int:
    """Minibatches (of all replicas together) one global step of ``algo`` takes, with the
    shipped defaults, on 2 training replicas."""
    import yaml

    from tfplan.config.algorithms import ALGORITHMS

    if ALGORITHMS[algo].collective:  # one step = one minibatch on every replica, in lockstep
        return 2
    if algo in ("sync", "sync_lr"):
        return 2
    if algo == "sagn":
        return 2 * int(yaml.safe_load((CONF / "algo" / "sagn.yaml").read_text())["window"])
    return 1


EXAMPLES = REPO / "examples"


def example_with_data(example: str, where: Path, *args: str) -> Path:
    """A copy of ``examples/<example>`` at ``where`` (a folder apart from tfplan, as a user's
    project is), with the data its own ``make_data.py data ARGS`` writes: written once per
    test run (:func:`_example_data`) and copied, as the script writes the same bytes each time."""
    import shutil

    shutil.copytree(EXAMPLES / example, where, ignore=shutil.ignore_patterns("__pycache__", "data"))
    shutil.copytree(_example_data(example, args), where / "data")
    return where


def _example_data(example: str, args: tuple[str, ...]) -> Path:
    """``make_data.py data ARGS`` of the example, run once per test run and per script version
    in the run's shared folder (tests/conftest.py), under a lock: the test workers share it."""
    import fcntl
    import hashlib
    import shutil

    script = EXAMPLES / example / "make_data.py"
    version = hashlib.sha256(script.read_bytes()).hexdigest()[:12]
    shared = Path(os.environ["TFPLAN_TEST_RUN_DIR"]) / "example-data"
    shared.mkdir(parents=True, exist_ok=True)
    made = shared / f"{example}-{'-'.join(args) or 'default'}-{version}"
    with open(shared / f"{made.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (made / "data").is_dir():
            shutil.rmtree(made, ignore_errors=True)
            shutil.copytree(
                EXAMPLES / example, made, ignore=shutil.ignore_patterns("__pycache__", "data")
            )
            subprocess.run(
                [sys.executable, "make_data.py", "data.tmp", *args],
                cwd=made,
                check=True,
                capture_output=True,
                timeout=240,
                env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "3"},
            )
            (made / "data.tmp").rename(made / "data")
    return made / "data"
