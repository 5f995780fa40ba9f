"""Match what is known of a failed task against the catalogue: one line, the cause and the fix.

Pure: the caller gathers the evidence (the task's exit status, the end of its log, the host's
out-of-memory record) through its backend; nothing here reads files or runs anything.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from tfplan.diagnosis.catalogue import CATALOGUE, KnownFailure
from tfplan.diagnosis.frames import last_error, project_path

__all__ = [
    "Evidence",
    "Explanation",
    "OomKill",
    "bytes_text",
    "error_line",
    "explain",
    "last_lines",
    "size_text",
]

# the end of a log is enough: a program's fatal error is its last words
TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class OomKill:
    """The kernel's record of a process it killed for want of memory."""

    pid: int
    name: str
    rss_bytes: int  # 0: not known (a container's kill reported by its scheduler)
    at: float  # unix time
    # the memory cgroup whose limit was reached ("": the host's own memory ran out) and the
    # killed process's own; None: the kernel did not say
    memcg: str | None = None
    task_memcg: str | None = None

    @property
    def own_limit(self) -> bool:
        """Whether the kill may be the process's own cgroup's limit (not the host's memory,
        nor a limit of a group above its own); True where the kernel did not say."""
        return self.memcg is None or (bool(self.memcg) and self.memcg == self.task_memcg)


@dataclass(frozen=True)
class Evidence:
    """What tfplan knows of one failed task."""

    task: str
    host: str
    exit_code: int | None
    output: str  # the end of its log
    output_dir: str = ""
    oom: OomKill | None = None
    never_listened: bool = False  # ran with a port, never seen listening on it
    free_bytes: int | None = None  # free space where the log says the disk is full, when read
    memory_limit: int | None = None  # its memory cgroup's limit (cluster.memory), if any
    memory_key: str = ""  # the key that set it: cluster.memory.worker


@dataclass(frozen=True)
class Explanation:
    """A known failure's cause and fix, filled in. ``free_space_of``: a folder whose free
    space the cause would say, not read yet (the caller reads it and explains again with
    ``Evidence.free_bytes``)."""

    id: str
    cause: str
    fix: str
    free_space_of: str | None = None

    @property
    def line(self) -> str:
        return f"{self.cause} -> {self.fix}"


