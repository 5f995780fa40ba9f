"""What a running job may be told after it started: ``live.json`` beside ``run.yaml``.

A launcher that changes a running job in place (workers added or removed, a new step budget)
writes, atomically, a small JSON object into the folder of each task's ``run.yaml``:

- ``replicas``: how many training replicas take part, counting every one that ever joined (a
  replica that left sent its done token too): the parameter servers exit, and the chief writes
  its final checkpoint, once that many done tokens are in;
- ``max_steps``: the global step at which every replica stops (overrides ``trainer.max_steps``);
- ``leave``: task names (``worker/3``) asked to leave after their next push, as SIGUSR2 asks
  where the launcher can signal (Kubernetes cannot).

Absent, older than ``run.yaml`` by more than :data:`SAME_WRITE_SECS` (left from an earlier
start: a new start writes ``run.yaml`` again; a Kubernetes ConfigMap volume rewrites both at
once, in any order), or a key missing: what TF_CONFIG and ``run.yaml`` said at the start. A task reads it at
most every :data:`READ_EVERY_SECS` (a ``stat`` when nothing changed).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

__all__ = ["LIVE_FILE", "READ_EVERY_SECS", "SAME_WRITE_SECS", "Live"]

LIVE_FILE = "live.json"
READ_EVERY_SECS = 0.5
SAME_WRITE_SECS = 2.0


class Live:
    """The live values of one task, read from ``<folder of run.yaml>/live.json``."""

    def __init__(self, run_yaml: Optional[str]) -> None:
        folder = os.path.dirname(os.path.abspath(run_yaml)) if run_yaml else None
        self.path = os.path.join(folder, LIVE_FILE) if folder else None
        self.run_yaml = run_yaml
        self._values: dict[str, Any] = {}
        self._stamp: Optional[tuple[int, int]] = None
        self._read_at = 0.0

    def get(self, key: str, default: int) -> int:
        """The told value of ``key``, else ``default``."""
        self._refresh()
        value = self._values.get(key)
        return int(value) if isinstance(value, (int, float)) and value > 0 else default

    def names(self, key: str) -> list[str]:
        """The told list of names under ``key`` (empty when none)."""
        self._refresh()
        value = self._values.get(key)
        return [str(v) for v in value] if isinstance(value, list) else []

    def _refresh(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._read_at < READ_EVERY_SECS:
            return
        self._read_at = now
        try:
            info = os.stat(self.path)
            started = os.stat(self.run_yaml).st_mtime_ns if self.run_yaml else 0
        except OSError:
            self._values, self._stamp = {}, None
            return
        if info.st_mtime_ns < started - SAME_WRITE_SECS * 1e9:  # told to an earlier start
            self._values, self._stamp = {}, None
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        try:
            with open(self.path) as f:
                values = json.load(f)
        except (OSError, ValueError):
            return  # being replaced: the next read sees the new one
        if isinstance(values, dict):
            self._values, self._stamp = values, stamp
