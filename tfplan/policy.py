"""Pure: restart decisions, the way Kubernetes' TFJob defines its restart policies.

- ``Never``: a task that ends stays ended.
- ``OnFailure``: restarted when it fails (non-zero exit, killed, vanished).
- ``Always``: restarted whenever it ends while training goes on.
- ``ExitCode``: exit codes 1-127 are permanent (the program itself gave up: bad config, bad
  data, NaN loss), 128-255 are retried (killed by a signal: 128 + signal number, e.g. 137 for
  SIGKILL or the OOM killer). A task whose exit code is unknown (its whole process group was
  killed) counts as killed.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RestartDecision", "decide_restart", "backoff_delay", "KILLED"]

KILLED = 137  # what a vanished task is taken to have exited with (128 + SIGKILL)


@dataclass(frozen=True)
class RestartDecision:
    restart: bool
    reason: str


def decide_restart(
    policy: str, exit_code: int | None, restarts: int, backoff_limit: int
) -> RestartDecision:
    """Whether a task that just ended with ``exit_code`` is started again.

    Args:
        policy: Never | OnFailure | Always | ExitCode.
        exit_code: the task's exit status; None when unknown (counts as killed).
        restarts: how often the task was restarted already.
        backoff_limit: the most restarts allowed per task.
    """
    code = KILLED if exit_code is None else exit_code
    if policy == "Never":
        return RestartDecision(False, "restart policy Never")
    if policy == "OnFailure" and code == 0:
        return RestartDecision(False, "it succeeded")
    if policy == "ExitCode":
        if code == 0:
            return RestartDecision(False, "it succeeded")
        if 1 <= code <= 127:
            return RestartDecision(False, f"exit code {code} is permanent under policy ExitCode")
    if restarts >= backoff_limit:
        return RestartDecision(False, f"it was restarted {restarts} time(s), the backoff limit")
    return RestartDecision(True, f"policy {policy}, restart {restarts + 1} of {backoff_limit}")


def backoff_delay(backoff_secs: float, restarts: int) -> float:
    """Seconds to wait before restart number ``restarts + 1``: doubling, capped at one minute."""
    return float(min(60.0, backoff_secs * (2**restarts)))
