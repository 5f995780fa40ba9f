"""One listed host's shell, for what is not a task: a POSIX script's output (the firewall's
scripts, the listening sockets) and the free space of a folder's disk."""

from __future__ import annotations

import os
import shutil

from tfplan.backends.transports.pool import TransportPool
from tfplan.backends.transports.scripts import q
from tfplan.errors import BackendError

__all__ = ["free_bytes", "run_on_host"]


def run_on_host(pool: TransportPool, host: str, script: str, what: str) -> str:
    """Run a POSIX sh script on one host; its stdout. Raises BackendError on failure."""
    return pool[host].run_script(script, what).stdout.decode(errors="replace")


def free_bytes(pool: TransportPool, host: str, folder: str) -> int | None:
    """This machine's free space for a local host, ``df`` over SSH for another; None for a
    host not listed, or where it cannot be read."""
    if host not in pool.targets:
        return None
    if pool.targets[host].kind == "local":
        path = folder
        while path and not os.path.exists(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)  # a folder removed since: its disk is its parent's
        try:
            return shutil.disk_usage(path).free
        except OSError:
            return None
    try:
        out = run_on_host(pool, host, f"df -Pk {q(folder)} | tail -n 1", "df")
        return int(out.split()[3]) * 1024
    except (BackendError, ValueError, IndexError):
        return None
