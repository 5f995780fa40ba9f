"""The one tree of the recipes' errors, and the exit code each one means (docs/contract.md).

Every error a task can explain is a :class:`RecipeError`; its ``code`` is the task's exit status,
following tfplan's own: **2** the config or the data is wrong (fix it, then apply again),
**1** a failure at run time (a bug in the user's own code included: :class:`UserCodeError` keeps
its traceback), and the training failures the launcher acts on (3 NaN loss, 4 a peer that stopped
answering, 5 a group that lost a member). ``recipes/train.py`` turns any of them into one line on
stderr and that exit code; anything else is a bug of the recipes (exit 1, traceback).

Stdlib only: the planner imports these too (plan-time checks raise them).

    RecipeError (1)
    +-- ConfigError (2)            run.yaml or TF_CONFIG is missing or malformed
    |   +-- TargetError (2)        a dotted ``pkg.module.function`` that cannot be found
    |   +-- DataError (2)          a data set cannot be loaded (a missing file)
    |   |   +-- InputError (2)     the data cannot be read as configured
    |   +-- ModelError (2)         the user's model cannot be built or used as configured
    |   +-- ObjectiveError (2)     the loss does not fit the model's outputs or the labels
    |   +-- CheckpointMissing (2)  a checkpoint's file is not on the host that reads it
    +-- UserCodeError (1)          the user's own code raised (traceback kept)
    +-- TrainingFailed (code)      NaN loss (3), a peer timeout (4), a lost group member (5)
        +-- PeerUnreachable (4)    a peer never answered at the start
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType
from typing import Optional

__all__ = [
    "EXIT_BAD_CONFIG",
    "EXIT_FAILED",
    "EXIT_GROUP_LOST",
    "EXIT_NAN_LOSS",
    "EXIT_PEER_TIMEOUT",
    "CheckpointMissing",
    "ConfigError",
    "DataError",
    "InputError",
    "ModelError",
    "ObjectiveError",
    "PeerUnreachable",
    "RecipeError",
    "TargetError",
    "TrainingFailed",
    "UserCodeError",
    "report_failure",
    "user_frames",
]

EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_NAN_LOSS = 3
EXIT_PEER_TIMEOUT = 4
EXIT_GROUP_LOST = 5  # a peer (allreduce) or a parameter server (pss) was lost: restart, resume


class RecipeError(Exception):
    """An error the task explains in one line; ``code`` is its exit status."""

    code = EXIT_FAILED


class ConfigError(RecipeError):
    """The run config or TF_CONFIG is missing or malformed; the message says what to fix."""

    code = EXIT_BAD_CONFIG


class TargetError(ConfigError):
    """A dotted path (``model._target_``, ``data._target_``, ``model.loss``) names nothing
    callable: the module is not found or has no such attribute."""


class DataError(ConfigError):
    """A data set cannot be loaded; the message is one line naming the path and the fix."""


class InputError(DataError):
    """The configured data cannot be read as configured; one line naming the key to fix."""


class ModelError(ConfigError):
    """The user's model cannot be built or used; one line naming the key and the fix."""


class ObjectiveError(ConfigError):
    """The loss does not fit the model's outputs or the labels; one line naming the key."""


class CheckpointMissing(ConfigError):
    """A restore found a file of the checkpoint missing where it reads it (a ps's host, or the
    chief's); one line naming the host, the file and the fix."""


class TrainingFailed(RecipeError):
    """Training stopped on an error the user can act on; ``code`` is the exit status."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


class PeerUnreachable(TrainingFailed):
    """A peer this task needs never answered within its wait."""

    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_PEER_TIMEOUT)


class UserCodeError(RecipeError):
    """The user's own code (a model or data factory, a loss, its module's import) raised.

    ``key`` names the config key that named the code (``model._target_=my_pkg.models.build``);
    the original exception is ``__cause__`` and its traceback is kept: :meth:`details` gives
    its type, message and the innermost frames of the user's own files.
    """

    code = EXIT_FAILED

    def __init__(self, key: str, target: str, error: BaseException, doing: str = "raised") -> None:
        self.key, self.target, self.error = key, target, error
        message = " ".join(str(error).split())[:300]
        what = type(error).__name__ + (f": {message}" if message else "")
        where = user_frames(error.__traceback__, limit=1, source=False)
        at = f" at {where[0]}" if where else ""
        super().__init__(f"{key}={target} {doing} {what}{at}")
        self.__cause__ = error

    def details(self, limit: int = 5) -> list[str]:
        """The innermost ``limit`` frames of the user's files, ``file:line in function``."""
        return user_frames(self.error.__traceback__, limit)


def _is_own_frame(filename: str) -> bool:
    """A frame of the user's code: not the standard library, not an installed package (Keras,
    TensorFlow, numpy), not the recipes."""
    path = os.path.abspath(filename)
    if filename.startswith("<") or "site-packages" in path or "dist-packages" in path:
        return False
    here = os.path.dirname(os.path.abspath(__file__))
    if path.startswith(here + os.sep):
        return False
    stdlib = os.path.dirname(os.__file__)
    return not path.startswith(stdlib + os.sep)


def user_frames(tb: Optional[TracebackType], limit: int = 5, source: bool = True) -> list[str]:
    """The innermost ``limit`` frames of ``tb`` in the user's own files, innermost last, as
    ``path:line in function: source line`` (``path:line`` alone without ``source``)."""
    frames = [f for f in traceback.extract_tb(tb) if _is_own_frame(f.filename)]
    if not source:
        return [f"{f.filename}:{f.lineno}" for f in frames[-limit:]]
    return [
        f"{f.filename}:{f.lineno} in {f.name}" + (f": {f.line.strip()}" if f.line else "")
        for f in frames[-limit:]
    ]


def report_failure(e: BaseException) -> int:
    """What a recipes' entry point does with an error that ends it: one line on stderr
    (``error: ...``; an unexplained one with its type), the user's own frames under a
    :class:`UserCodeError`, and the exit code. ``TFPLAN_DEBUG`` set: re-raised, so Python
    prints the whole traceback."""
    if os.environ.get("TFPLAN_DEBUG"):
        raise e
    if isinstance(e, RecipeError):
        print(f"error: {e}", file=sys.stderr, flush=True)
    else:  # not one the recipes explain: its type says more than its message alone
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    if isinstance(e, UserCodeError):
        for frame in e.details():
            print(f"  {frame}", file=sys.stderr)
        print("  (TFPLAN_DEBUG=1 shows the whole traceback)", file=sys.stderr, flush=True)
    return e.code if isinstance(e, RecipeError) else EXIT_FAILED
