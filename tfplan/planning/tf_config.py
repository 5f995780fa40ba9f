"""Pure: the TF_CONFIG of a task, in TensorFlow's standard JSON form.

Every TF_CONFIG lists the whole cluster, so encoding it afresh for every task makes anything
that touches all tasks quadratic (9,000 tasks: minutes, gigabytes). :class:`ClusterSpecText`
encodes the cluster part once and splices in each task's small ``task`` part.
"""

from __future__ import annotations

import hashlib
import json
import re

__all__ = ["ENV_VALUE_LIMIT", "MAX_ARG_STRLEN", "ClusterSpecText", "is_python", "tf_config_json"]

# Linux refuses an execve when one argument or one "NAME=value" environment string, with its
# terminating NUL, exceeds MAX_ARG_STRLEN (32 pages, 128 KiB), whatever ARG_MAX is.
MAX_ARG_STRLEN = 128 * 1024
# The longest TF_CONFIG that can be passed in the environment of a new program.
ENV_VALUE_LIMIT = MAX_ARG_STRLEN - len("TF_CONFIG=") - 1

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")


def is_python(program: str) -> bool:
    """Whether a command's first word names a Python interpreter (``python3``,
    ``/usr/bin/python3.11``, ``.venv/bin/python``): its TF_CONFIG can then be set inside it."""
    return bool(_PYTHON.match(program.rsplit("/", 1)[-1]))


def tf_config_json(cluster_spec: dict[str, list[str]], task_type: str, task_index: int) -> str:
    """The TF_CONFIG JSON for one task, with keys sorted so equal inputs give equal strings.

    Args:
        cluster_spec: job name -> ["host:port", ...]; the evaluator is never part of it.
        task_type: "ps", "chief", "worker" or "evaluator".
        task_index: the task's index within its job.

    Returns:
        ``{"cluster": {...}, "task": {"type": ..., "index": ...}}`` as compact JSON.
    """
    return ClusterSpecText(cluster_spec).tf_config(task_type, task_index)


class ClusterSpecText:
    """A cluster spec encoded once; each task's TF_CONFIG is that text plus its own part."""

    def __init__(self, cluster_spec: dict[str, list[str]]) -> None:
        cluster = {job: list(addresses) for job, addresses in cluster_spec.items() if addresses}
        self.cluster_json = json.dumps(cluster, sort_keys=True, separators=(",", ":"))
        self.digest = hashlib.sha256(self.cluster_json.encode()).hexdigest()[:16]

    def tf_config(self, task_type: str, task_index: int) -> str:
        # Keys sorted: "cluster" < "task"; the task part's keys: "index" < "type".
        return f'{{"cluster":{self.cluster_json},"task":{_task_part(task_type, task_index)}}}'

    def size(self, task_type: str, task_index: int) -> int:
        """Bytes of that task's TF_CONFIG, without building it."""
        return len(self.cluster_json) + len(_task_part(task_type, task_index)) + 20


def _task_part(task_type: str, task_index: int) -> str:
    return json.dumps({"index": task_index, "type": task_type}, separators=(",", ":"))
