"""Who supervises an experiment: the record in the state, and whether that process still lives.

One supervisor per experiment: an attached ``tfplan apply``, a ``tfplan watch``, or the
background supervisor that ``tfplan apply --detach`` leaves behind. It records itself in the
state; ``status`` reports it, ``watch`` attaches to a live one instead of starting a second,
``destroy`` stops it.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfplan.planning.state import State, SupervisorRecord

if TYPE_CHECKING:
    from tfplan.engine.store import StateStore

HANDOVER_SECS = 15.0  # how long a supervisor gets to let go (it answers within one tick)

__all__ = [
    "me",
    "stop_supervisor",
    "take_over_from_background",
    "process_alive",
    "start_background_supervisor",
    "supervisor_alive",
    "supervisor_status",
]


def me(detached: bool, log_path: str | None = None) -> SupervisorRecord:
    """The record of the calling process as the experiment's supervisor."""
    return SupervisorRecord(
        pid=os.getpid(),
        host=socket.gethostname(),
        started_at=time.time(),
        detached=detached,
        log_path=log_path,
    )


def process_alive(pid: int) -> bool:
    """True when process ``pid`` exists on this machine and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def supervisor_alive(record: SupervisorRecord | None) -> bool:
    """Whether the recorded supervisor still runs (on this machine; elsewhere it is assumed to,
    since it cannot be checked from here)."""
    if record is None:
        return False
    if record.host != socket.gethostname():
        return True
    if record.pid == os.getpid():
        return True
    return process_alive(record.pid) and _is_tfplan(record.pid)


def _is_tfplan(pid: int) -> bool:
    """The PID is still a tfplan process (not a recycled PID)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(b"tfplan" in part for part in cmdline)


def supervisor_status(state: State) -> dict[str, Any] | None:
    """The supervisor record with ``alive``, for ``status``; None when there is none."""
    record = state.supervisor
    if record is None:
        return None
    return {**record.to_dict(), "alive": supervisor_alive(record)}


def start_background_supervisor(
    store: StateStore, workspace_root: Path, experiment_id: str, log_path: Path
) -> int:
    """Start ``tfplan watch --background`` for the experiment, detached from this terminal (its
    own session: it survives logout and the end of this process), record it in the state as
    the experiment's supervisor, and return its PID.

    It waits for the caller's lock, then supervises exactly as an attached apply would, and
    ends with the training.
    """
    import subprocess
    import sys

    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfplan",
                "watch",
                "--background",
                "-e",
                experiment_id,
                "--workspace",
                str(workspace_root),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    record = replace(me(detached=True, log_path=str(log_path)), pid=proc.pid)
    state = store.load()
    if state is not None:
        store.write(replace(state, supervisor=record), bump=False)
    return proc.pid


def stop_supervisor(record: SupervisorRecord | None, say: Callable[[str], None]) -> None:
    """Ask a live supervisor on this machine to let go (SIGTERM: it stops supervising and leaves
    the tasks running), and wait for it; SIGKILL if it does not within ``HANDOVER_SECS``."""
    if record is None or record.pid == os.getpid() or record.host != socket.gethostname():
        return
    if not supervisor_alive(record):
        return
    say(f"taking over from the supervisor (pid {record.pid})")
    try:
        os.kill(record.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + HANDOVER_SECS
    while process_alive(record.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(record.pid):
        os.kill(record.pid, signal.SIGKILL)


def take_over_from_background(store: StateStore, say: Callable[[str], None]) -> None:
    """Before an apply: a background supervisor of this experiment hands its tasks over."""
    try:
        state = store.load()
    except Exception:  # noqa: BLE001 - a damaged state is reported by whoever reads it next
        return
    if state is not None and state.supervisor is not None and state.supervisor.detached:
        stop_supervisor(state.supervisor, say)
