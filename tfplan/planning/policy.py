"""Pure: the lifecycle policy of a job, and restart decisions the way Kubernetes' TFJob makes them.

Restart policies:

- ``Never``: a task that ends stays ended.
- ``OnFailure``: restarted when it fails (non-zero exit, killed, vanished).
- ``Always``: restarted whenever it ends while training goes on.
- ``ExitCode``: exit codes 1-127 are permanent (the program itself gave up: bad config, bad
  data, NaN loss), 128-255 are retried (killed by a signal: 128 + signal number, e.g. 137 for
  SIGKILL or the OOM killer). A task whose exit code is unknown (its whole process group was
  killed) counts as killed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

__all__ = [
    "KILLED",
    "ChiefFailure",
    "HostFailure",
    "JobPolicy",
    "RestartDecision",
    "RestartPolicy",
    "TaskPolicy",
    "backoff_delay",
    "decide_restart",
]

KILLED = 137  # what a vanished task is taken to have exited with (128 + SIGKILL)


class RestartPolicy(str, Enum):
    NEVER = "Never"
    ON_FAILURE = "OnFailure"
    ALWAYS = "Always"
    EXIT_CODE = "ExitCode"


class ChiefFailure(str, Enum):
    TEARDOWN = "teardown"  # stop every task once the chief cannot be restarted
    KEEP = "keep"  # leave the others running


class HostFailure(str, Enum):
    REPLACE = "replace"  # re-plan the lost host's tasks onto the others
    FAIL = "fail"


@dataclass(frozen=True)
class TaskPolicy:
    """How one role's tasks are restarted and when they count as hung."""

    restart: RestartPolicy = RestartPolicy.EXIT_CODE
    backoff_limit: int = 3  # restarts per task, at most
    backoff_secs: float = 1.0  # before the first restart; doubles with each
    progress_timeout_secs: float | None = None  # no log line for this long: hung

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["restart"] = self.restart.value
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskPolicy:
        timeout = data.get("progress_timeout_secs")
        return cls(
            restart=RestartPolicy(data["restart"]),
            backoff_limit=int(data["backoff_limit"]),
            backoff_secs=float(data["backoff_secs"]),
            progress_timeout_secs=None if timeout is None else float(timeout),
        )


