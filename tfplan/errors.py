"""One exception tree. Every message is one line that says what went wrong and what to do next.

    TfplanError                  anything tfplan knows how to explain
    ├── ConfigError              a config value is wrong (names the key and the fix)
    ├── PlanError                the config cannot be placed / validated against the topology
    ├── PlanFileError            a plan file is missing, unreadable or of another format
    ├── StateError
    │   ├── StaleStateError      a saved plan no longer matches the state
    │   └── StateLockedError     another apply/destroy holds the workspace
    ├── BackendError             a host or scheduler could not do what was asked (start, stop, ...)
    │   └── PreflightError       checks before starting failed; carries per-host results
    ├── ApplyError               apply failed part-way; what was started has been stopped
    └── DataError                a data file is missing or malformed (names the path)

The CLI prints ``error: <message>`` and exits 1; ``TFPLAN_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "ApplyError",
    "ConfigError",
    "DataError",
    "BackendError",
    "PlanError",
    "PlanFileError",
    "PreflightError",
    "StaleStateError",
    "StateError",
    "StateLockedError",
    "TfplanError",
]


class TfplanError(Exception):
    """Base of every error tfplan explains to its user."""


class ConfigError(TfplanError):
    """A config value is wrong; the message names the key and the fix."""

    def __init__(self, key: str, problem: str, fix: str) -> None:
        self.key = key
        super().__init__(f"{key}: {problem}; {fix}")


class PlanError(TfplanError):
    """The config cannot be placed on the cluster or does not fit the algorithm."""


class PlanFileError(TfplanError):
    pass


class StateError(TfplanError):
    pass


class StaleStateError(StateError):
    pass


class StateLockedError(StateError):
    pass


class BackendError(TfplanError):
    """A host, a scheduler or an API could not do what was asked; the message names it."""


class PreflightError(BackendError):
    """Preflight failed on one or more hosts; ``failures`` maps host name to the reason."""

    def __init__(self, failures: Mapping[str, str]) -> None:
        self.failures = dict(failures)
        detail = "; ".join(f"{host}: {why}" for host, why in sorted(self.failures.items()))
        super().__init__(f"preflight failed on {len(self.failures)} host(s): {detail}")


class ApplyError(TfplanError):
    pass


class DataError(TfplanError):
    pass
