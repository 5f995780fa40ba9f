"""Snapshots between two synchronous rounds (recipes/sync_rounds.py): the gate waits for the
round being applied, holds the next one back for its block, and gives up (holding nothing) on a
round that never ends. Threads and events; the real optimizer's rounds run in
test_snapshots.py's synchronous case."""

from __future__ import annotations

import threading

from recipes.sync_rounds import RoundGate


def test_the_block_waits_for_the_round_being_applied_and_holds_the_next_one() -> None:
    gate = RoundGate()
    events: list[str] = []
    first_began, first_may_end = threading.Event(), threading.Event()
    second_began = threading.Event()
    in_block, block_may_end = threading.Event(), threading.Event()

    def first() -> None:
        events.append("round 1 begins")
        first_began.set()
        assert first_may_end.wait(10)
        events.append("round 1 ends")

    def second() -> None:
        events.append("round 2 begins")
        second_began.set()

    def block() -> None:
        with gate.between(10) as clear:
            events.append(f"block (clear={clear})")
            in_block.set()
            assert block_may_end.wait(10)
            events.append("block ends")

    rounds = threading.Thread(target=lambda: (gate.applying(first), gate.applying(second)))
    rounds.start()
    assert first_began.wait(10)
    snapshot = threading.Thread(target=block)
    snapshot.start()
    assert not in_block.wait(0.3)  # round 1 is being applied: the block waits
    first_may_end.set()
    assert in_block.wait(10)
    assert not second_began.wait(0.3)  # held back while the block runs
    block_may_end.set()
    assert second_began.wait(10)
    rounds.join(10)
    snapshot.join(10)
    assert events == [
        "round 1 begins",
        "round 1 ends",
        "block (clear=True)",
        "block ends",
        "round 2 begins",
    ]


def test_a_round_that_never_ends_is_not_waited_for_and_nothing_is_held() -> None:
    gate = RoundGate()
    began, may_end = threading.Event(), threading.Event()

    def stuck() -> None:
        began.set()
        may_end.wait(10)

    rounds = threading.Thread(target=lambda: gate.applying(stuck))
    rounds.start()
    assert began.wait(10)
    with gate.between(0.2) as clear:
        assert clear is False
    may_end.set()
    rounds.join(10)
    after: list[str] = []
    gate.applying(lambda: after.append("next round"))  # not held: runs at once
    assert after == ["next round"]
