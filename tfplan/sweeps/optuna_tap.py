"""Intermediate results and pruning for Hydra's Optuna sweeper, which has neither.

Hydra's Optuna sweeper (hydra-optuna-sweeper) creates the study, asks it for a batch of
trials, hands the launcher only their overrides, and tells the study each job's return value:
no trial reaches the job, so nothing can be reported while it runs, and no job can end PRUNED
(facebookresearch/hydra#1954, #1710). While a tfplan sweep runs with it, :func:`tapped` wraps
``optuna.create_study`` so that the study the sweeper creates

- gets the pruner tfplan's config names (``sweep.prune=median``: Optuna's MedianPruner with
  ``sweep.prune_startup_points`` / ``sweep.prune_warmup_steps``; ``sweep.pruner``: any pruner,
  as ``{_target_: optuna.pruners.PercentilePruner, percentile: 25.0, ...}``; ``none``: NopPruner),
- hands the launcher the trials it asked for, in the order the sweeper made the batch's
  overrides (job i of a batch is trial i), so that a point reports
  ``trial.report(accuracy, step)`` and asks ``trial.should_prune()`` at each score,
- records a point tfplan stopped for it as PRUNED instead of the value the sweeper tells;
- leaves every trial as the study recorded it in ``<sweep dir>/optuna.json``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tfplan.errors import ConfigError

__all__ = ["OptunaTap", "current", "make_pruner", "tapped"]

_current: OptunaTap | None = None


def current() -> OptunaTap | None:
    """The tap of the sweep running in this process, if its sweeper is Optuna's."""
    return _current


def make_pruner(kind: str, startup: int, warmup: int, pruner: Mapping[str, Any] | None) -> Any:
    """The Optuna pruner tfplan's sweep config names."""
    import optuna

    if pruner:
        from hydra.utils import instantiate

        try:
            return instantiate(dict(pruner))
        except Exception as error:  # noqa: BLE001 - Hydra's and the pruner's own, made one line
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise ConfigError(
                "sweep.pruner",
                first,
                "name an Optuna pruner: +sweep.pruner={_target_: optuna.pruners.MedianPruner}",
            ) from None
    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=warmup)
    return optuna.pruners.NopPruner()


class _TappedStudy:
    """The sweeper's study, with ask and tell seen by the tap; everything else as it is."""

    def __init__(self, study: Any, tap: OptunaTap) -> None:
        self._study = study
        self._tap = tap

    def ask(self, *args: Any, **kwargs: Any) -> Any:
        trial = self._study.ask(*args, **kwargs)
        self._tap.asked(trial)
        return trial

    def tell(self, trial: Any, *args: Any, **kwargs: Any) -> Any:
        import optuna

        number = trial if isinstance(trial, int) else trial.number
        if self._tap.was_pruned(number):
            return self._study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return self._study.tell(trial, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


class OptunaTap:
    def __init__(self, pruner: Any) -> None:
        self.pruner = pruner
        self._lock = threading.Lock()
        self._asked: list[Any] = []
        self._bound: dict[int, Any] = {}  # job number -> trial
        self._pruned: set[int] = set()  # trial numbers
        self.study: Any = None  # the sweeper's, once it has created it

    def trials(self) -> list[dict[str, Any]]:
        """Every trial as the study records it (``optuna.json`` in the sweep folder: an
        in-memory study is gone with the sweep)."""
        if self.study is None:
            return []
        return [
            {
                "number": t.number,
                "state": t.state.name,
                "params": dict(t.params),
                "value": t.value,
                "intermediate_values": {str(k): v for k, v in t.intermediate_values.items()},
            }
            for t in self.study.trials
        ]

    def asked(self, trial: Any) -> None:
        with self._lock:
            self._asked.append(trial)

    def bind(self, first_job: int, count: int) -> None:
        """The launcher got a batch of ``count`` jobs numbered from ``first_job``: the trials
        asked for it, in order."""
        with self._lock:
            batch, self._asked = self._asked[:count], self._asked[count:]
            for i, trial in enumerate(batch):
                self._bound[first_job + i] = trial

    def trial(self, job: int) -> Any | None:
        with self._lock:
            return self._bound.get(job)

    def prune(self, job: int) -> None:
        with self._lock:
            trial = self._bound.get(job)
            if trial is not None:
                self._pruned.add(trial.number)

    def was_pruned(self, number: int) -> bool:
        with self._lock:
            return number in self._pruned


@contextmanager
def tapped(pruner: Any) -> Iterator[OptunaTap]:
    """While the sweep runs: studies created get ``pruner`` and are seen by the tap."""
    import optuna

    global _current
    tap = OptunaTap(pruner)
    real = optuna.create_study

    def create_study(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("pruner", tap.pruner)
        tap.study = real(*args, **kwargs)
        return _TappedStudy(tap.study, tap)

    optuna.create_study = create_study
    _current = tap
    try:
        yield tap
    finally:
        optuna.create_study = real
        _current = None
