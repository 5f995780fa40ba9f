"""result.json's examples_per_sec (recipes/reporting.py ProgressLog.examples_per_sec): the job's
speed over the window the task saw, or, when it saw less than a second of the job, the mean since
the task started; never the steps others made before its first step over its own milliseconds
(a chief that got its first step after its workers' last reported 6.4e10 examples/s)."""

from __future__ import annotations

import time

from recipes.reporting import MIN_RATE_SECS, ProgressLog


def _progress(process_start: float) -> ProgressLog:
    return ProgressLog(examples_per_step=64, log_steps=1000, process_start=process_start, log=print)


def test_the_rate_is_the_steps_seen_over_the_time_they_took() -> None:
    progress = _progress(time.time())
    progress.step(10, [1.0])
    progress.t_start -= 2 * MIN_RATE_SECS  # as if the first step came two windows earlier
    progress.step(30, [1.0])
    rate = progress.examples_per_sec(global_step=30)
    window = progress.train_secs
    assert window >= 2 * MIN_RATE_SECS
    assert rate == (30 - 10) * 64 / window


def test_a_task_that_saw_one_step_reports_the_mean_since_it_started() -> None:
    started = time.time() - 20.0  # its process began 20 s ago; the workers did 99 steps
    progress = _progress(started)
    progress.step(100, [1.0])  # its first and last step
    rate = progress.examples_per_sec(global_step=100)
    assert 100 * 64 / 21.0 < rate <= 100 * 64 / 20.0


def test_checkpoints_written_after_the_first_step_are_not_training_time() -> None:
    """A final checkpoint of a 10^7-row table took longer than the last hundred steps: counted,
    the chief reported a fifth of the job's speed (bench_embeddings)."""
    progress = _progress(time.time())
    progress.pause(50.0)  # the initial checkpoint, before any step: nothing to leave out
    progress.step(10, [1.0])
    progress.t_start -= 10 * MIN_RATE_SECS  # ten windows of training and writing
    progress.pause(8 * MIN_RATE_SECS)  # of which eight went to writing a checkpoint
    progress.step(30, [1.0])
    progress.pause(100.0)  # the checkpoint the saver writes as the session ends: after the last
    whole = progress.t_last - progress.t_start
    assert progress.train_secs == whole - 8 * MIN_RATE_SECS
    assert progress.examples_per_sec(global_step=30) == (30 - 10) * 64 / progress.train_secs
