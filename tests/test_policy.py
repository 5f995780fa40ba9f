"""Restart policies (TFJob semantics) as a pure function."""

from __future__ import annotations

import pytest

from tfplan.planning.policy import backoff_delay, decide_restart


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("Never", 137, False),
        ("Never", 1, False),
        ("OnFailure", 0, False),
        ("OnFailure", 1, True),
        ("OnFailure", None, True),
        ("Always", 0, True),
        ("Always", 2, True),
        ("ExitCode", 0, False),
        ("ExitCode", 1, False),  # the program gave up: permanent
        ("ExitCode", 127, False),
        ("ExitCode", 128, True),
        ("ExitCode", 137, True),  # SIGKILL / OOM killer: retried
        ("ExitCode", 143, True),
        ("ExitCode", None, True),  # vanished with its whole group: counted as killed
    ],
)
def test_policy_table(policy: str, code: int | None, restart: bool) -> None:
    assert decide_restart(policy, code, restarts=0, backoff_limit=3).restart is restart


def test_backoff_limit_stops_restarts_and_says_why() -> None:
    assert decide_restart("OnFailure", 1, restarts=2, backoff_limit=3).restart
    decision = decide_restart("OnFailure", 1, restarts=3, backoff_limit=3)
    assert not decision.restart and "backoff limit" in decision.reason
    assert not decide_restart("Always", 137, restarts=0, backoff_limit=0).restart


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_delay(1.0, n) for n in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff_delay(1.0, 20) == 60.0
    assert backoff_delay(0.0, 5) == 0.0
