"""What the planner needs from the world, gathered by the caller (plain data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfplan.planning.plan import UserCode

__all__ = ["PlanContext"]


@dataclass(frozen=True)
class PlanContext:
    cwd: str  # relative output_dir / workdir are taken from here
    local_python: str  # the interpreter for local hosts that name none
    tf_version: str  # the TensorFlow version the hosts must run
    # the user's packages the config names (tfplan.engine.user_code finds them on disk)
    user_code: tuple[UserCode, ...] = ()

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PlanContext:
        """From ``dataclasses.asdict`` of one (a plan's ``source_config``)."""
        code = tuple(
            c if isinstance(c, UserCode) else UserCode.from_dict(c)
            for c in data.get("user_code") or ()
        )
        return cls(**{**data, "user_code": code})
