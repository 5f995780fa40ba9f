"""A memory cgroup for a test's process: the kernel's own limit, as a scheduler or a user sets it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CGROUP_V1 = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")


@contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path]:
    """A memory cgroup of ``limit_bytes`` (v1 where its memory controller is mounted, else
    v2); yields the file a process writes its PID to, to enter it."""
    name = f"tfplan-test-{os.getpid()}"
    if CGROUP_V1.is_dir():
        group = CGROUP_V1 / name
        group.mkdir()
        limit = group / "memory.limit_in_bytes"
    else:
        root = CGROUP_V2
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            pytest.fail("no cgroup memory controller (v1 or v2) on this machine")
        (root / "cgroup.subtree_control").write_text("+memory")
        group = root / name
        group.mkdir()
        limit = group / "memory.max"
        (group / "memory.swap.max").write_text("0")
    try:
        limit.write_text(str(limit_bytes))
        yield group / "cgroup.procs"
    finally:
        group.rmdir()
