"""Pure: the TF_CONFIG of one task, in TensorFlow's standard JSON form."""

from __future__ import annotations

import json

__all__ = ["tf_config_json"]


def tf_config_json(cluster_spec: dict[str, list[str]], task_type: str, task_index: int) -> str:
    """The TF_CONFIG JSON for one task, with keys sorted so equal inputs give equal strings.

    Args:
        cluster_spec: job name -> ["host:port", ...]; the evaluator is never part of it.
        task_type: "ps", "chief", "worker" or "evaluator".
        task_index: the task's index within its job.

    Returns:
        ``{"cluster": {...}, "task": {"type": ..., "index": ...}}`` as compact JSON.
    """
    payload = {
        "cluster": {job: list(addresses) for job, addresses in cluster_spec.items() if addresses},
        "task": {"type": task_type, "index": task_index},
    }
    return json.dumps(payload, sort_keys=True, separators=(",", ":"))
