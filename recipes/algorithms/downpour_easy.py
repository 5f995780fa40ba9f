"""DOWNPOUR-Easy: DOWNPOUR with plain SGD on the workers, every worker at the same rate.

The seed guide's ``DOWNPOUR-Easy`` gives worker k the local rate ``lr * task_index``, so worker 0
never moves its copy (rate 0) and just sends T gradients taken at the pulled weights. Here every
worker steps with ``lr``; the window, push and pull are DOWNPOUR's (see ``downpour.py``): T local
SGD steps, then the ps applies ``ps_optimizer`` to the window (``adagrad``, the guide's and the
DistBelief paper's choice, on the sum of the T gradients; ``sgd`` adds the parameter delta).

Config keys: ``window`` (T, default 3 as the guide), ``ps_optimizer`` (default adagrad), ``lr``;
``optimizer`` must be ``sgd``.
"""

from __future__ import annotations

import dataclasses

from recipes.algorithms.base import BuildContext, Problem, TrainGraph
from recipes.algorithms.downpour import Downpour
from recipes.errors import ConfigError


class DownpourEasy(Downpour):
    name = "downpour_easy"

    def build(self, ctx: BuildContext, problem: Problem) -> TrainGraph:
        if ctx.algo.optimizer != "sgd":
            raise ConfigError(
                f"downpour_easy runs plain SGD on the workers; got "
                f"algo.optimizer={ctx.algo.optimizer} (use algo=downpour for others)"
            )
        extra = {
            "window": 3,
            "ps_optimizer": "adagrad",
            **{k: v for k, v in ctx.algo.extra.items() if v is not None},
        }
        ctx = dataclasses.replace(ctx, algo=dataclasses.replace(ctx.algo, extra=extra))
        return super().build(ctx, problem)
