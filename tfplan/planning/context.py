"""What the planner needs from the world, gathered by the caller (plain data)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PlanContext"]


@dataclass(frozen=True)
class PlanContext:
    cwd: str  # relative output_dir / workdir are taken from here
    local_python: str  # the interpreter for local hosts that name none
    tf_version: str  # the TensorFlow version the hosts must run
