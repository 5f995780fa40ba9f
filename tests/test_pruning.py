"""sweep.prune=median (tfplan.sweeps.pruning): the rule, the scores it reads, its verdicts."""

from __future__ import annotations

import pytest

from tfplan.errors import ConfigError
from tfplan.sweeps.pruning import Curves, PruneRule, eval_score, median_verdict, value_at

MEDIAN = PruneRule("median", startup_points=2, warmup_steps=100)


def test_scores_are_read_from_the_evaluators_lines_and_nothing_else() -> None:
    assert eval_score("eval step=400 accuracy=0.9123 loss=0.3012") == (400, 0.9123)
    assert eval_score("eval step=7 mae=1.0 accuracy=1e-2") == (7, 0.01)
    assert eval_score("eval step=400 mae=0.1 loss=0.3") is None  # no accuracy: no score
    assert eval_score("eval step=400 accuracy=nan loss=nan") is None
    assert eval_score("step=400 loss=0.3 accuracy=0.5") is None  # a training line
    assert eval_score("retrieval step=4 accuracy=0.5") is None


def test_a_finished_points_value_at_a_step_is_its_last_score_at_or_before_it() -> None:
    curve = [(200, 0.5), (600, 0.8), (1000, 0.9)]
    assert value_at(curve, 199) is None
    assert value_at(curve, 200) == 0.5
    assert value_at(curve, 599) == 0.5
    assert value_at(curve, 5000) == 0.9


def test_median_prunes_below_the_finished_median_after_warm_up_and_start_up() -> None:
    finished = [[(200, 0.6), (400, 0.8)], [(200, 0.4), (400, 0.9)], [(300, 0.7)]]
    why = median_verdict(MEDIAN, 400, 0.5, finished)
    assert why == (
        "pruned at step 400: accuracy 0.5000 below the median 0.8000 of 3 finished point(s) "
        "at that step"
    )
    assert median_verdict(MEDIAN, 400, 0.8, finished) is None  # at the median: goes on
    assert median_verdict(MEDIAN, 99, 0.0, finished) is None  # before the warm-up
    assert "of 2 finished point(s)" in str(median_verdict(MEDIAN, 200, 0.1, finished))
    assert median_verdict(MEDIAN, 250, 0.1, finished[:1]) is None  # 1 is under start-up
    assert median_verdict(PruneRule("none"), 400, 0.0, finished) is None


def test_the_rule_is_checked_field_by_field() -> None:
    assert PruneRule.of({"prune": "median", "prune_startup_points": 5}) == PruneRule("median", 5)
    with pytest.raises(ConfigError, match="sweep.prune: 'mean' is not a pruning rule"):
        PruneRule.of({"prune": "mean"})
    with pytest.raises(ConfigError, match="sweep.prune_warmup_steps: -1 < 0"):
        PruneRule.of({"prune": "median", "prune_warmup_steps": -1})


def test_curves_count_finished_points_only_and_keep_steps_increasing() -> None:
    curves = Curves()
    assert curves.add(0, 100, 0.5) and curves.add(0, 200, 0.6)
    assert not curves.add(0, 200, 0.7)  # the same checkpoint scored twice counts once
    curves.add(1, 100, 0.4)
    assert curves.finished() == []
    curves.finish(0)
    assert curves.finished() == [[(100, 0.5), (200, 0.6)]]
    assert curves.finished(but=0) == []
    curves.seed(2, [(50, 0.1)])  # finished in an earlier run of the sweep
    assert curves.finished(but=1) == [[(100, 0.5), (200, 0.6)], [(50, 0.1)]]
    assert curves.last(1) == (100, 0.4) and curves.last(9) is None
