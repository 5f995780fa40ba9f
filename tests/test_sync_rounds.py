"""Snapshots between two synchronous rounds (recipes/sync_rounds.py): the gate waits for the
round being applied, holds the next one back for its block, and gives up (holding nothing) on a
round that never ends. Threads and events; the real optimizer's rounds run in
test_snapshots.py's synchronous case."""

from __future__ import annotations

import threading

import pytest

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


def test_training_done_waits_for_the_round_being_applied_and_applies_none_after_it() -> None:
    """RoundGate.finish (the chief's hook's end, before its final checkpoint): the round being
    applied ends first; a round asked for afterwards is not run (OutOfRangeError, which the
    queue runner takes for a closed queue: its thread ends quietly)."""
    import tensorflow as tf

    gate = RoundGate()
    events: list[str] = []
    began, may_end = threading.Event(), threading.Event()

    def applied() -> None:
        began.set()
        assert may_end.wait(10)
        events.append("round 1 applied")

    rounds = threading.Thread(target=lambda: gate.applying(applied))
    rounds.start()
    assert began.wait(10)
    finishing = threading.Thread(target=lambda: events.append(f"finished {gate.finish(10)}"))
    finishing.start()
    finishing.join(0.3)
    assert finishing.is_alive() and events == []  # it waits for the round
    may_end.set()
    finishing.join(10)
    rounds.join(10)
    assert events == ["round 1 applied", "finished True"] and gate.done
    try:
        gate.applying(lambda: events.append("round 2 applied"))
    except tf.errors.OutOfRangeError:
        events.append("round 2 refused")
    assert events[-1] == "round 2 refused"


@pytest.mark.parametrize("backups", [False, True])
def test_without_backup_workers_the_end_does_not_wait_for_the_open_round(backups: bool) -> None:
    """Every round needs the chief's gradient when no worker is a backup: the round open when the
    chief's training ends is never applied, so the hook's end (before the final checkpoint) does
    not wait for it (it held every synchronous job's end for FINISH_WAIT_SECS); with backup
    workers it does, as the round can still be applied."""
    import tensorflow as tf

    gate = RoundGate(backups=backups)
    began, may_end = threading.Event(), threading.Event()
    outcome: list[str] = []

    def open_round() -> None:
        began.set()
        assert may_end.wait(10)

    def run_round() -> None:
        gate.applying(open_round)
        outcome.append("applied")

    rounds = threading.Thread(target=run_round)
    rounds.start()
    assert began.wait(10)
    ending = threading.Thread(target=lambda: gate.hook().end(None))
    ending.start()
    ending.join(0.5 if backups else 10)
    assert ending.is_alive() is backups  # it waits only where the round can still end
    may_end.set()
    ending.join(10)
    rounds.join(10)
    assert outcome == ["applied"] and gate.done
    with pytest.raises(tf.errors.OutOfRangeError):
        gate.applying(lambda: None)  # no round after the end


def test_with_backup_workers_the_end_stops_waiting_once_every_other_replica_has_ended() -> None:
    """The open round of a job with backup workers can still be applied while another replica
    may push its gradient; once every other replica has ended (``gone``: their done tokens in)
    none can come, and finish returns without the round."""
    gate = RoundGate(backups=True)
    began, may_end, others_ended = threading.Event(), threading.Event(), threading.Event()

    def open_round() -> None:
        began.set()
        assert may_end.wait(10)

    rounds = threading.Thread(target=lambda: gate.applying(open_round))
    rounds.start()
    assert began.wait(10)
    said: list[bool] = []
    ending = threading.Thread(target=lambda: said.append(gate.finish(20, others_ended.is_set)))
    ending.start()
    ending.join(0.5)
    assert ending.is_alive()  # a peer may still push: it waits
    others_ended.set()
    ending.join(10)
    assert not ending.is_alive() and said == [False]  # the round did not end; none will
    may_end.set()
    rounds.join(10)


def test_a_round_refused_after_the_end_stops_the_real_runner_cleanly() -> None:
    """The race CI hit: the rounds held for a snapshot as training ends; the runner, let go by
    finish, is refused its next round. TensorFlow's own QueueRunner and Coordinator must take
    that for a clean stop (a CancelledError there failed the chief: 'training done: no more
    rounds')."""
    import tensorflow as tf

    from recipes.sync_rounds import _GatedQueueRunner

    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        queue = v1.FIFOQueue(4, [tf.int32], shapes=[[]])
        runner = v1.train.QueueRunner(queue, [queue.enqueue(1)])
        gate = RoundGate()
        gated = _GatedQueueRunner(runner, gate)
        with v1.Session(graph=graph) as sess:
            coord = v1.train.Coordinator()
            with gate.between(10) as clear:  # a snapshot between two rounds
                assert clear
                threads = gated.create_threads(sess, coord=coord, daemon=True, start=True)
                gate.finish(0.0)  # training ends meanwhile
            for thread in threads:
                if not thread.name.endswith("close_on_stop"):
                    thread.join(10)
                    assert not thread.is_alive()
            coord.request_stop()
            coord.join(threads, stop_grace_period_secs=5)  # raises what the runner reported
            assert sess.run(queue.size()) == 0  # no round ran