@dataclass(frozen=True)
class JobPolicy:
    """What the supervisor does when tasks end, hang or fail (tfplan's side, not the task's).

    Changing it restarts nothing: apply updates the running job in place.
    """

    on_chief_failure: ChiefFailure = ChiefFailure.TEARDOWN
    ps_grace_secs: float = 5.0  # after the chief succeeds, a ps gets this long to exit itself
    evaluator_grace_secs: float = 120.0  # ... and the evaluator this long to score the last step
    stop_grace_secs: float = 5.0  # SIGTERM (or the scheduler's cancel), then kill after this long
    deadline_secs: float | None = None  # the whole job; then everything is stopped
    host_timeout_secs: float = 20.0  # a host unreachable this long has lost its tasks
    on_host_failure: HostFailure = HostFailure.REPLACE
    roles: dict[str, TaskPolicy] = field(default_factory=dict)  # role name -> its policy
    # A collective (all-reduce) job: every worker holds a part of each step, so when one worker
    # must restart, the whole group restarts together from the last checkpoint.
    restart_together: bool = False
    # Exit codes below 128 that mean "restart me" under ExitCode (the program's own signal
    # that its group lost a member, e.g. 5 from the built-in TF2 strategies).
    retry_exit_codes: tuple[int, ...] = ()
    # Keep a warm standby per parameter server (TensorFlow already imported, waiting for its
    # go signal), so that a restarted ps does not pay the import; where the backend can.
    ps_standby: bool = False

    def for_role(self, role: str) -> TaskPolicy:
        return self.roles.get(role, TaskPolicy())

    def grace_after_chief(self, role: str) -> float:
        """How long after the chief's success a task of ``role`` may take to exit by itself."""
        return self.evaluator_grace_secs if role == "evaluator" else self.ps_grace_secs

    def to_dict(self) -> dict[str, Any]:
        return {
            "on_chief_failure": self.on_chief_failure.value,
            "ps_grace_secs": self.ps_grace_secs,
            "evaluator_grace_secs": self.evaluator_grace_secs,
            "stop_grace_secs": self.stop_grace_secs,
            "deadline_secs": self.deadline_secs,
            "host_timeout_secs": self.host_timeout_secs,
            "on_host_failure": self.on_host_failure.value,
            "roles": {role: p.to_dict() for role, p in sorted(self.roles.items())},
            "restart_together": self.restart_together,
            "retry_exit_codes": list(self.retry_exit_codes),
            "ps_standby": self.ps_standby,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobPolicy:
        deadline = data.get("deadline_secs")
        return cls(
            on_chief_failure=ChiefFailure(data["on_chief_failure"]),
            ps_grace_secs=float(data["ps_grace_secs"]),
            evaluator_grace_secs=float(data["evaluator_grace_secs"]),
            stop_grace_secs=float(data["stop_grace_secs"]),
            deadline_secs=None if deadline is None else float(deadline),
            host_timeout_secs=float(data["host_timeout_secs"]),
            on_host_failure=HostFailure(data["on_host_failure"]),
            roles={r: TaskPolicy.from_dict(p) for r, p in dict(data.get("roles", {})).items()},
            restart_together=bool(data.get("restart_together", False)),
            retry_exit_codes=tuple(int(c) for c in data.get("retry_exit_codes", ())),
            ps_standby=bool(data.get("ps_standby", False)),
        )

    def changes_from(self, old: JobPolicy, role: str) -> list[str]:
        """``key: old -> new`` for each setting that differs for a task of ``role``."""
        before = {**_flat(old), **_flat_role(old.for_role(role))}
        after = {**_flat(self), **_flat_role(self.for_role(role))}
        return [
            f"{key}: {before.get(key)} -> {after.get(key)}"
            for key in sorted({*before, *after})
            if before.get(key) != after.get(key)
        ]


def _flat(policy: JobPolicy) -> dict[str, Any]:
    data = policy.to_dict()
    data.pop("roles")
    return data


def _flat_role(policy: TaskPolicy) -> dict[str, Any]:
    return {("restart_policy" if k == "restart" else k): v for k, v in policy.to_dict().items()}


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    reason: str


def decide_restart(
    policy: RestartPolicy | str,
    exit_code: int | None,
    restarts: int,
    backoff_limit: int,
    retry_exit_codes: tuple[int, ...] = (),
) -> RestartDecision:
    """Whether a task that just ended with ``exit_code`` is started again.

    Args:
        policy: Never | OnFailure | Always | ExitCode.
        exit_code: the task's exit status; None when unknown (counts as killed).
        restarts: how often the task was restarted already.
        backoff_limit: the most restarts allowed per task.
        retry_exit_codes: codes below 128 that ExitCode retries all the same (the program
            asks to be restarted, e.g. its all-reduce group lost a member).
    """
    policy = RestartPolicy(policy)
    code = KILLED if exit_code is None else exit_code
    if policy is RestartPolicy.NEVER:
        return RestartDecision(False, "restart policy Never")
    if policy is RestartPolicy.ON_FAILURE and code == 0:
        return RestartDecision(False, "it succeeded")
    if policy is RestartPolicy.EXIT_CODE:
        if code == 0:
            return RestartDecision(False, "it succeeded")
        if 1 <= code <= 127 and code not in retry_exit_codes:
            return RestartDecision(False, f"exit code {code} is permanent under policy ExitCode")
    if restarts >= backoff_limit:
        return RestartDecision(False, f"it was restarted {restarts} time(s), the backoff limit")
    return RestartDecision(
        True, f"policy {policy.value}, restart {restarts + 1} of {backoff_limit}"
    )


def backoff_delay(backoff_secs: float, restarts: int) -> float:
    """Seconds to wait before restart number ``restarts + 1``: doubling, capped at one minute."""
    return float(min(60.0, backoff_secs * (2**restarts)))