def size_text(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def bytes_text(n: int) -> str:
    """A size for people, down to bytes (a full disk has little or nothing left)."""
    if n >= 2**20:
        return size_text(n)
    return f"{n / 2**10:.0f} KiB" if n >= 2**10 else f"{n} bytes"


def _fields(entry: KnownFailure, evidence: Evidence, groups: dict[str, str]) -> dict[str, str]:
    step = groups.get("step") or groups.get("step2")
    flags = groups.get("flags") or groups.get("flag") or groups.get("flag2") or "a flag"
    if groups.get("flag") and not flags.startswith("-"):
        flags = f"--{flags}"
    address = groups.get("address") or groups.get("address2") or groups.get("address3")
    peer = address or "another task of the cluster"
    if groups.get("peer_task") and address:
        peer = f"{groups['peer_task']} at {address}"
    fields = {
        "task": evidence.task,
        "host": evidence.host,
        "output_dir": evidence.output_dir or "the output folder",
        "exit_code": "?" if evidence.exit_code is None else str(evidence.exit_code),
        "rss": size_text(evidence.oom.rss_bytes) if evidence.oom else "?",
        "at_rss": (
            f" at RSS {size_text(evidence.oom.rss_bytes)}"
            if evidence.oom and evidence.oom.rss_bytes
            else ""
        ),
        "at_step": f" at step {step}" if step else "",
        "limit": size_text(evidence.memory_limit) if evidence.memory_limit else "?",
        "limit_key": evidence.memory_key or "cluster.memory",
        "flags": flags.strip(),
        "peer": peer,
        "folder": _folder(groups, evidence.output_dir),
        "free_now": (
            f" ({bytes_text(evidence.free_bytes)} free now)"
            if evidence.free_bytes is not None
            else ""
        ),
    }
    if entry.user_frames_in:
        fields.update(_user_error(evidence.output))
    fields.update({k: v for k, v in groups.items() if v is not None and k not in fields})
    return fields


def _folder(groups: dict[str, str], output_dir: str) -> str:
    """The folder a message's path is in: the output folder when the path is inside it (a
    checkpoint's temporary file), else the path's own folder; the output folder without one."""
    path = groups.get("path") or groups.get("path2") or groups.get("path3")
    if not path:
        return output_dir or "the output folder"
    if output_dir and (path == output_dir or path.startswith(output_dir.rstrip("/") + "/")):
        return output_dir
    return posixpath.dirname(path) or path


_FRAME_AT = re.compile(r"(.*?:\d+)(?: in |: |$)")  # a frame's path:line


def _user_error(output: str) -> dict[str, str]:
    """``error``: the log's last error line (``error: `` taken off), with where it raised
    when the line does not say; ``where``: that frame's ``path:line``."""
    found = last_error(output)
    if found is None:
        return {}
    error = found.line.removeprefix("error: ").strip() or "an exception"
    at = _FRAME_AT.match(found.frames[-1]) if found.frames else None
    where = at[1] if at else ""
    if where and where not in error:
        error = f"{error} at {found.frames[-1]}"
    return {"error": error, "where": project_path(where) if where else "?"}


def _user_frames_shown(entry: KnownFailure, output: str) -> bool:
    found = last_error(output)
    return found is not None and found.form == entry.user_frames_in and bool(found.frames)


def explain(
    evidence: Evidence, catalogue: Sequence[KnownFailure] | None = None
) -> Explanation | None:
    """The first entry whose signature matches, with its cause and fix filled in; None when no
    entry knows this failure (the caller shows the last lines of the log instead). Entries
    marked ``catch_all`` are tried after all the others."""
    entries = CATALOGUE if catalogue is None else catalogue
    for entry in [*(e for e in entries if not e.catch_all), *(e for e in entries if e.catch_all)]:
        if entry.where != "run":
            continue
        if entry.exit_codes and evidence.exit_code not in entry.exit_codes:
            continue
        if not entry.exit_codes and evidence.exit_code == 0:
            continue
        if entry.needs_never_listened and not evidence.never_listened:
            continue
        if entry.needs_oom_record and evidence.oom is None:
            continue
        if entry.needs_memory_limit and not (
            evidence.memory_limit and evidence.oom is not None and evidence.oom.own_limit
        ):
            continue
        if entry.user_frames_in and not _user_frames_shown(entry, evidence.output):
            continue
        groups: dict[str, str] | None = {} if not entry.compiled else None
        for pattern in entry.compiled:
            matches = list(pattern.finditer(evidence.output))
            if matches:
                groups = {k: v for k, v in matches[-1].groupdict().items() if v is not None}
                break
        if groups is None:
            continue
        fields = _fields(entry, evidence, groups)
        unread = entry.free_space_of and evidence.free_bytes is None
        return Explanation(
            entry.id,
            _fill(entry.cause, fields),
            _fill(entry.fix, fields),
            _fill(entry.free_space_of, fields) if unread else None,
        )
    return None


def _fill(template: str, fields: dict[str, str]) -> str:
    return template.format_map(_Missing(fields))


class _Missing(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


_NOISE = re.compile(r"^\s*$")


def last_lines(output: str, count: int = 3) -> list[str]:
    """The last non-empty lines of a log (what an unrecognised failure shows)."""
    lines = [line.rstrip() for line in output.splitlines() if not _NOISE.match(line)]
    return lines[-count:]


# "error: ..." (the recipes' one line, and most command-line programs'), or the last line of a
# Python traceback ("KeyError: 'x'", "tensorflow.python.framework.errors_impl.NotFoundError: ...")
_ERROR_LINE = re.compile(r"^(error: |[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b:?)")


def error_line(output: str) -> str | None:
    """The line of a log that says what went wrong: the last ``error: ...`` line, else the last
    exception line of a traceback; never a traceback's frame (``  File "...", line N``) or the
    indented lines that follow the error. None when the log holds neither."""
    lines = [line.rstrip() for line in output.splitlines() if not _NOISE.match(line)]
    for line in reversed(lines):
        if line.startswith("error: "):
            return line
    for line in reversed(lines):
        if _ERROR_LINE.match(line):
            return line
    return None
