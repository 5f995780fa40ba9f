"""Test helper: a real ps/worker/evaluator cluster of ``python -m recipes.train`` processes.

Ports are free loopback ports; every task gets TF_CONFIG and its own process group. The tasks
are forked from one warm seed per test process (tfplan's own, through the process backend, as
``tfplan apply`` starts them; TensorFlow imported once instead of once per task), or started
cold when the seed cannot take them (another import-time environment). Waits have deadlines and
watch observable events (log lines, files, exits). :meth:`RecipeCluster.close` kills every
process group it started, by id; :func:`stop_warm_seed` the seed, at the session's end.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from apply_helpers import free_port_base

from tfplan.backends.api import LaunchRequest
from tfplan.backends.process import ProcessBackend
from tfplan.backends.transports.scripts import handle_exit_file
from tfplan.backends.transports.seeds import WarmSeed, seed_env
from tfplan.planning.plan import BackendRef
from tfplan.planning.state import Allocation

REPO = Path(__file__).resolve().parent.parent
# What every task gets besides os.environ (and the seed is started with: read at import)
TASK_ENV = {
    "PYTHONUNBUFFERED": "1",
    "TF_CPP_MIN_LOG_LEVEL": "3",
    "TF_ENABLE_ONEDNN_OPTS": "0",
    "CUDA_VISIBLE_DEVICES": "",
    "PYTHONPATH": str(REPO),
}
COMMAND = (sys.executable, "-m", "recipes.train", "--config")


def free_ports(n: int) -> list[int]:
    """n consecutive free TCP ports on loopback, outside the kernel's ephemeral range where
    there is room (:func:`apply_helpers.free_port_base`): a task restarted with the same
    TF_CONFIG binds its port again, and a port in that range can meanwhile be taken as the
    source port of any process's outgoing connection (seen in CI: a survivor of an all-reduce
    group restarted with "Could not start gRPC server")."""
    base = free_port_base(n)
    return list(range(base, base + n))


def run_config(
    output_dir: Path, algo: dict[str, Any], max_steps: int = 200, **overrides: Any
) -> dict[str, Any]:
    """A run.yaml as the launcher would write it (small and fast by default)."""
    cfg: dict[str, Any] = {
        "experiment": {"id": "test"},
        "output_dir": str(output_dir),
        "algo": {"lr": 0.1, "optimizer": "sgd", "sync": False, **algo},
        "model": {"name": "mlp", "hidden": [32], "conv_channels": [], "dense": 64},
        "data": {
            "name": "digits",
            "path": None,
            "image_size": 8,
            "channels": 1,
            "num_classes": 10,
            "batch_size": 32,
            "eval_fraction": 0.2,
            "synthetic_examples": 2000,
            "seed": 0,
        },
        "trainer": {
            "max_steps": max_steps,
            "checkpoint_steps": 50,
            "checkpoint_secs": None,
            "summary_steps": 20,
            "log_steps": 20,
            "eval_secs": 0.5,
            "seed": 0,
        },
    }
    # in-memory snapshots in the test's folder: a stopped ps leaves them
    cfg["snapshots"] = {"secs": 1.0, "folder": str(Path(output_dir).parent / "shm")}
    for section, values in overrides.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


class LaunchedProcess:
    """The part of ``subprocess.Popen`` the tests use, for a task the process backend started
    (forked from the warm seed, or by its wrapper): not this process's child, its end is read
    from its exit record (written by the task, or by the seed or the wrapper for a death by a
    signal). ``pid`` is its process group's id, which the tests signal."""

    def __init__(self, pid: int, exit_file: str, log_path: str) -> None:
        self.pid = pid
        self.exit_file = Path(exit_file)
        self.log_path = Path(log_path)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                text = self.exit_file.read_text().strip()
            except FileNotFoundError:
                return None
            if not text.lstrip("-").isdigit():
                return None  # being written
            code = int(text)
            # the seed records a death by signal N as 128+N; Popen says -N (no recipe exits
            # with a code above 128 by itself)
            self.returncode = -(code - 128) if 128 < code < 160 else code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            time.sleep(0.05)
        assert self.returncode is not None
        return self.returncode


