"""Run one experiment: apply its plan, supervise it to the end, and keep its folder's record.

``tfplan apply`` runs one; a sweep runs one per point (tfplan.sweeps), several at once::

    with ExperimentRun(plan, workspace, say, config_yaml) as run:  # lock, backend, resume check
        applied = run.apply()                                    # start the tasks
        outcome = run.supervise(emit, on_step)                   # until training is over
    run.result                                                   # the chief's result.json

Leaving the block (normally, on an error or on Ctrl-C) closes the record in
``<output_dir>/tfplan/`` (tfplan.engine.experiment): the outcome, the final state and every
task's log. :func:`supervise_state` does the supervising part for ``watch`` and for the
background supervisor of a detached apply.
"""

from __future__ import annotations

import json
import posixpath
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from tfplan.backends import open_backend
from tfplan.backends.api import Backend, OutputPlace
from tfplan.backends.transports.seeds import WarmSeed
from tfplan.engine.applier import ApplyResult, Progress, apply_plan
from tfplan.engine.background import HANDOVER_SECS, me, take_over_from_background
from tfplan.engine.experiment import (
    ExperimentFolder,
    check_resumable,
    checkpoint_step,
    index_output,
    keep_logs,
)
from tfplan.engine.logs import Emit
from tfplan.engine.plans import replan_from_state
from tfplan.engine.store import StateStore
from tfplan.engine.supervisor import Outcome, Supervisor
from tfplan.engine.workspace import Workspace
from tfplan.errors import ConfigError, PreflightError, TfplanError
from tfplan.files import read_json_object, write_atomic
from tfplan.planning.plan import Action, Plan
from tfplan.planning.state import State

__all__ = [
    "REFUSED_FILE",
    "ExperimentRun",
    "close_record",
    "fetch_outputs",
    "read_refusal",
    "read_result",
    "record_dir",
    "result_path",
    "supervise_state",
]

Say = Callable[[str], None]

# In the experiment's workspace folder (.tfplan/<id>/): why the last apply was refused before it
# began the experiment's record (a host that cannot be reached while apply looks for output_dir)
REFUSED_FILE = "refused.json"


def record_refusal(store: StateStore, reason: str) -> None:
    """Keep why an apply was refused before it began: no task ran and no record was begun, so
    only this tells ``tfplan explain``. Atomic; never raises (the refusal itself is the error)."""
    data = {"at": round(time.time(), 3), "reason": reason}
    try:
        write_atomic(store.folder / REFUSED_FILE, json.dumps(data, indent=2) + "\n")
    except OSError:
        pass


def read_refusal(folder: Path) -> tuple[float, str] | None:
    """(when, why) of the last refusal :func:`record_refusal` kept in an experiment's workspace
    folder; None when there is none."""
    data = read_json_object(folder / REFUSED_FILE) or {}
    at, reason = data.get("at"), data.get("reason")
    if not isinstance(at, (int, float)) or not isinstance(reason, str) or not reason:
        return None
    return float(at), reason


def result_path(output_dir: str) -> str:
    return posixpath.join(output_dir, "result.json")


def record_dir(plan: Plan, workspace: Workspace, place: OutputPlace | None = None) -> str:
    """Where the launcher keeps the experiment's record: its output_dir when this machine
    sees it (``place``, as the backend found it; without it, the backend's
    ``capabilities.shared_output``), else the workspace."""
    from tfplan.backends import backend_class

    if place is None:
        place = OutputPlace(
            launcher_sees=backend_class(plan.backend.name).capabilities.shared_output
        )
    if place.launcher_sees:
        return plan.output_dir
    return str(workspace.root / plan.experiment_id / "output")


def read_result(backend: Backend, output_dir: str, chief_host: str | None) -> dict[str, Any] | None:
    """The chief's ``result.json`` (None when there is none or it cannot be read)."""
    try:
        data = backend.read_file(result_path(output_dir), near=chief_host)
        result = json.loads((data or b"null").decode())
    except (TfplanError, ValueError):
        return None
    return result if isinstance(result, dict) else None


def supervise_state(
    store: StateStore,
    backend: Backend,
    state: State,
    emit: Emit,
    on_step: Callable[[int], None] | None = None,
    detached: bool = False,
    log_path: str | None = None,
    handover: threading.Event | None = None,
    interrupt: threading.Event | None = None,
) -> Outcome:
    """Supervise ``state``'s tasks to the end, recorded in the state as its supervisor; the
    caller holds the lock.

    Raises:
        HandedOver: ``handover`` was set; the tasks run on.
    """
    state = store.write(replace(state, supervisor=me(detached, log_path)), bump=False)
    try:
        supervisor = Supervisor(
            store,
            backend,
            emit,
            on_step=on_step,
            replan=replan_from_state,
            handover=handover,
            interrupt=interrupt,
        )
        return supervisor.run(state)
    finally:
        final = store.load()
        if final is not None and final.supervisor is not None:
            store.write(replace(final, supervisor=None), bump=False)


