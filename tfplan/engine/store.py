"""The state file of one experiment: written atomically, guarded by a lock.

Written through a temporary file, fsync and a rename, so a crash never leaves half a state; the
exclusive lock file is held for the whole of an apply, watch or destroy. The data model is
:mod:`tfplan.planning.state`.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from tfplan.errors import StateError, StateLockedError
from tfplan.files import write_atomic
from tfplan.planning.state import STATE_FORMAT_VERSION, State

__all__ = ["LOCK_FILE", "STATE_FILE", "StateStore"]

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"


class StateStore:
    """The state file of one experiment's workspace folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / STATE_FILE
        self.lock_path = self.folder / LOCK_FILE

    @property
    def scratch(self) -> Path:
        """A folder for the backend's own files on this machine (wrappers, local logs)."""
        return self.folder / "backend"

    def load(self) -> State | None:
        """The current state, or None when nothing was ever applied here.

        Raises:
            StateError: the file is damaged or of another format version.
        """
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
            version = int(data.get("version", 1))
            if version != STATE_FORMAT_VERSION:
                raise StateError(
                    f"{self.path} was written by another tfplan (state format {version}, this one "
                    f"reads {STATE_FORMAT_VERSION}): stop its tasks with that version's `tfplan "
                    "destroy`, or move the file away"
                )
            return State.from_dict(data)
        except (ValueError, KeyError, TypeError) as error:
            raise StateError(
                f"{self.path} is damaged ({type(error).__name__}: {error}): move it away and check "
                "for tasks left running"
            ) from None

    def write(self, state: State, bump: bool = True) -> State:
        """Write ``state`` atomically with the serial bumped by one; return what was written.

        Args:
            bump: False for changes that no plan depends on (who supervises), so that a saved
                plan does not go stale when supervision is handed over.
        """
        written = replace(state, serial=state.serial + 1) if bump else state
        write_atomic(
            self.path,
            json.dumps(written.to_dict(), indent=1, sort_keys=True),
            mode=0o600,
            durable=True,
        )
        return written

    def lock_holder(self) -> str:
        """Who took the lock last (``tfplan watch (pid N)``), whether or not it still holds it;
        empty when nobody has."""
        try:
            return self.lock_path.read_text().strip()
        except OSError:
            return ""

    @contextmanager
    def lock(self, what: str = "apply", wait_secs: float = 0.0) -> Iterator[None]:
        """Hold the experiment's lock; a second holder is refused (after ``wait_secs``).

        Raises:
            StateLockedError: another tfplan process holds the lock.
        """
        self.folder.mkdir(parents=True, exist_ok=True)
        handle = open(self.lock_path, "a+")  # noqa: SIM115 - held for the context's lifetime
        try:
            deadline = time.monotonic() + wait_secs
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() < deadline:
                        time.sleep(0.1)
                        continue
                    handle.seek(0)
                    holder = handle.read().strip() or "another tfplan process"
                    raise StateLockedError(
                        f"the workspace {self.folder} is locked by {holder}: wait for it to "
                        f"finish, or stop it (Ctrl-C) before running {what}"
                    ) from None
            handle.seek(0)
            handle.truncate()
            handle.write(f"tfplan {what} (pid {os.getpid()})")
            handle.flush()
            yield
        finally:
            handle.close()