def _wait_group_gone(pgid: int, timeout: float) -> None:
    """Until no process of group ``pgid`` is left, reaped (a zombie still counts), or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)


class Task:
    """One started task: its process, and its output lines collected by a reader thread."""

    def __init__(self, name: str, proc: subprocess.Popen[str] | LaunchedProcess, started: float):
        self.name = name
        self.proc = proc
        self.started = started
        self.lines: list[tuple[float, str]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        if isinstance(self.proc, LaunchedProcess):
            self._tail(self.proc)
            return
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def _tail(self, proc: LaunchedProcess) -> None:
        """The log file's lines as they come, until the task has ended and all are read."""
        while not proc.log_path.exists():  # the launch makes it; wait rather than assume
            if proc.poll() is not None:
                return
            time.sleep(0.05)
        with open(proc.log_path, "rb") as log:
            rest = b""
            while True:
                ended = proc.poll() is not None
                data = log.read()
                if data:
                    *whole, rest = (rest + data).split(b"\n")
                    now = time.monotonic()
                    self.lines.extend((now, line.decode(errors="replace")) for line in whole)
                elif ended:
                    if rest:
                        self.lines.append((time.monotonic(), rest.decode(errors="replace")))
                    return
                else:
                    time.sleep(0.05)

    def read_to_end(self, timeout: float = 30) -> None:
        """Wait until every line of an ended task has been read (its reader then stops)."""
        self._reader.join(timeout)

    @property
    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def steps(self) -> list[int]:
        return [
            int(m.group(1))
            for _, line in self.lines
            for m in [re.search(r"\bstep=(\d+)", line)]
            if m
        ]

    def first_line_time(self, pattern: str) -> float | None:
        for t, line in self.lines:
            if re.search(pattern, line):
                return t
        return None


class _Warm:
    """This test process's warm seed, started on first use, and the backend that forks from it."""

    backend: ProcessBackend | None = None
    seed: WarmSeed | None = None
    folder: Path | None = None
    failed: str | None = None


def _warm_backend() -> ProcessBackend | None:
    """The process backend forking from this process's warm seed (started, and waited for, on
    first use); None when the seed could not start (the tasks then start cold)."""
    if _Warm.backend is None and _Warm.failed is None:
        folder = Path(tempfile.mkdtemp(prefix="recipe-cluster-seed-"))
        ref = BackendRef("process", {"hosts": [{"name": "localhost", "address": "127.0.0.1"}]})
        backend = ProcessBackend(ref, folder / "scratch")
        env = seed_env(COMMAND, {**os.environ, **TASK_ENV})
        try:
            seed = backend.start_seed("localhost", str(folder / "seed"), sys.executable, env)
            deadline = time.monotonic() + 300
            while not backend.seed_ready(seed):
                if time.monotonic() > deadline:
                    backend.stop_seed(seed)
                    raise TimeoutError("the warm seed was not ready in 300 s")
                time.sleep(0.1)
        except Exception as error:  # noqa: BLE001 - tasks start cold then, as tfplan's do
            _Warm.failed = str(error)
            backend.close()
            shutil.rmtree(folder, ignore_errors=True)
            return None
        backend.use_seeds([seed])
        _Warm.backend, _Warm.seed, _Warm.folder = backend, seed, folder
        # besides the session fixture: two seeds outlived a full-tier run once (cause not found)
        atexit.register(stop_warm_seed)
    return _Warm.backend


def stop_warm_seed() -> None:
    """Stop this test process's seed (by its process group), if one was started, and remove its
    folder."""
    if _Warm.backend is not None and _Warm.seed is not None:
        _Warm.backend.stop_seed(_Warm.seed)
        _Warm.backend.close()
    if _Warm.folder is not None:
        shutil.rmtree(_Warm.folder, ignore_errors=True)
    _Warm.backend = _Warm.seed = _Warm.folder = None