def fetch_outputs(backend: Backend, state: State, dest: Path, say: Say | None = None) -> int:
    """Copy the chief's outputs (result.json, eval/, summaries; not checkpoints) from its
    host's ``output_dir`` into ``dest``; how many files (0, with a warning, when its host
    could not be read)."""
    chief = next((t for t in state.tasks if t.is_chief), None)
    if chief is None:
        return 0
    try:
        return backend.fetch_outputs(state.output_dir, chief.planned_host, dest)
    except (TfplanError, OSError) as error:
        if say is not None:
            say(f"warning: could not copy the outputs from {chief.host}: {error}")
        return 0


def close_record(
    folder: ExperimentFolder,
    store: StateStore,
    backend: Backend,
    status: str,
    reason: str,
    last_step: int | None,
    save_logs: bool = True,
    say: Say | None = None,
) -> None:
    """Close the experiment's record: outcome, final state, each task's log, and (where this
    machine does not see output_dir: ``state.copy_back``) a copy of the chief's outputs."""
    state = store.load()
    if state is not None and save_logs and state.copy_back:
        copied = fetch_outputs(backend, state, folder.output_dir, say)
        if copied and say is not None:
            say(f"copied {copied} output file(s) from the chief's host to {folder.output_dir}")
    if state is not None and save_logs:
        keep_logs(state, backend, folder)
    folder.end(status, reason, last_step, json.dumps(state.to_dict(), indent=1) if state else None)


