"""The chief's hooks (recipes/replica.py) in a local graph: what a run writes beside its
checkpoints whatever the speed of its workers."""

from __future__ import annotations

import glob
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import tensorflow as tf

from recipes.dynamic_table import EVENTS_FILE, DynamicSettings, DynamicTable, MaintenanceHook
from recipes.replica import _CheckpointHook, _StepRateHook

v1 = tf.compat.v1


def _rates(folder: Path) -> list[tuple[int, float]]:
    rates = []
    for path in glob.glob(str(folder / "events.out.tfevents.*")):
        for event in v1.train.summary_iterator(path):
            rates += [
                (event.step, v.simple_value)
                for v in event.summary.value
                if v.tag == "global_step/sec"
            ]
    return rates


def _train(folder: Path, steps: int, every: int, step_by: int = 1) -> list[tuple[int, float]]:
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        train = v1.assign_add(gs, step_by)
        hook = _StepRateHook(every_n_steps=every, output_dir=str(folder))
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(steps):
                sess.run(train)
    v1.summary.FileWriterCache.clear()
    return _rates(folder)


def test_a_chief_that_saw_fewer_steps_than_the_summary_interval_still_records_its_rate(
    tmp_path: Path,
) -> None:
    """Three of the chief's runs in which the global step moved 30 (other workers' steps): the
    usual hook needs two triggers 50 steps apart and writes nothing; the rate is written once
    at the end, at the last global step."""
    rates = _train(tmp_path, steps=3, every=50, step_by=10)
    assert len(rates) == 1, rates
    step, rate = rates[0]
    assert step == 30 and rate > 0


def test_a_long_enough_run_records_its_rate_as_tensorflow_does_and_nothing_more(
    tmp_path: Path,
) -> None:
    rates = _train(tmp_path, steps=25, every=10)
    assert [s for s, _ in rates] == [11, 21], rates