class RecipeCluster:
    """ps + workers (+ chief) (+ evaluator) on loopback, for one run config."""

    def __init__(
        self,
        workdir: Path,
        cfg: dict[str, Any],
        n_ps: int = 1,
        n_workers: int = 2,
        chief: bool = False,
        evaluator: bool = False,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.cfg = cfg
        self.env = env or {}
        self.output_dir = Path(cfg["output_dir"])
        self.config_path = workdir / "run.yaml"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(cfg))
        ports = free_ports(n_ps + n_workers + (1 if chief else 0))
        addr = [f"127.0.0.1:{p}" for p in ports]
        self.cluster: dict[str, list[str]] = {
            "ps": addr[:n_ps],
            "worker": addr[n_ps : n_ps + n_workers],
        }
        if chief:
            self.cluster["chief"] = addr[n_ps + n_workers :]
        self.roles = [("ps", i) for i in range(n_ps)] + [("worker", i) for i in range(n_workers)]
        self.roles += [("chief", 0)] if chief else []
        self.roles += [("evaluator", 0)] if evaluator else []
        self.tasks: dict[str, Task] = {}
        self.dead: list[Task] = []  # replaced tasks, kept so close() still reaps them

    def write_config(self, cfg: dict[str, Any]) -> None:
        """Replace run.yaml (same output_dir): tasks started from now on read this one, as a
        relaunch with a changed config would (e.g. a resumed run with another max_steps)."""
        assert Path(cfg["output_dir"]) == self.output_dir
        self.cfg = cfg
        self.config_path.write_text(yaml.safe_dump(cfg))

    def start(self, role: str, index: int) -> Task:
        name = f"{role}/{index}"
        if name in self.tasks:
            self.dead.append(self.tasks[name])
        tf_config = json.dumps({"cluster": self.cluster, "task": {"type": role, "index": index}})
        env = {**os.environ, **TASK_ENV, "TFPLAN_TASK": name, **self.env}
        command = (*COMMAND, str(self.config_path))
        backend = _warm_backend()
        if backend is not None:
            # each life its own workdir (the seed writes the log and the exit record there);
            # the run config and the output stay the cluster's
            life = self.workdir / "tasks" / f"{name.replace('/', '-')}.{len(self.dead)}"
            request = LaunchRequest(
                name=name,
                role=role,
                index=index,
                host="localhost",
                command=command,
                env=env,
                workdir=str(life),
                log_path=str(life / "task.log"),
                devices=(),
                tf_config=tf_config,
            )
            # forked, or started the usual way where the seed cannot take it (another value
            # of a variable read at import): either way its end is in its exit record
            handle = backend.launch(request, Allocation()).handle
            proc = LaunchedProcess(
                int(str(handle["pgid"])),
                handle_exit_file(handle, request.workdir),
                request.log_path,
            )
            self.tasks[name] = Task(name, proc, time.monotonic())
            return self.tasks[name]
        popen = subprocess.Popen(
            command,
            cwd=str(self.workdir),
            env={**env, "TF_CONFIG": tf_config},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.tasks[name] = Task(name, popen, time.monotonic())
        return self.tasks[name]

    def roles_names(self) -> list[str]:
        """Every task this cluster starts with :meth:`start_all`, by name (``worker/1``)."""
        return [f"{role}/{index}" for role, index in self.roles]

    def start_all(self) -> None:
        for role, index in self.roles:
            self.start(role, index)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        task = self.tasks[name]
        try:
            os.killpg(task.proc.pid, sig)
        except ProcessLookupError:
            pass
        task.proc.wait(timeout=30)

    def signal(self, name: str, sig: int) -> None:
        """Send ``sig`` to a task's process group (e.g. SIGSTOP / SIGCONT to hold it)."""
        os.killpg(self.tasks[name].proc.pid, sig)

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{self.dump()}")

    def wait_exit(self, name: str, timeout: float) -> int:
        task = self.tasks[name]
        try:
            code = task.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} did not exit within {timeout}s\n{self.dump()}") from None
        task.read_to_end()  # its last lines, which the test reads next
        return code

    def wait_all(self, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        return {
            name: self.wait_exit(name, max(0.1, deadline - time.monotonic()))
            for name in list(self.tasks)
        }

    def result(self) -> dict[str, Any]:
        return json.loads((self.output_dir / "result.json").read_text())

    def dump(self) -> str:
        return "\n".join(
            f"--- {name} (rc={t.proc.poll()})\n{t.text[-3000:]}" for name, t in self.tasks.items()
        )

    def close(self) -> None:
        """Kill every process group this cluster started (by id), then reap."""
        for task in [*self.dead, *self.tasks.values()]:
            if task.proc.poll() is None:
                try:
                    os.killpg(task.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                task.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            if isinstance(task.proc, LaunchedProcess):
                # its exit record can come before the seed reaps it: the folder is the test's
                # to remove once the group is gone (the seed decides about the record before)
                _wait_group_gone(task.proc.pid, timeout=10)

    def __enter__(self) -> RecipeCluster:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# --- In-process cluster for the rule tests (ALGORITHMS.md "Correctness tests") -------------------


class InProcessCluster:
    """ps and worker ``tf.distribute.Server`` objects in this process, on loopback ports.

    Each replica gets its own graph and session (between-graph replication), so a test can step
    the workers round-robin from one thread, deterministically. Servers cannot be stopped in
    process; make a fresh cluster per test (shared resources such as the sync token queue would
    otherwise leak between tests).
    """

    def __init__(self, n_ps: int = 1, n_workers: int = 2) -> None:
        import tensorflow as tf

        ports = free_ports(n_ps + n_workers)
        addr = [f"127.0.0.1:{p}" for p in ports]
        self.cluster = {"ps": addr[:n_ps], "worker": addr[n_ps:]}
        spec = tf.train.ClusterSpec(self.cluster)
        self.ps = [
            tf.distribute.Server(spec, job_name="ps", task_index=i, start=True) for i in range(n_ps)
        ]
        self.workers = [
            tf.distribute.Server(spec, job_name="worker", task_index=i, start=True)
            for i in range(n_workers)
        ]
        self.spec = spec
