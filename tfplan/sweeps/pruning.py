"""Stopping the points of a sweep that are clearly worse than the finished ones (pure).

A point reports its held-out accuracy while it trains: a line ``eval step=N ... accuracy=X``
from any of its tasks (the built-in evaluator prints one per checkpoint it scores; a program of
your own may print the same, docs/contract.md). ``sweep.prune=median`` stops a point whose
accuracy at step N is below the median of the finished points' accuracy at that step, once
``sweep.prune_startup_points`` points have finished and from step ``sweep.prune_warmup_steps``
on: Optuna's MedianPruner, with one difference the evaluator's steps force: a finished point's
accuracy "at step N" is the last one it reported at or before N (its evaluator scored
whichever checkpoint was newest, not the same steps as another point's).

With ``hydra/sweeper=optuna`` the study's own pruner decides instead (tfplan.sweeps.optuna_tap).
"""

from __future__ import annotations

import re
import statistics
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfplan.errors import ConfigError

__all__ = ["EVAL_LINE", "PRUNE_KINDS", "PruneRule", "Curves", "eval_score", "median_verdict"]

PRUNE_KINDS = ("none", "median")
EVAL_LINE = re.compile(r"\beval step=(\d+)\b.*?\baccuracy=([-+0-9.eE]+|nan)")

Curve = Sequence[tuple[int, float]]  # (step, accuracy), steps increasing


@dataclass(frozen=True)
class PruneRule:
    kind: str = "none"  # none | median
    startup_points: int = 3  # finished points needed before any is pruned
    warmup_steps: int = 0  # no point is pruned before this step

    @classmethod
    def of(cls, sweep: Mapping[str, object]) -> PruneRule:
        """From the ``sweep`` config node.

        Raises:
            ConfigError: an unknown kind or a negative count.
        """
        kind = str(sweep.get("prune", "none"))
        if kind not in PRUNE_KINDS:
            raise ConfigError(
                "sweep.prune", f"'{kind}' is not a pruning rule", f"use one of {PRUNE_KINDS}"
            )
        startup = int(sweep.get("prune_startup_points", 3))  # type: ignore[call-overload]
        warmup = int(sweep.get("prune_warmup_steps", 0))  # type: ignore[call-overload]
        if startup < 1:
            raise ConfigError("sweep.prune_startup_points", f"{startup} < 1", "use 1 or more")
        if warmup < 0:
            raise ConfigError("sweep.prune_warmup_steps", f"{warmup} < 0", "use 0 or more")
        return cls(kind, startup, warmup)


def eval_score(line: str) -> tuple[int, float] | None:
    """(step, accuracy) of an ``eval step=N ... accuracy=X`` line; None for any other line."""
    match = EVAL_LINE.search(line)
    if match is None:
        return None
    value = float(match.group(2))
    return (int(match.group(1)), value) if value == value else None  # NaN: no score


def value_at(curve: Curve, step: int) -> float | None:
    """The last accuracy a curve reported at or before ``step``."""
    found = None
    for at, value in curve:
        if at > step:
            break
        found = value
    return found


def median_verdict(
    rule: PruneRule, step: int, value: float, finished: Sequence[Curve]
) -> str | None:
    """Why a point with accuracy ``value`` at ``step`` is pruned, given the finished points'
    curves; None when it goes on."""
    if rule.kind != "median" or step < rule.warmup_steps:
        return None
    known = [v for v in (value_at(curve, step) for curve in finished) if v is not None]
    if len(known) < rule.startup_points:
        return None
    median = statistics.median(known)
    if value >= median:
        return None
    return (
        f"pruned at step {step}: accuracy {value:.4f} below the median {median:.4f} of "
        f"{len(known)} finished point(s) at that step"
    )


class Curves:
    """The accuracy curves of a sweep's points, as their lines come (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._curves: dict[int, list[tuple[int, float]]] = {}
        self._finished: set[int] = set()

    def add(self, num: int, step: int, value: float) -> bool:
        """Record a score; False when the point already had one at this step or later."""
        with self._lock:
            curve = self._curves.setdefault(num, [])
            if curve and curve[-1][0] >= step:
                return False
            curve.append((step, value))
            return True

    def finish(self, num: int) -> None:
        """The point completed (not pruned, not failed): its curve now counts."""
        with self._lock:
            self._finished.add(num)

    def seed(self, num: int, curve: Curve) -> None:
        """A point that finished in an earlier run of the sweep."""
        with self._lock:
            self._curves[num] = list(curve)
            self._finished.add(num)

    def finished(self, but: int | None = None) -> list[list[tuple[int, float]]]:
        with self._lock:
            return [list(self._curves.get(n, [])) for n in sorted(self._finished) if n != but]

    def last(self, num: int) -> tuple[int, float] | None:
        with self._lock:
            curve = self._curves.get(num)
            return curve[-1] if curve else None