def test_the_checkpoint_hook_writes_no_graph_text_and_keeps_the_later_meta_files(
    tmp_path: Path,
) -> None:
    """recipes/replica.py _CheckpointHook: no graph.pbtxt (TensorFlow's hook formats the whole
    GraphDef as text at the start), the graph still in the events for TensorBoard, a .meta beside
    every checkpoint after the first."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        v1.get_variable("w", [3])
        train = v1.assign_add(gs, 1)
        hook = _CheckpointHook(str(tmp_path), save_steps=5)
        with v1.train.MonitoredSession(hooks=[hook]) as sess:
            for _ in range(12):
                sess.run(train)
    v1.summary.FileWriterCache.clear()
    assert not (tmp_path / "graph.pbtxt").exists()
    assert (tmp_path / "model.ckpt-0.index").exists()
    metas = sorted(p.name for p in tmp_path.glob("*.meta"))
    assert metas and "model.ckpt-0.meta" not in metas, metas
    graphs = [
        e
        for path in glob.glob(str(tmp_path / "events.out.tfevents.*"))
        for e in v1.train.summary_iterator(path)
        if e.graph_def
    ]
    assert graphs, "no graph in the events for TensorBoard"


def _wait_for(predicate: Callable[[], bool], what: str, timeout: float = 120.0) -> None:
    """Until ``predicate()`` (an event the hook's thread makes happen), at most ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.01)


def test_the_chiefs_maintenance_runs_on_its_own_clock_while_only_another_worker_trains(
    tmp_path: Path,
) -> None:
    """A row is marked seen at the global step its shard was last told. The chief's thread
    tells the shards and frees rows on a clock of its own, whatever the chief's own steps: here
    the chief runs none (a chief busy with its first checkpoint while another worker trains;
    seen in busy test runs, 2 steps of 241, and then every row looked unseen since step 0 and
    was freed at the end, and none was freed while the table filled). The worker's steps wait
    for one of the thread's checks each (events, not a race): the ids it stopped reading are
    freed while it trains, the ids it reads are not."""
    with tf.Graph().as_default():
        gs = v1.train.get_or_create_global_step()
        settings = DynamicSettings(capacity=8, ttl_steps=10)
        table = DynamicTable("model/t", settings, 2, tf.float32, tf.int64, 1)
        ids = v1.placeholder(tf.int64, [None])
        read = table.lookup(list(table.params("t").values()), ids, training=True)
        step = v1.assign_add(gs, 1)
        due = table.maintenance_due()
        op = tf.stack([table.maintenance(slots={})])
        hook = MaintenanceHook(due, op, ["model/t"], gs, str(tmp_path), poll_secs=0.005)
        with v1.train.MonitoredSession(hooks=[hook]) as session:
            raw = session._tf_sess()  # noqa: SLF001 - the other worker's steps: no chief hook
            for number in range(60):
                checked = hook.checks
                raw.run([read, step], {ids: [11, 22, 33] if number < 20 else [44, 55]})
                _wait_for(lambda c=checked: hook.checks > c + 1, "check of the shards")
        events = [json.loads(line) for line in (tmp_path / EVENTS_FILE).read_text().splitlines()]
        assert sum(e["evicted"] for e in events) == 3, events  # 11, 22 and 33, while training
        assert all(e["step"] < 60 for e in events), events
        assert events[-1]["resident"] == 2, events  # 44 and 55: read until the end, kept


def test_a_new_session_gets_a_new_maintenance_thread_and_end_stops_it(tmp_path: Path) -> None:
    class Session:
        def __init__(self) -> None:
            self.runs = 0

        def run(self, fetches: object) -> object:
            self.runs += 1
            if fetches == "due":
                return np.array([False])
            raise AssertionError("no maintenance is due")

    hook = MaintenanceHook("due", "op", ["model/t"], "step", str(tmp_path), poll_secs=0.001)
    first, second = Session(), Session()
    hook.after_create_session(first, None)
    _wait_for(lambda: first.runs >= 3, "check in the first session")
    hook.after_create_session(second, None)  # a ps came back: the old thread ends
    _wait_for(lambda: second.runs >= 3, "check in the second session")
    ran = first.runs
    hook.end(second)
    after = second.runs
    time.sleep(0.05)
    assert first.runs <= ran + 1 and second.runs == after  # both threads ended


def test_no_checkpoint_is_written_while_a_maintenance_runs_nor_one_runs_while_a_save_does(
    tmp_path: Path,
) -> None:
    """A save reads a shard's variables one by one: an eviction between two reads left the
    final checkpoint's free rows and last-seen steps apart (seen once in a busy run: "a row
    leaked"). The checkpoint hook's listener and the maintenance exclude each other."""
    under_way, finish = threading.Event(), threading.Event()
    maintenances = []

    class Session:
        def run(self, fetches: object) -> object:
            if fetches == "due":
                return np.array([True])
            maintenances.append(time.monotonic())
            under_way.set()
            assert finish.wait(30)
            return [[[0, 1]]], 7  # nothing evicted, one row resident; the step

    hook = MaintenanceHook("due", "op", ["model/t"], "step", str(tmp_path), poll_secs=0.001)
    listener = hook.saving()
    hook.after_create_session(Session(), None)
    assert under_way.wait(30)
    saved = threading.Event()

    def save() -> None:
        listener.before_save(None, 7)
        saved.set()

    saver = threading.Thread(target=save)
    saver.start()
    assert not saved.wait(0.3), "a checkpoint was written while a maintenance ran"
    finish.set()
    assert saved.wait(30)  # the maintenance ended: the save goes on, holding the next one
    held = len(maintenances)
    time.sleep(0.3)
    assert len(maintenances) == held, "a maintenance ran while a checkpoint was written"
    listener.after_save(None, 7)
    _wait_for(lambda: len(maintenances) > held + 1, "a maintenance after the save")
    hook.end(None)
    saver.join(30)
