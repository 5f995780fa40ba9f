"""Snapshots of only the changed rows (recipes/snapshot_deltas.py) on a real in-process cluster:
two ps servers and a worker over loopback gRPC, a table on ps/1 and small variables on ps/0.
The first snapshot of a ps is a full one; the next ones of a ps with a table write only the rows
that changed (own host and copy), the rest whole; a restore reads the base and every delta in
order and equals the live values exactly, also while another thread kept writing rows during
the snapshots; a corrupted delta falls back to the copy's chain; a new chief finds the chain; a
chain ends (a full snapshot into the other slot, whose old deltas are emptied) after a restore,
and a delta that would take its chain past a quarter of the base is a full snapshot instead. Graph mode is process-wide: the case runs
in its own interpreter.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from snapshot_case import run_snapshot_case

pytestmark = pytest.mark.full  # an in-process cluster: TensorFlow imported in its own interpreter

CASE = textwrap.dedent(
    """
    import json, os, sys, threading
    sys.path[:0] = [{root!r}, {tests!r}]
    from inprocess_cluster import np, start_cluster, tf, v1
    from recipes.ps_snapshots import PsSnapshots, SnapshotFolder

    folder, out = {folder!r}, {out!r}
    ROWS, WIDTH = 2000, 16
    spec, addr, servers = start_cluster(ps=2, workers=1)
    worker = servers[-1]
    for k in range(2):
        SnapshotFolder(folder, out, k).prepare()
    logs, report = [], {{}}

    g = tf.Graph()
    with g.as_default():
        with v1.device("/job:ps/task:0"):
            gs = v1.train.get_or_create_global_step()
            dense = v1.get_variable("dense", [4], initializer=v1.zeros_initializer())
        with v1.device("/job:ps/task:1"):
            table = v1.get_variable("table", [ROWS, WIDTH], initializer=v1.zeros_initializer())
            # a vector: fingerprinted in blocks of 64 elements, its tail (3000 % 64) always
            vec = v1.get_variable("vec", [3000], tf.int64, initializer=v1.zeros_initializer())
        names = {{"global_step": gs, "dense": dense, "table": table, "vec": vec}}
        # a table from 1 KiB on, so that this small one is snapshotted by its changed rows
        snaps = PsSnapshots(names, gs, 2, folder, out, table_bytes=1024, addresses=addr[:2])
        ids = v1.placeholder(tf.int64, [None])
        value = v1.placeholder(tf.float32, [])
        touch = tf.group(
            v1.scatter_update(table, ids, tf.fill([tf.size(ids), WIDTH], value)),
            v1.scatter_update(vec, ids + 999, tf.cast(tf.fill([tf.size(ids)], value), tf.int64)),
        )
        bump = tf.group(gs.assign_add(1), dense.assign_add(tf.ones([4])))
        wipe = tf.group(
            table.assign(tf.fill([ROWS, WIDTH], -1.0)),
            dense.assign(tf.fill([4], -1.0)),
            vec.assign(tf.fill([3000], tf.constant(-1, tf.int64))),
        )

    def files(pattern):
        import glob
        return sorted(glob.glob(os.path.join(folder, "tfplan-snapshots-*", pattern)))

    def live(sess):
        t, d, v, s = sess.run([table, dense, vec, gs])
        return t.copy(), d.copy(), v.copy(), int(s)

    with g.as_default(), v1.Session(worker.target) as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(touch, {{ids: np.arange(ROWS), value: 1.0}})
        snaps.take(sess)  # the first: full
        report["first"] = [snaps.last(1).deltas, snaps.last(1).prefix]
        sess.run(touch, {{ids: [3, 500, 1999], value: 2.0}})
        sess.run(bump)
        snaps.take(sess)  # a delta of three rows
        report["second"] = [snaps.last(1).deltas, snaps.last(1).prefix, snaps.last(0).deltas]
        report["delta_files"] = [os.path.basename(f) for f in files("ps1/a/*-delta*")]
        report["copy_delta_files"] = [os.path.basename(f) for f in files("ps0/a/copy-of-ps1-delta*")]
        base = os.path.getsize(files("ps1/a/snapshot.data*")[0])
        delta = os.path.getsize(files("ps1/a/snapshot-delta1.data*")[0])
        report["sizes"] = [base, delta]
        # rows written while the snapshots run: every one is in the chain by the last snapshot
        stop = threading.Event()
        def writer():
            rng, n = np.random.default_rng(0), 3.0
            while not stop.is_set():
                # the first 50 rows only: no delta of them passes its chain's room
                sess.run(touch, {{ids: rng.integers(0, 50, 20), value: n}})
                n += 1.0
        thread = threading.Thread(target=writer)
        thread.start()
        for _ in range(3):
            snaps.take(sess)
        stop.set()
        thread.join()
        snaps.take(sess)  # after the last write
        expected = live(sess)
        report["chain"] = [snaps.last(1).deltas, snaps.last(0).deltas]
        sess.run(wipe)  # ps/1 "came back" holding garbage (and ps/0's dense)
        report["restored"] = snaps.restore(sess, 1, None, logs.append)
        report["restored_0"] = snaps.restore(sess, 0, None, logs.append)
        got = live(sess)
        report["equal"] = [bool(np.array_equal(a, b)) for a, b in zip(got[:3], expected[:3])]
        # a restore ends the chain: the next snapshot is a full one, into the other slot
        snaps.take(sess)
        report["after_restore"] = [snaps.last(1).deltas, snaps.last(1).prefix]
        sess.run(touch, {{ids: [7], value: 50.0}})
        snaps.take(sess)  # a delta in slot b
        expected = live(sess)
        # its own delta corrupted: the copy's chain on ps/0's host
        with open(files("ps1/b/snapshot-delta1.data*")[0], "r+b") as f:
            f.write(b"garbage!")
        sess.run(wipe)
        report["from_copy"] = snaps.restore(sess, 1, None, logs.append)
        report["equal_copy"] = [
            bool(np.array_equal(a, b)) for a, b in zip(sess.run([table, vec]), expected[::2])
        ]
        # a chain holds at most a quarter of its base: 150 rows changed (and their elements of
        # the vector), twice, fits; a third time it would not: that snapshot is a full one
        snaps.take(sess)  # full (the restore ended the chain), slot a: its old deltas emptied
        report["slot_a_deltas_emptied"] = [
            os.path.getsize(f) for f in files("ps1/a/snapshot-delta*")
        ]
        for lo in (0, 150):
            sess.run(touch, {{ids: np.arange(lo, lo + 150), value: 60.0 + lo}})
            snaps.take(sess)
        report["grown"] = [snaps.last(1).deltas, snaps.last(1).prefix]
        sess.run(touch, {{ids: np.arange(300, 450), value: 62.0}})
        snaps.take(sess)  # would pass a quarter of the base: full, into slot b
        report["rebased"] = [snaps.last(1).deltas, snaps.last(1).prefix]

        sess.run(touch, {{ids: [11, 12], value: 70.0}})
        snaps.take(sess)
        expected = live(sess)
        report["summary"] = snaps.summary()
        # a new chief finds the chain an earlier one left, and restores it
        fresh = PsSnapshots(names, gs, 2, folder, out, table_bytes=1024, addresses=addr[:2])
        found = fresh.found(sess, [0, 1])
        report["found"] = {{k: [s.step, s.deltas] for k, s in found.items()}}
        sess.run(wipe)
        for k in (0, 1):
            fresh.restore(sess, k, None, logs.append, found[k])
        got = live(sess)
        report["equal_found"] = [bool(np.array_equal(a, b)) for a, b in zip(got[:3], expected[:3])]
    report["logs"] = logs
    print("REPORT " + json.dumps(report))
    """
)


def test_a_ps_with_a_table_snapshots_its_changed_rows_and_restores_them_exactly(
    tmp_path: Path,
) -> None:
    r = run_snapshot_case(CASE, tmp_path)
    # the first snapshot is a full one; the second of ps/1 a delta beside it in slot a, on its
    # own host and as the copy on ps/0's; ps/0 (no table) gets full ones, slot after slot
    assert r["first"][0] == 0 and r["first"][1].endswith("/ps1/a/snapshot"), r["first"]
    assert r["second"][:2] == [1, r["first"][1]] and r["second"][2] == 0, r["second"]
    assert r["delta_files"] == ["snapshot-delta1.data-00000-of-00001", "snapshot-delta1.index"]
    assert r["copy_delta_files"] == [
        "copy-of-ps1-delta1.data-00000-of-00001",
        "copy-of-ps1-delta1.index",
    ]
    # three rows of 16 floats and their ids, and three blocks of the vector and its tail,
    # against 2,000 rows and 3,000 elements
    base, delta = r["sizes"]
    assert delta < 5000 < 2000 * 16 * 4 + 3000 * 8 <= base, r["sizes"]
    # rows written while the snapshots ran: the chain restored equals the live values
    assert r["chain"] == [5, 0], r["chain"]
    assert r["restored"].startswith("snapshot of step 1 ("), r["restored"]
    assert r["equal"] == [True, True, True], r
    # a restore ends the chain: a full one into the other slot
    assert r["after_restore"][0] == 0 and r["after_restore"][1].endswith("/ps1/b/snapshot")
    # a corrupted delta: the copy's chain, equal to the live values
    assert r["from_copy"].endswith(", the copy on ps/0's host 127.0.0.1"), r["from_copy"]
    assert r["equal_copy"] == [True, True], r
    said = [m for m in r["logs"] if "cannot be read" in m]
    assert len(said) == 1 and said[0].startswith("ps/1: its snapshot cannot be read ("), said
    assert said[0].endswith("); trying its copy"), said
    # a full snapshot into slot a empties the deltas of the chain that was there
    assert r["slot_a_deltas_emptied"] and set(r["slot_a_deltas_emptied"]) == {0}, r
    # two deltas of 150 rows fit a chain's quarter; a third is a full one, into slot b
    assert r["grown"][0] == 2 and r["grown"][1].endswith("/ps1/a/snapshot"), r["grown"]
    assert r["rebased"][0] == 0 and r["rebased"][1].endswith("/ps1/b/snapshot"), r["rebased"]
    summary = r["summary"]
    assert summary["taken"] == 13 and summary["deltas"] == 9, summary
    # a new chief finds the chain (a full one and a delta) and restores it exactly
    assert r["found"]["1"][1] == 1 and r["found"]["0"][1] == 0, r["found"]
    assert r["found"]["0"][0] == r["found"]["1"][0]
    assert r["equal_found"] == [True, True, True], r
