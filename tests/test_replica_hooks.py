"""The chief's hooks (recipes/replica.py) in a local graph: what a run writes beside its
checkpoints whatever the speed of its workers."""

from __future__ import annotations

import glob
import threading
from pathlib import Path

import tensorflow as tf

from recipes.dynamic_table import ClockHook, DynamicSettings, DynamicTable
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


class _Values:
    def __init__(self, results: object) -> None:
        self.results = results


class _Session:
    """A session whose maintenance frees 5 rows on the one shard, at global step 7, once
    ``release`` is set."""

    def __init__(self) -> None:
        self.runs = 0
        self.release = threading.Event()

    def run(self, fetches: object) -> object:
        self.runs += 1
        self.release.wait(60)
        return [[[5, 90]]], 7


def test_the_chief_checks_the_tables_as_often_as_their_headroom_needs_and_at_most_every_interval(
    tmp_path: Path,
) -> None:
    import numpy as np

    from recipes.dynamic_table import MaintenanceHook, check_interval

    assert [check_interval(t) for t in (1, 40, 200, 10_000)] == [1, 1, 4, 8]
    assert [check_interval(200, w) for w in (2, 4, 5)] == [2, 1, 1]
    hook = MaintenanceHook("due", "op", ["model/t"], "step", str(tmp_path), max_interval=8)
    session = _Session()
    context = type("Context", (), {"session": session})()
    checked: list[int] = []

    def step(number: int, due: int, headroom: int) -> None:
        if hook.before_run(context) is not None:
            checked.append(number)
            hook.after_run(context, _Values(np.array([[0, 10**6], [due, headroom]])))
        else:
            hook.after_run(context, _Values(None))

    # 4 rows taken a step from a headroom of 100 rows: no rate yet at the first check, then
    # every 8 steps (the most) while half the headroom lasts longer, then when half of it is
    # gone, and every step from 16 rows on
    for number in range(25):
        step(number, 0, 100 - 4 * number)
    assert checked == [0, 1, 9, 17, 21, 23, 24], checked
    # over the high watermark: a maintenance on a thread; none more while it runs; recorded
    step(25, 1, -4)
    step(26, 1, -8)
    assert checked[-2:] == [25, 26], checked
    session.release.set()
    hook.end(session)
    assert session.runs == 1
    assert '"evicted": 5' in (tmp_path / "dynamic_tables.jsonl").read_text()
    # rows taken slowly: a check every 8 steps, never fewer
    hook = MaintenanceHook("due", "op", ["model/t"], "step", str(tmp_path), max_interval=8)
    checked.clear()
    for number in range(60):
        step(number, 0, 10_000 - number)
    assert checked == [0, 1, *range(9, 60, 8)], checked


def test_another_workers_steps_keep_the_tables_clock_so_rows_in_use_are_not_freed() -> None:
    """A row is marked seen at the global step its shard was last told. A chief that runs no
    step for a while (its first checkpoint, a slow save) while another worker trains would
    leave that step behind: without the other worker's ClockHook every row it reads looks as
    old as the chief's last check, and the next maintenance frees rows in use (seen in a busy
    run: every row freed at the end, the export empty). With it, none is."""

    def freed(with_clock: bool) -> int:
        with tf.Graph().as_default():
            gs = v1.train.get_or_create_global_step()
            settings = DynamicSettings(capacity=8, ttl_steps=10)
            table = DynamicTable("model/t", settings, 2, tf.float32, tf.int64, 1)
            ids = tf.constant([11, 22, 33], tf.int64)
            read = table.lookup(list(table.params("t").values()), ids, training=True)
            step = v1.assign_add(gs, 1)
            evict = table.maintenance(slots={})
            hooks = [ClockHook(table.clock(), interval=4)] if with_clock else []
            with v1.train.MonitoredSession(hooks=hooks) as worker:
                for _ in range(60):  # the other worker trains; the chief runs nothing
                    worker.run([read, step])
                evicted, _resident = worker.run(evict)[0]
            return int(evicted)

    assert freed(with_clock=False) == 3  # the bug: every row in use freed
    assert freed(with_clock=True) == 0


def test_the_clock_hook_tells_the_shards_once_every_interval_steps() -> None:
    hook = ClockHook(op="tick", interval=3)
    asked = [hook.before_run(None) for _ in range(7)]
    assert [a is not None for a in asked] == [True, False, False, True, False, False, True]
    assert asked[0].fetches == "tick"
