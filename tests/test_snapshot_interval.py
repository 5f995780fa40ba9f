"""How often the snapshots are taken (recipes/ps_snapshots.py ``SnapshotHook``): the hook counts
the job's global steps while a snapshot runs and while none does, and widens the interval until
the steps the snapshots cost are at most ``OVERHEAD_BUDGET`` of training, said once. The job is
a sequence of hooked runs with the times and steps given here (a stand-in for the chief's
session and for the snapshots' own runs, whose real path runs in test_snapshots.py and
test_ps_snapshots.py): the rule, not TensorFlow, is what is tested."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

import recipes.ps_snapshots as ps_snapshots
from recipes.ps_snapshots import COST_FACTOR, MIN_GAP_FACTOR, OVERHEAD_BUDGET, SnapshotHook


class _Snapshots:
    """What the hook asks of PsSnapshots: a snapshot's (step, seconds), as configured."""

    copies = False
    where = "/dev/shm/tfplan-snapshots-test"
    global_step = None

    def __init__(self, secs: float) -> None:
        self.secs = secs
        self.seen: int | None = None

    def take(self, session: Any) -> tuple[int, float]:
        return int(self.seen or 0), self.secs


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


def _job(
    monkeypatch: pytest.MonkeyPatch,
    secs: float,
    rate: float,
    rate_during: float,
    blocked: bool = False,
    tick: float = 0.05,
) -> tuple[SnapshotHook, list[str]]:
    """A job training at ``rate`` steps/s, ``rate_during`` while a snapshot of ``secs`` runs
    (the snapshot's thread alive for ``secs``, its work done as it ends); 1,000 s of it, a
    hooked run every ``tick`` seconds; ``blocked``: no hooked run ends while a snapshot runs (a
    synchronous job's rounds wait for it)."""
    clock = _Clock()
    monkeypatch.setattr(ps_snapshots, "time", SimpleNamespace(monotonic=clock.monotonic))
    logs: list[str] = []
    hook = SnapshotHook(_Snapshots(secs), every_secs=1.0, log=logs.append)  # type: ignore[arg-type]
    context = SimpleNamespace(session=None)
    running_until = [0.0]
    starts: list[float] = []  # when each snapshot began
    hook.starts = starts  # type: ignore[attr-defined]

    class _Thread:  # the snapshot's thread: alive for its duration, its work done at its end
        def __init__(self, target: Any, args: Any, **_: Any) -> None:
            self._run: Any = lambda: target(*args)

        def start(self) -> None:
            running_until[0] = clock.now + secs
            starts.append(clock.now)

        def is_alive(self) -> bool:
            if clock.now < running_until[0]:
                return True
            if self._run is not None:  # it ended at running_until
                now, clock.now = clock.now, running_until[0]
                self._run()
                self._run, clock.now = None, now
            return False

    monkeypatch.setattr(ps_snapshots.threading, "Thread", _Thread)
    hook.after_create_session(None, None)
    step = 0.0
    while clock.now < 1100.0:
        clock.now += tick
        during = clock.now <= running_until[0]
        step += tick * (rate_during if during else rate)
        if not (blocked and during):
            hook.after_run(context, SimpleNamespace(results=int(step)))
    return hook, logs


def test_a_snapshot_that_hardly_slows_training_keeps_its_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a small model: runs of 10 ms, a snapshot of 0.1 s, training 5 % slower meanwhile
    hook, logs = _job(monkeypatch, secs=0.1, rate=100.0, rate_during=95.0, tick=0.01)
    # (read high: the run that ends after a snapshot counts its steps after it)
    slower = hook.slowdown()
    assert slower is not None and 0.0 < slower < 0.25, slower
    assert hook._interval == 1.0  # 2 x 0.2 x 0.1 s / 0.05 = 0.8 s: under lifecycle.snapshot_secs
    assert not [m for m in logs if "taking one every" in m], logs
    assert hook.taken > 900  # one a second or so, for 1,000 s


