"""Built-in TF2 distribution strategies, next to the TF1 algorithms of ``recipes/algorithms``.

- ``allreduce``: MultiWorkerMirroredStrategy, chief/worker tasks only (no ps), synchronous.
- ``pss``: ParameterServerStrategy; the chief coordinates, ps and worker tasks are servers.

They run eagerly (TF2), so ``recipes/train.py`` dispatches to :func:`run_task` before it turns
eager execution off for the TF1 recipes. The evaluator is shared: it reads both checkpoint
formats. Modules import TensorFlow, so they are loaded only when a task runs. Each strategy's
update rule is ``optimizer.py``; its checkpoints are ``checkpoints.py``.
"""

from __future__ import annotations

from typing import Any, Callable

from recipes.config import RunConfig, TaskInfo
from recipes.errors import ConfigError

__all__ = ["STRATEGIES", "is_strategy", "run_task"]

STRATEGIES = ("allreduce", "pss")


def is_strategy(name: str) -> bool:
    return name in STRATEGIES


def run_task(
    cfg: RunConfig, task: TaskInfo, process_start: float, log: Callable[[str], None] = print
) -> int:
    """Run this task of a TF2 strategy (not the evaluator); returns the exit code."""
    run: Any
    if cfg.algo.name == "allreduce":
        from recipes.strategies.allreduce import run_allreduce as run
    elif cfg.algo.name == "pss":
        from recipes.strategies.pss import run_pss as run
    else:
        raise ConfigError(
            f"algo={cfg.algo.name}: not a TF2 strategy; valid: {', '.join(STRATEGIES)}"
        )
    return int(run(cfg, task, process_start, log))
