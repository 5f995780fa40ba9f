"""The matcher of known failures (pure): gating by exit status and kernel record, the last match,
placeholders. The entries themselves are proved against real failures in
tests/test_known_failures.py."""

from __future__ import annotations

import pytest

from tfplan.diagnosis import catalogue
from tfplan.diagnosis.catalogue import CATALOGUE, KnownFailure, register
from tfplan.diagnosis.explain import Evidence, OomKill, error_line, explain, last_lines


def evidence(output: str = "", exit_code: int | None = 1, **extra: object) -> Evidence:
    return Evidence("worker/1", "h2", exit_code, output, "/out", **extra)  # type: ignore[arg-type]


def test_an_out_of_memory_kill_needs_both_the_exit_status_and_the_kernel_record() -> None:
    oom = OomKill(pid=7, name="python", rss_bytes=3 * 2**30, at=0.0)
    assert explain(evidence(exit_code=137)) is None
    assert explain(evidence(exit_code=1, oom=oom)) is None
    found = explain(evidence(exit_code=137, oom=oom))
    assert found is not None and found.id == "oom-killed"
    assert found.cause == "killed by the out-of-memory killer on host h2 at RSS 3.0 GiB"
    unknown = OomKill(pid=0, name="tensorflow", rss_bytes=0, at=0.0)  # a kubelet's OOMKilled
    found = explain(evidence(exit_code=137, oom=unknown))
    assert found is not None and found.cause == "killed by the out-of-memory killer on host h2"


def test_a_task_that_ended_well_is_explained_only_when_it_never_joined_the_cluster() -> None:
    assert explain(evidence("loss became NaN near step=3", exit_code=0)) is None
    assert explain(evidence(exit_code=0)) is None
    found = explain(evidence(exit_code=0, never_listened=True))
    assert found is not None and found.id == "tf-config-ignored"
    assert explain(evidence(exit_code=1, never_listened=True)) is None


def test_the_last_match_fills_the_placeholders() -> None:
    output = "loss became NaN near step=12: lower\nloss became NaN near step=40: lower\n"
    found = explain(evidence(output, exit_code=3))
    assert found is not None and found.cause == "the loss became NaN at step 40"
    assert "algo.lr" in found.fix


def test_a_fix_keeps_literal_braces_and_a_missing_group_is_a_question_mark() -> None:
    found = explain(evidence("x.py: error: the following arguments are required: --job_name"))
    assert found is not None
    assert found.cause == "the program needs --job_name, which recipe.command does not pass"
    assert "{job_name}" in found.fix and "{task_index}" in found.fix


def test_an_unknown_failure_is_not_explained_and_keeps_its_last_lines() -> None:
    output = "starting\n\nTraceback (most recent call last):\nValueError: my own bug\n\n"
    assert explain(evidence(output)) is None
    assert last_lines(output, 2) == ["Traceback (most recent call last):", "ValueError: my own bug"]


def test_preflight_entries_never_match_a_run() -> None:
    gpus = next(e for e in CATALOGUE if e.id == "gpus-missing")
    assert gpus.where == "preflight" and explain(evidence(""), [gpus]) is None


def test_an_extension_registers_its_own_entry_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue, "CATALOGUE", list(CATALOGUE))
    mine = KnownFailure(
        id="my-lib-license",
        title="the license server is down",
        patterns=(r"license server (?P<server>\S+) unreachable",),
        cause="{task} could not reach the license server {server}",
        fix="start it",
        reproduce="stop the server",
    )
    catalogue.register(mine, first=True)
    found = explain(evidence("license server lic1:27000 unreachable"), catalogue.CATALOGUE)
    assert (
        found is not None
        and found.cause == "worker/1 could not reach the license server lic1:27000"
    )
    with pytest.raises(ValueError, match="already registered"):
        catalogue.register(mine)
    assert register is catalogue.register


def test_the_error_line_is_quoted_not_a_frame_or_a_hint_after_it() -> None:
    user_code = (
        "step=0 loss=2.3\n"
        "error: model._target_=pkg.models.build raised KeyError: 'hidden_units' at pkg/models.py:7\n"
        "  pkg/models.py:7 in build: units = cfg['hidden_units']\n"
        "  (TFPLAN_DEBUG=1 shows the whole traceback)\n"
    )
    assert error_line(user_code) == (
        "error: model._target_=pkg.models.build raised KeyError: 'hidden_units' at pkg/models.py:7"
    )
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/x/tensorflow/python/framework/ops.py", line 1221, in from_node_def\n'
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: No space left on device\n"
        '  File "/x/tensorflow/python/framework/ops.py", line 1221, in from_node_def\n'
    )
    assert error_line(traceback) == (
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: No space left on device"
    )
    assert error_line("step=1 loss=0.5\nbye\n") is None