class ExperimentRun:
    """One apply of one experiment, under its workspace lock (see the module docstring)."""

    def __init__(
        self,
        plan: Plan,
        workspace: Workspace,
        say: Say,
        config_yaml: str | None = None,
        seeds: Sequence[WarmSeed] = (),
    ) -> None:
        self.plan = plan
        self.seeds = tuple(seeds)  # a sweep's warm seeds: tasks are forked from them
        self.workspace = workspace
        self.say = say
        self.config_yaml = config_yaml
        self.store = workspace.store(plan.experiment_id)
        self.record_dir = record_dir(plan, workspace)
        self.folder = ExperimentFolder(self.record_dir)
        self.place: OutputPlace | None = None  # where output_dir is (asked when tasks start)
        self.copy_back = False  # the chief's outputs are copied to record_dir at the end
        self.resumed_from: int | None = None
        self.applied: ApplyResult | None = None
        self.outcome: Outcome | None = None
        self.result: dict[str, Any] | None = None
        self.detached = False
        # (status, reason) the experiment's record gets when supervise() is stopped on purpose
        # through its interrupt (a sweep pruning the point), instead of "interrupted"
        self.stopped_because: tuple[str, str] | None = None
        self._began = False
        self._stack = ExitStack()
        self._backend: Backend | None = None

    @property
    def backend(self) -> Backend:
        assert self._backend is not None, "use ExperimentRun in a with block"
        return self._backend

    @property
    def chief_host(self) -> str | None:
        return next((t.host for t in self.plan.tasks if t.is_chief), None)

    def __enter__(self) -> ExperimentRun:
        take_over_from_background(self.store, self.say)
        # a background supervisor whose job ended by itself tears the job down under the lock,
        # and it has left the state already: it is waited for (seen: a resize applied just as
        # the job reached its last step), any other holder refused at once
        ending = self.store.lock_holder().startswith("tfplan watch")
        try:
            self._stack.enter_context(
                self.store.lock("apply", wait_secs=HANDOVER_SECS if ending else 0.0)
            )
            self._backend = self._stack.enter_context(
                open_backend(self.plan.backend, self.store.scratch)
            )
            if self.seeds:
                self._backend.use_seeds(self.seeds)
            self._locate_output()
            # a chief that keeps running (workers joining or leaving, a new max_steps) resumes
            # nothing: the job goes on where it is
            chief = next((t.name for t in self.plan.tasks if t.is_chief), None)
            starts = {
                c.task for c in self.plan.changes if c.action in (Action.CREATE, Action.REPLACE)
            }
            self.resumed_from = self._checkpoint_step() if chief in starts else None
            if self.resumed_from is not None:
                check_resumable(
                    self.folder, self.plan.experiment_id, self.plan.run_config, self.resumed_from
                )
            elif self.place is not None and self.place.per_host:
                self._refuse_moved_chief()
        except BaseException as error:
            if isinstance(error, PreflightError):
                record_refusal(self.store, str(error))
            self._stack.close()
            raise
        return self

    def _locate_output(self) -> None:
        """Ask the backend where output_dir is (when tasks start; otherwise keep what the
        last apply found), and say it; the record goes where this machine sees it."""
        starting = {
            c.task for c in self.plan.changes if c.action in (Action.CREATE, Action.REPLACE)
        }
        if not starting:
            state = self.store.load()
            if state is not None and state.record_dir:
                self.record_dir, self.copy_back = state.record_dir, state.copy_back
                self.folder = ExperimentFolder(self.record_dir)
            return
        tasks = [t for t in self.plan.tasks if t.name in starting]
        self.place = self.backend.locate_output(self.plan, tasks)
        self.record_dir = record_dir(self.plan, self.workspace, self.place)
        self.folder = ExperimentFolder(self.record_dir)
        self.copy_back = not self.place.launcher_sees and self.backend.capabilities.per_host_output
        if self.place.detail:
            copied = (
                f"; result.json, eval/ and the summaries are copied to {self.record_dir} when "
                "the run ends"
                if self.copy_back
                else ""
            )
            self.say(f"{self.place.detail}{copied}")

    def _refuse_moved_chief(self) -> None:
        """Per-host output keeps the checkpoints on the chief's host: refuse to start afresh
        on another host while the last apply's chief host still holds them.

        Raises:
            ConfigError: the last apply's chief ran on another host, which has a checkpoint.
        """
        saved = self.folder.saved_plan() or {}
        before = next((t.get("host") for t in saved.get("tasks", []) if t.get("is_chief")), None)
        if before == self.chief_host or before not in {h.name for h in self.plan.hosts}:
            return  # the same host, or one no longer listed (it cannot be read)
        try:
            data = self.backend.read_file(
                posixpath.join(self.plan.output_dir, "checkpoint"), near=str(before)
            )
        except TfplanError:
            return
        step = checkpoint_step(data.decode(errors="replace")) if data else None
        if step is not None:
            raise ConfigError(
                "cluster.hosts",
                f"experiment {self.plan.experiment_id!r} has checkpoints (step {step}) on "
                f"{before}, where its chief ran, but the chief is now planned on "
                f"{self.chief_host} and the hosts share no output folder",
                f"keep the chief on {before} (the same hosts in the same order), copy "
                f"{self.plan.output_dir} from {before} to {self.chief_host}, or use a new "
                "experiment.id",
            )

    def _checkpoint_step(self) -> int | None:
        if self.chief_host is None:
            return None
        try:
            data = self.backend.read_file(
                posixpath.join(self.plan.output_dir, "checkpoint"), near=self.chief_host
            )
        except TfplanError:
            return None  # an unreachable host is preflight's to report
        return checkpoint_step(data.decode(errors="replace")) if data else None

    def apply(self, progress: Progress | None = None) -> ApplyResult:
        """Record the start, then start the tasks (:func:`tfplan.engine.applier.apply_plan`;
        ``progress(started, total)`` as they start)."""
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
        index_output(self.workspace, plan.experiment_id, self.record_dir, "experiment")
        applied = apply_plan(plan, self.store, self.backend, self.say, progress)
        if (self.record_dir, self.copy_back) != (applied.state.record_dir, applied.state.copy_back):
            where = replace(applied.state, record_dir=self.record_dir, copy_back=self.copy_back)
            applied = replace(applied, state=self.store.write(where, bump=False))
        self.applied = applied
        return self.applied

    @property
    def result_at(self) -> str:
        """Where the chief's result.json is, as the user can find it."""
        if self.copy_back:
            return f"{result_path(self.record_dir)}, copied from {self.chief_host}"
        return result_path(self.plan.output_dir)

    def supervise(
        self,
        emit: Emit,
        on_step: Callable[[int], None] | None = None,
        interrupt: threading.Event | None = None,
    ) -> Outcome:
        """Stream logs and apply the lifecycle until every task has ended (``interrupt``: as
        Ctrl-C, from another thread)."""
        assert self.applied is not None, "apply() first"
        self.outcome = supervise_state(
            self.store, self.backend, self.applied.state, emit, on_step, interrupt=interrupt
        )
        self.result = read_result(self.backend, self.plan.output_dir, self.chief_host)
        return self.outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._began:
                status, reason = self._ending(exc)
                try:
                    close_record(
                        self.folder,
                        self.store,
                        self.backend,
                        status,
                        reason,
                        self.outcome.last_step if self.outcome is not None else None,
                        save_logs=not self.detached,
                        say=self.say,
                    )
                except Exception as error:  # noqa: BLE001 - never replace the apply's own outcome
                    self.say(f"warning: could not write the experiment record: {error}")
        finally:
            self._stack.close()

    def _ending(self, exc: BaseException | None) -> tuple[str, str]:
        if isinstance(exc, KeyboardInterrupt):
            if self.stopped_because is not None:
                return self.stopped_because
            return "interrupted", "interrupted: every task was stopped"
        if exc is not None:
            return "failed", str(exc) or type(exc).__name__
        if self.outcome is not None:
            return ("succeeded" if self.outcome.succeeded else "failed"), self.outcome.reason
        if self.detached:
            return "detached", "a background supervisor watches the tasks (tfplan status)"
        return "succeeded", "nothing left to run"


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return str(yaml.safe_dump(data, sort_keys=False))
