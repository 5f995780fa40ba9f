"""A sweep's warm seeds: one process per host that imports TensorFlow once for every point.

Each point of a sweep is a new cluster, and every Python task of it would import TensorFlow
again (seconds of CPU each: most of a short point's time). With ``sweep.warm=true`` (the
default) the sweep starts a seed (:mod:`tfplan.backends.transports.seeds`) on each host its points use, the
first time a point needs the host, waits until it has imported, and every point's backend forks
its tasks from it. The seeds are the sweep's: recorded in ``<sweep dir>/seeds.json`` (written
atomically) as soon as they start, stopped by process group when the sweep ends, and stopped
from that record by the next run of the same sweep if a sweep died without stopping them.

Backends with ``capabilities.sweep_seeds`` (the process backend: local and SSH hosts) share
seeds between points; on Slurm each point's job starts seeds of its own (its allocation's, as any
apply's: ``capabilities.warm_starts``); elsewhere each task starts the usual way.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tfplan.backends import backend_class, open_backend
from tfplan.backends.api import Backend
from tfplan.backends.transports.seeds import WarmSeed, seed_env, worth_a_seed
from tfplan.errors import TfplanError
from tfplan.files import write_atomic
from tfplan.planning.plan import Plan

__all__ = ["READY_WAIT_SECS", "SweepSeeds"]

READY_WAIT_SECS = 120.0  # a seed that has not imported by then is stopped; tasks start cold
SEEDS_FILE = "seeds.json"

Say = Callable[[str], None]


class SweepSeeds:
    """The seeds of one sweep (see the module docstring). Thread-safe: points running at once
    ask for their hosts' seeds together, and a host's seed starts once."""

    def __init__(self, sweep_id: str, sweep_dir: Path, scratch: Path, say: Say) -> None:
        self.sweep_id = sweep_id
        self.path = Path(sweep_dir) / SEEDS_FILE
        self.scratch = scratch
        self.say = say
        self._seeds: dict[str, WarmSeed] = {}
        self._failed: set[str] = set()
        self._backend: Backend | None = None
        self._lock = threading.Lock()

    def for_plan(self, plan: Plan) -> tuple[WarmSeed, ...]:
        """The seeds a point's tasks can be forked from: started (and waited for) on the hosts
        of ``plan`` that have none yet. Empty where the backend has no seeds."""
        if not backend_class(plan.backend.name).capabilities.sweep_seeds:
            return ()
        with self._lock:
            if self._backend is None:
                backend = open_backend(plan.backend, self.scratch)
                self._backend = backend
                self._stop_leftovers(backend)
            wanted = {}
            for task in plan.tasks:
                if task.host in self._seeds or task.host in self._failed:
                    continue
                if worth_a_seed(task.command, task.workdir) and task.host not in wanted:
                    wanted[task.host] = task
            started = [self._start(host, task, plan) for host, task in wanted.items()]
            for seed in started:
                if seed is not None:
                    self._wait_ready(seed)
            return tuple(self._seeds.values())

    def _start(self, host: str, task: object, plan: Plan) -> WarmSeed | None:
        from tfplan.planning.plan import Task

        assert isinstance(task, Task) and self._backend is not None
        # beside the points' folders, named for the sweep (two sweeps never share a seed)
        folder = posixpath.join(
            posixpath.dirname(posixpath.dirname(plan.code_dir)), f"_seed-{self.sweep_id}"
        )
        # Keras 3 only where a task of this (the first) point may use it: a later point's
        # task that does still forks from the seed and imports Keras itself
        keras = any(t.keras for t in plan.tasks if t.host == host)
        try:
            seed = self._backend.start_seed(
                host, folder, task.command[0], seed_env(task.command, task.env), keras
            )
        except TfplanError as error:
            self._failed.add(host)
            self.say(f"warm seed on {host} could not start ({error}); its tasks start cold")
            return None
        self._seeds[host] = seed
        self._write()
        return seed

    def _wait_ready(self, seed: WarmSeed) -> None:
        assert self._backend is not None
        began = time.monotonic()
        why = f"not ready in {READY_WAIT_SECS:.0f}s"
        while time.monotonic() - began < READY_WAIT_SECS:
            try:
                if self._backend.seed_ready(seed):
                    took = time.monotonic() - began
                    without = "" if seed.keras else ", TensorFlow without Keras"
                    self.say(
                        f"warm seed on {seed.host} ready in {took:.1f}s (pid {seed.pid}"
                        f"{without}): tasks fork from it"
                    )
                    return
            except TfplanError as error:
                why = str(error)
                break
            time.sleep(0.1)
        self.say(f"warm seed on {seed.host} stopped ({why}): its tasks start cold")
        self._failed.add(seed.host)
        self._stop(seed)
        del self._seeds[seed.host]
        self._write()

    def _write(self) -> None:
        data = {"sweep_id": self.sweep_id, "seeds": [s.to_dict() for s in self._seeds.values()]}
        write_atomic(self.path, json.dumps(data, indent=2) + "\n")

    def _stop(self, seed: WarmSeed) -> None:
        assert self._backend is not None
        try:
            self._backend.stop_seed(seed)
        except TfplanError as error:
            self.say(f"could not stop the warm seed on {seed.host} (pid {seed.pid}): {error}")

    def close(self) -> None:
        """Stop every seed (the sweep has ended); its record goes with them."""
        with self._lock:
            for seed in list(self._seeds.values()):
                self._stop(seed)
            self._seeds.clear()
            self.path.unlink(missing_ok=True)
            if self._backend is not None:
                self._backend.close()
                self._backend = None

    def _stop_leftovers(self, backend: Backend) -> int:
        """Stop the seeds an earlier run of this sweep recorded and did not stop (it was
        killed); returns how many were found."""
        try:
            data = json.loads(self.path.read_text())
            left = [WarmSeed.from_dict(s) for s in data.get("seeds", [])]
        except (OSError, ValueError, KeyError, TypeError):
            return 0
        if not left:
            return 0
        for seed in left:
            try:
                backend.stop_seed(seed)
            except TfplanError as error:
                self.say(f"could not stop an earlier warm seed on {seed.host}: {error}")
        self.path.unlink(missing_ok=True)
        self.say(f"stopped {len(left)} warm seed(s) an earlier run of this sweep left")
        return len(left)
