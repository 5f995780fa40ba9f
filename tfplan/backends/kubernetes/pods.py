"""Pods as the backend sees them: a task's state from its pod, and a followed pod log.

Pure functions over the official client's pod model (:func:`pod_info`), and :class:`PodLog`,
which waits for a pod to start, then reads its log follow stream until the pod ends.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tfplan.backends.api import LogStream, TaskInfo, TaskPhase
from tfplan.backends.kubernetes.options import CONTAINER
from tfplan.backends.logstream import ThreadLogStream

__all__ = ["PERMANENT_WAITING", "PodLog", "pod_info", "terminated", "waiting"]

POLL_SECS = 0.2
# Waiting reasons of a container that will never start: the task counts as failed (exit 127).
PERMANENT_WAITING = ("InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError")


class PodLog:
    """A followed pod log: waits for the pod to start, then reads the follow stream."""

    def __init__(self, name: str, open_follow: Callable[[], tuple[Any | None, bool]]) -> None:
        self.name = name
        self.open_follow = open_follow
        self.stopped = threading.Event()
        self.response: Any = None
        self.gone = False  # the Job is gone: its pod will never log

    def stream(self, on_line: Callable[[str], None]) -> LogStream:
        return ThreadLogStream(self.name, self.read_chunk, self.end, self.end, on_line)

    def read_chunk(self) -> bytes:
        while not self.stopped.is_set():
            if self.response is None:
                if not self._open():
                    if self.gone:
                        return b""
                    self.stopped.wait(POLL_SECS * 2)
                continue  # stopped while it opened: end() saw no response to shut down
            chunk: bytes = self.response.read1(65536)
            return chunk
        return b""

    def _open(self) -> bool:
        self.response, self.gone = self.open_follow()
        return self.response is not None

    def end(self) -> None:
        self.stopped.set()
        response = self.response
        if response is not None:
            try:
                response.shutdown()
                response.release_conn()
            except Exception:  # noqa: BLE001 - closing a finished stream may fail; nothing to do
                pass


def terminated(pod: Any, container: str) -> tuple[int | None, str]:
    """(exit code, reason) of a pod's container that ended."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if (
            status.name == container
            and status.state is not None
            and status.state.terminated is not None
        ):
            done = status.state.terminated
            return done.exit_code, done.reason or ""
    return None, (pod.status.reason or "") if pod.status else ""


def waiting(pod: Any) -> tuple[str, str]:
    for status in pod.status.container_statuses or []:
        if status.state is not None and status.state.waiting is not None:
            return status.state.waiting.reason or "", status.state.waiting.message or ""
    for condition in pod.status.conditions or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.reason or "Unschedulable", condition.message or ""
    return "", ""


def pod_info(pod: Any) -> TaskInfo:
    """A task's TaskInfo from its pod: phase, the container's exit code, node, why pending."""
    status = pod.status
    node = pod.spec.node_name if pod.spec else None
    phase = status.phase if status else None
    if phase == "Running":
        return TaskInfo(TaskPhase.RUNNING, host=node, detail=f"pod {pod.metadata.name} on {node}")
    if phase in ("Succeeded", "Failed"):
        code, reason = terminated(pod, CONTAINER)
        if phase == "Succeeded":
            return TaskInfo(
                TaskPhase.SUCCEEDED, exit_code=0 if code is None else code, host=node, detail=reason
            )
        return TaskInfo(
            TaskPhase.FAILED, exit_code=code, host=node, detail=reason or (status.message or "")
        )
    if phase == "Pending" and status is not None:
        reason, message = waiting(pod)
        detail = f"{reason}: {message}" if message else reason
        if reason in PERMANENT_WAITING:  # it will never start: the program "was not found"
            return TaskInfo(TaskPhase.FAILED, exit_code=127, host=node, detail=detail)
        return TaskInfo(TaskPhase.PENDING, host=node, detail=detail or "Pending")
    return TaskInfo(
        TaskPhase.UNREACHABLE,
        host=node,
        error=f"pod {pod.metadata.name} is {phase} (its node does not report)",
    )