def test_a_snapshot_that_slows_every_ps_widens_the_interval_to_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hook, logs = _job(monkeypatch, secs=1.7, rate=100.0, rate_during=30.0)
    slower = hook.slowdown()
    assert slower is not None and 0.65 < slower < 0.75, slower
    assert hook._interval == pytest.approx(COST_FACTOR * slower * 1.7 / OVERHEAD_BUDGET, rel=0.02)
    # what they cost (the steps lost while they ran, and as much again after them, by
    # COST_FACTOR), over the job's steps: within the budget
    cost = COST_FACTOR * slower * hook.taken * 1.7 / 1000.0
    assert cost <= OVERHEAD_BUDGET * 1.2, (cost, hook.taken)
    widened = [m for m in logs if "taking one every" in m]
    assert len(widened) == 1, logs  # said once
    assert widened[0].startswith("snapshots: one took 1.70s and training ran ")
    assert widened[0].endswith(
        "instead of 1s (lifecycle.snapshot_secs), so that they cost at most 5% of training"
    )


def test_the_next_snapshot_waits_the_interval_the_one_before_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a large table's snapshot: 3 s (every 1 s asked); the first sets an interval of 2 x 3 s at
    # least, which the second waits from the first's start (it began as the first ended)
    hook, _ = _job(monkeypatch, secs=3.0, rate=100.0, rate_during=95.0)
    starts = hook.starts  # type: ignore[attr-defined]
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert len(gaps) > 50 and min(gaps) >= MIN_GAP_FACTOR * 3.0 - 0.06, gaps[:5]
    assert hook._interval >= MIN_GAP_FACTOR * 3.0
    # from the one before's start, not its end: that would add its 3 s to every gap
    assert min(gaps) < 3.0 + MIN_GAP_FACTOR * 3.0 - 0.06, gaps[:5]


def test_rounds_that_wait_for_each_snapshot_count_the_whole_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a synchronous job: no step, no hooked run while a snapshot runs
    hook, _ = _job(monkeypatch, secs=0.2, rate=50.0, rate_during=0.0, blocked=True)
    slower = hook.slowdown()  # the first round after it counts after it: 1
    assert slower == pytest.approx(1.0, abs=0.02), slower
    assert hook._interval == pytest.approx(
        max(1.0, COST_FACTOR * slower * 0.2 / OVERHEAD_BUDGET, MIN_GAP_FACTOR * 0.2), rel=0.02
    )
    assert hook._interval > 3.0  # 1 s would have paused the rounds a fifth of the time


class _Session:
    def __init__(self, closed: bool) -> None:
        self._closed = closed


class _Cancelled(_Snapshots):
    """Every snapshot cancelled: how a ps's failing SaveV2 (a full folder) can reach the chief
    (another partition's op cancelled first), and how a session closed under a snapshot does."""

    def take(self, session: Any) -> tuple[int, float]:
        import tensorflow as tf

        raise tf.errors.CancelledError(None, None, "RecvTensor cancelled")


@pytest.mark.parametrize(
    ("closed", "ending", "said"), [(False, False, 1), (True, False, 0), (False, True, 0)]
)
def test_snapshots_cancelled_on_an_open_session_are_a_failure_said_once(
    closed: bool, ending: bool, said: int
) -> None:
    logs: list[str] = []
    hook = SnapshotHook(_Cancelled(0.1), every_secs=1.0, log=logs.append)  # type: ignore[arg-type]
    hook._ending = ending  # the hook's end() ran: the session is closing
    for _ in range(5):
        hook._take(_Session(closed))
    told = [m for m in logs if m.startswith("snapshots: CancelledError: RecvTensor cancelled;")]
    assert len(told) == said and len(logs) == said, logs
    assert hook.taken == 0


def test_first_line_skips_tensorflows_framing_for_the_telling_line() -> None:
    from recipes.failures import first_line

    full = "/tmp/x/ps0/a/snapshot.data-00000-of-00001.tempstate1; No space left on device"
    framed = [
        f"RESOURCE_EXHAUSTED: From /job:worker/replica:0/task:0:\n{full}\n\t [[{{{{node s}}}}]]",
        f"Graph execution error:\n\nDetected at node 's' defined at:\n  File \"t.py\"\nNode: 's'\n{full}",
        f"==================\n{full}\n==================",
    ]
    for text in framed:
        assert first_line(Exception(text)) == full, text
    assert first_line(Exception("==========")) == "Exception"  # nothing telling: the kind
