"""Why did a task fail: gather the evidence through the backend, match it against the catalogue.

Used by the supervisor at the moment a task fails (one line after its own last lines), by
``tfplan status`` for failed tasks, and by ``tfplan explain`` after the fact. Reading the
evidence costs one read of the log's end and, for a task killed by SIGKILL, one read of its
host's kernel log; a log that says the disk is full, one look at that disk's free space: per
failure, never per poll.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tfplan.backends.api import Backend
from tfplan.diagnosis.explain import (
    TAIL_BYTES,
    Evidence,
    Explanation,
    OomKill,
    error_line,
    explain,
    last_lines,
)
from tfplan.diagnosis.frames import error_frames
from tfplan.errors import TfplanError
from tfplan.planning.memory import memory_key
from tfplan.planning.state import TaskRecord

__all__ = ["Diagnosis", "diagnose", "diagnose_output", "free_space", "oom_of"]

KILLED = (137, -9)  # SIGKILL, as the wrapper records it (128 + 9) or as a signal


@dataclass(frozen=True)
class Diagnosis:
    """A failed task (or one that ended without joining the cluster): its explanation when the
    failure is known, else its last lines."""

    task: str
    host: str
    exit_code: int | None
    explanation: Explanation | None
    last_lines: tuple[str, ...]
    error: str | None = None  # the log's error line (explain.error_line), when it has one
    # the innermost frames of the user's own files behind that error (diagnosis/frames.py)
    frames: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        """One line: ``worker/0 failed: <cause> -> <fix>``, or the exit status and last line."""
        if self.explanation is not None:
            ended = "ended" if self.exit_code == 0 else "failed"
            return f"{self.task} {ended}: {self.explanation.line}"
        code = "killed or vanished" if self.exit_code is None else f"exit code {self.exit_code}"
        if self.error:  # the error itself, not a traceback frame or a hint printed after it
            return f"{self.task} failed ({code}): {self.error}"
        last = f"; its last line: {self.last_lines[-1]}" if self.last_lines else ""
        return f"{self.task} failed ({code}){last}"


def oom_of(backend: Backend, task: TaskRecord) -> OomKill | None:
    """The kernel's record of an out-of-memory kill of ``task``, for a task that was killed."""
    if task.exit_code is not None and task.exit_code not in KILLED:
        return None
    try:
        kills = backend.oom_kills(task)
    except TfplanError:
        return None
    if not kills:
        return None
    last = max(kills, key=lambda k: float(k.get("at", 0)))  # type: ignore[arg-type]
    memcg, task_memcg = last.get("memcg"), last.get("task_memcg")
    return OomKill(
        pid=int(last.get("pid", 0)),  # type: ignore[call-overload]
        name=str(last.get("name", "")),
        rss_bytes=int(last.get("rss", 0)),  # type: ignore[call-overload]
        at=float(last.get("at", 0)),  # type: ignore[arg-type]
        memcg=None if memcg is None else str(memcg),
        task_memcg=None if task_memcg is None else str(task_memcg),
    )


def free_space(backend: Backend, host: str, folder: str) -> int | None:
    """Free bytes on the disk that holds ``folder``, as ``host`` sees it (the backend's
    :meth:`~tfplan.backends.api.Backend.free_bytes`: None where it cannot look)."""
    return backend.free_bytes(host, folder)


def diagnose_output(
    task: TaskRecord,
    output: str,
    output_dir: str,
    oom: OomKill | None = None,
    backend: Backend | None = None,
) -> Diagnosis:
    """:func:`diagnose` from evidence already read (``tfplan status`` reads every log's end
    in one round trip per host). ``backend``: where to read the free space of a full disk the
    log names (left out: not read)."""
    evidence = Evidence(
        task.name,
        task.host,
        task.exit_code,
        output,
        output_dir,
        oom,
        task.never_listened,
        memory_limit=task.memory_limit,
        memory_key=f"cluster.memory.{memory_key(task.role, task.is_chief)}",
    )
    found = explain(evidence)
    if found is not None and found.free_space_of and backend is not None:
        free = free_space(backend, task.host, found.free_space_of)
        if free is not None:
            found = explain(replace(evidence, free_bytes=free)) or found
    return Diagnosis(
        task.name,
        task.host,
        task.exit_code,
        found,
        tuple(last_lines(output)),
        error_line(output),
        tuple(error_frames(output)),
    )


def diagnose(backend: Backend, task: TaskRecord, output_dir: str) -> Diagnosis:
    """Read the end of ``task``'s log (and its host's out-of-memory record, for a task that was
    killed) and explain its failure. Never raises: what cannot be read is left out."""
    try:
        output = backend.read_log(task, -TAIL_BYTES).decode(errors="replace")
    except TfplanError:
        output = ""
    return diagnose_output(task, output, output_dir, oom_of(backend, task), backend)
