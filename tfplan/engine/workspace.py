"""The launcher-side workspace folder: saved plans and one state per experiment.

.tfplan/
  plan.json              the plan `tfplan plan` saved last (what a bare `tfplan apply` applies)
  <experiment id>/
    state.json           what is running for that experiment (tfplan.planning.state)
    state.lock
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tfplan.engine.store import StateStore
from tfplan.errors import PlanFileError, StateError
from tfplan.files import write_atomic
from tfplan.planning.plan import PLAN_FORMAT_VERSION, Plan

__all__ = ["Workspace"]

DEFAULT_WORKSPACE = ".tfplan"


class Workspace:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root or os.environ.get("TFPLAN_WORKSPACE") or DEFAULT_WORKSPACE).absolute()

    @property
    def default_plan_path(self) -> Path:
        return self.root / "plan.json"

    def store(self, experiment_id: str) -> StateStore:
        return StateStore(self.root / experiment_id)

    def experiments(self) -> list[str]:
        """Experiments that have a state file here, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.parent.name for p in self.root.glob("*/state.json"))

    def resolve_experiment(self, given: str | None) -> str:
        """The experiment a status/logs/destroy command means.

        Raises:
            StateError: none was given and the workspace holds none, or several.
        """
        if given:
            return given
        known = self.experiments()
        if len(known) == 1:
            return known[0]
        if not known:
            raise StateError(
                f"no experiment has been applied in {self.root}: run `tfplan apply` first"
            )
        raise StateError(
            f"the workspace holds several experiments ({', '.join(known)}): pick one with -e ID"
        )

    def save_plan(self, plan: Plan, path: Path | None = None) -> Path:
        """Write the plan file atomically; return its path."""
        target = Path(path) if path else self.default_plan_path
        write_atomic(target, plan.to_json(indent=None))
        return target

    def load_plan(self, path: Path | None = None) -> Plan:
        """Read a plan file.

        Raises:
            PlanFileError: missing, not JSON, or written by another plan format version.
        """
        target = Path(path) if path else self.default_plan_path
        try:
            data = json.loads(target.read_text())
        except FileNotFoundError:
            raise PlanFileError(
                f"no plan file at {target}: run `tfplan plan` first (or give a plan file)"
            ) from None
        except (OSError, ValueError) as error:
            raise PlanFileError(f"cannot read plan file {target}: {error}") from None
        if not isinstance(data, dict) or data.get("format_version") != PLAN_FORMAT_VERSION:
            version = data.get("format_version") if isinstance(data, dict) else None
            raise PlanFileError(
                f"{target} is not a tfplan plan file of format {PLAN_FORMAT_VERSION} "
                f"(found {version!r}): run `tfplan plan` again"
            )
        try:
            return Plan.from_dict(data)
        except (KeyError, TypeError, ValueError) as error:
            raise PlanFileError(
                f"plan file {target} is damaged ({error}): run `tfplan plan` again"
            ) from None
