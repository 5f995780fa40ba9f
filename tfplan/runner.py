"""Run one experiment: apply its plan, supervise it to the end, and keep its folder's record.

``tfplan apply`` runs one; a sweep runs one per point (tfplan.sweep), several at once::

    with ExperimentRun(plan, workspace, say, config_yaml) as run:  # lock, hosts, resume check
        applied = run.apply()                                    # start the tasks
        outcome = run.supervise(emit, on_step)                   # until training is over
    run.result                                                   # the chief's result.json

Leaving the block (normally, on an error or on Ctrl-C) closes the record in
``<output_dir>/tfplan/`` (tfplan.experiment): the outcome, the final state and every task's log.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from typing import Any

from tfplan.applier import ApplyResult, apply_plan
from tfplan.errors import TfplanError
from tfplan.experiment import ExperimentFolder, check_resumable, checkpoint_step, index_output
from tfplan.hosts import HostPool
from tfplan.plan import Plan, Task
from tfplan.supervisor import Emit, Outcome, Supervisor, result_path
from tfplan.workspace import Workspace

__all__ = ["ExperimentRun", "read_result"]

Say = Callable[[str], None]


def read_result(pool: HostPool, plan: Plan) -> dict[str, Any] | None:
    """The chief's ``result.json`` (None when there is none or it cannot be read)."""
    chief = _chief(plan)
    if chief is None:
        return None
    try:
        data, _ = pool[chief.host].read_log(result_path(plan.output_dir), 0)
        result = json.loads(data.decode() or "null")
    except (TfplanError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def _chief(plan: Plan) -> Task | None:
    return next((t for t in plan.tasks if t.is_chief), None)


class ExperimentRun:
    """One apply of one experiment, under its workspace lock (see the module docstring)."""

    def __init__(
        self, plan: Plan, workspace: Workspace, say: Say, config_yaml: str | None = None
    ) -> None:
        self.plan = plan
        self.workspace = workspace
        self.say = say
        self.config_yaml = config_yaml
        self.store = workspace.store(plan.experiment_id)
        self.folder = ExperimentFolder(plan.output_dir)
        self.resumed_from: int | None = None
        self.applied: ApplyResult | None = None
        self.outcome: Outcome | None = None
        self.result: dict[str, Any] | None = None
        self.detached = False
        self._began = False
        self._stack = ExitStack()
        self._pool: HostPool | None = None

    @property
    def pool(self) -> HostPool:
        assert self._pool is not None, "use ExperimentRun in a with block"
        return self._pool

    def __enter__(self) -> ExperimentRun:
        try:
            self._stack.enter_context(self.store.lock("apply"))
            self._pool = self._stack.enter_context(HostPool(self.plan.hosts))
            self.resumed_from = self._checkpoint_step()
            if self.resumed_from is not None:
                check_resumable(
                    self.folder, self.plan.experiment_id, self.plan.run_config, self.resumed_from
                )
        except BaseException:
            self._stack.close()
            raise
        return self

    def _checkpoint_step(self) -> int | None:
        chief = _chief(self.plan)
        if chief is None:
            return None
        try:
            data, _ = self.pool[chief.host].read_log(
                posixpath.join(self.plan.output_dir, "checkpoint"), 0
            )
        except TfplanError:
            return None  # an unreachable host is preflight's to report
        return checkpoint_step(data.decode(errors="replace"))

    def apply(self) -> ApplyResult:
        """Record the start, then start the tasks (tfplan.applier.apply_plan)."""
        plan = self.plan
        if self.resumed_from is not None:
            max_steps = plan.run_config.get("trainer", {}).get("max_steps")
            note = ""
            if isinstance(max_steps, int) and self.resumed_from >= max_steps:
                note = (
                    f"; it is already at trainer.max_steps={max_steps}, so there is nothing "
                    "left to train: raise trainer.max_steps to go on"
                )
            self.say(
                f"resuming experiment {plan.experiment_id} from its checkpoint at "
                f"step {self.resumed_from} in {plan.output_dir}{note}"
            )
        config_yaml = self.config_yaml or _yaml(plan.run_config)
        self.folder.begin(plan.experiment_id, plan.to_json(), config_yaml, self.resumed_from)
        self._began = True
        index_output(self.workspace, plan.experiment_id, plan.output_dir, "experiment")
        self.applied = apply_plan(plan, self.store, self.pool, self.say)
        return self.applied

    def supervise(self, emit: Emit, on_step: Callable[[int], None] | None = None) -> Outcome:
        """Stream logs and apply the lifecycle until every task has ended."""
        assert self.applied is not None, "apply() first"
        supervisor = Supervisor(self.store, self.pool, emit, on_step=on_step)
        self.outcome = supervisor.run(self.applied.state)
        self.result = read_result(self.pool, self.plan)
        return self.outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._began:
                self._close_record(exc)
        finally:
            self._stack.close()

    def _close_record(self, exc: BaseException | None) -> None:
        if isinstance(exc, KeyboardInterrupt):
            status, reason = "interrupted", "interrupted: every task was stopped"
        elif exc is not None:
            status, reason = "failed", str(exc) or type(exc).__name__
        elif self.outcome is not None:
            status = "succeeded" if self.outcome.succeeded else "failed"
            reason = self.outcome.reason
        elif self.detached:
            status, reason = "detached", "the tasks run on (tfplan status / logs / destroy)"
        else:
            status, reason = "succeeded", "nothing left to run"
        state = self.store.load()
        if state is not None and not self.detached:
            for task in state.tasks:
                try:
                    data, _ = self.pool[task.host].read_log(task.log_path, 0)
                except TfplanError:
                    continue
                self.folder.save_log(task.name, data)
        last_step = self.outcome.last_step if self.outcome is not None else None
        self.folder.end(
            status,
            reason,
            last_step,
            json.dumps(state.to_dict(), indent=2) if state is not None else None,
        )


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False))
