"""Executors: how ``apply`` starts, stops and observes tasks on hosts (local or SSH).

``executor_for(target)`` picks the backend from a name -> module registry; the SSH backend
(and so paramiko/fabric) is imported only when a host needs it.
"""

from __future__ import annotations

import importlib

from tfplan.errors import ExecutorError
from tfplan.executors.base import Executor
from tfplan.executors.group import HostResults, run_on_hosts
from tfplan.executors.preflight import (
    PreflightRequest,
    PreflightResult,
    check_shared_dir,
    raise_for_preflight,
)
from tfplan.executors.specs import (
    CommandResult,
    HostTarget,
    Launched,
    LaunchSpec,
    LogStream,
    ProcessInfo,
    StopResult,
)

__all__ = [
    "EXECUTORS",
    "CommandResult",
    "Executor",
    "HostResults",
    "HostTarget",
    "LaunchSpec",
    "Launched",
    "LogStream",
    "PreflightRequest",
    "PreflightResult",
    "ProcessInfo",
    "StopResult",
    "check_shared_dir",
    "executor_for",
    "raise_for_preflight",
    "run_on_hosts",
]

# kind -> "module:class", imported on first use
EXECUTORS: dict[str, str] = {
    "local": "tfplan.executors.local:LocalExecutor",
    "ssh": "tfplan.executors.ssh:SSHExecutor",
}


def executor_for(target: HostTarget) -> Executor:
    """The executor for one host (not yet connected: SSH connects on first use).

    Args:
        target: how to reach the host; ``kind="auto"`` is local for a loopback address
            without an ``ssh_port``, SSH otherwise.

    Returns:
        A new executor; close it when done.

    Raises:
        ExecutorError: the kind is not one of the registered ones.
    """
    kind = target.resolved_kind()
    if kind not in EXECUTORS:
        raise ExecutorError(
            f"host {target.name}: unknown executor {kind!r}; available: auto, "
            + ", ".join(sorted(EXECUTORS))
        )
    module_name, class_name = EXECUTORS[kind].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    executor: Executor = cls(target)
    return executor
