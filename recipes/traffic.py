"""What one training step moves between a worker and the parameter servers, measured by
TensorFlow itself (``trainer.trace_step=N``).

The N-th step a TF1 replica runs is run with ``RunOptions(trace_level=FULL_TRACE)``; the step
statistics then list every tensor each device received (``_Recv`` nodes and the bytes their
outputs allocated). What the worker's devices received came from the ps; what the ps devices
received came from the workers. One line says both, so a user (and tests/test_user_model_apply.py)
can check that an embedding table moves only the batch's rows.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = ["received_bytes", "traced_options", "traffic_line"]


def traced_options(options: Any) -> Any:
    """``options`` (RunOptions or None) with a full trace asked for."""
    traced = tf.compat.v1.RunOptions()
    if options is not None:
        traced.CopyFrom(options)
    traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
    return traced


def received_bytes(metadata: Any, job: str) -> int:
    """The bytes the devices of ``job`` (``worker``, ``ps``) received in one traced run."""
    return sum(
        out.tensor_description.allocation_description.requested_bytes
        for dev in metadata.step_stats.dev_stats
        if f"/job:{job}/" in dev.device
        for node in dev.node_stats
        if "Recv" in node.node_name
        for out in node.output
    )


def traffic_line(name: str, run: int, metadata: Any) -> str:
    """The log line of one traced run of task ``name``."""
    return (
        f"{name}: traffic of its step {run} (TensorFlow's step statistics): received "
        f"{received_bytes(metadata, 'worker'):,} B from the ps, sent "
        f"{received_bytes(metadata, 'ps'):,} B to them"
    )
