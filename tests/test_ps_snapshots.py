"""In-memory snapshots (recipes/ps_snapshots.py) on a real in-process cluster: two ps servers and
a worker over loopback gRPC. Each ps's snapshot is written by an op on that ps into its own
folder, and its copy by an op on the other ps into that one's; one ps is restored alone from
it (the other keeps its live values), from the copy when its own files are corrupted; a
snapshot older than the last checkpoint, one corrupted in both places and one of another shape
are not used (the checkpoint is, in one line); a new chief finds the newest snapshot every ps
has whole (a half-written one is not), from the copy when a ps's own files are gone; a folder
that cannot be written is said once. Graph mode is process-wide: the case runs in its own
interpreter.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from snapshot_case import run_snapshot_case

pytestmark = pytest.mark.full  # an in-process cluster: TensorFlow imported in its own interpreter

CASE = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from inprocess_cluster import start_cluster, tf, v1
    from recipes.ps_snapshots import PsSnapshots, SnapshotFolder, SnapshotHook

    folder, out = {folder!r}, {out!r}
    spec, addr, servers = start_cluster(ps=2, workers=1)
    worker = servers[-1]
    for k in range(2):
        SnapshotFolder(folder, out, k).prepare()
    logs, report = [], {{}}

    def build(width):
        g = tf.Graph()
        with g.as_default():
            with v1.device("/job:ps/task:0"):
                gs = v1.train.get_or_create_global_step()
                a = v1.get_variable("a", [4], initializer=v1.zeros_initializer())
            with v1.device("/job:ps/task:1"):
                b = v1.get_variable("b", [width], initializer=v1.zeros_initializer())
            names = {{"global_step": gs, "a": a, "b": b}}
            snaps = PsSnapshots(names, gs, 2, folder, out)
            saver = v1.train.Saver(names)
            value = v1.placeholder(tf.float32, [])
            step = v1.placeholder(tf.int64, [])
            set_all = tf.group(
                a.assign(tf.fill([4], value)), b.assign(tf.fill([width], value)), gs.assign(step)
            )
            set_b = b.assign(tf.fill([width], value))
        return g, snaps, saver, (a, b), lambda s, v, n: s.run(set_all, {{value: v, step: n}}), (
            lambda s, v: s.run(set_b, {{value: v}})
        )

    g, snaps, saver, (a, b), set_all, set_b = build(3)
    with g.as_default(), v1.Session(worker.target) as sess:
        sess.run(v1.global_variables_initializer())
        set_all(sess, 1.0, 10)
        ckpt10 = saver.save(sess, os.path.join(out, "model.ckpt"), global_step=10)
        set_all(sess, 2.0, 20)
        report["taken"] = snaps.take(sess)[0]
        report["save_devices"] = sorted(
            (op.name.split("/")[0], op.device.split("/device")[0])
            for op in g.get_operations() if op.type == "SaveV2" and "snapshot" in op.name
        )
        report["files"] = sorted(
            os.path.relpath(os.path.join(d, f), folder)
            for d, _, fs in os.walk(folder) for f in fs
        )
        set_all(sess, 3.0, 30)
        snaps.seen = 33
        set_b(sess, -1.0)  # ps/1 "came back" holding garbage

        class Resent:  # the ps refuses a request gRPC re-sent (seen under load): not bad files
            def __init__(self, sess):
                self.sess, self.refused = sess, False

            def run(self, *args, **kwargs):
                if not self.refused:
                    self.refused = True
                    raise tf.errors.AbortedError(
                        None, None, "The same RunGraph (Worker) request was received twice"
                    )
                return self.sess.run(*args, **kwargs)

        try:
            snaps.restore(Resent(sess), 1, ckpt10, logs.append)
            report["resent"] = "not raised"
        except tf.errors.AbortedError:
            report["resent"] = "raised"
        report["resent_logs"] = list(logs)
        report["from_snapshot"] = snaps.restore(sess, 1, ckpt10, logs.append)
        report["after_snapshot"] = sess.run([a, b]).__repr__()
        set_all(sess, 3.0, 30)
        ckpt30 = saver.save(sess, os.path.join(out, "model.ckpt"), global_step=30)
        set_b(sess, -1.0)
        report["older_than_checkpoint"] = snaps.restore(sess, 1, ckpt30, logs.append)
        report["after_checkpoint"] = sess.run(b).tolist()
        set_all(sess, 4.0, 40)
        snaps.take(sess)
        data = snaps.last(1).prefix + ".data-00000-of-00001"
        with open(data, "r+b") as f:
            f.write(b"garbage!")
        set_b(sess, -1.0)
        report["corrupted"] = snaps.restore(sess, 1, ckpt30, logs.append)  # its copy is good
        report["after_corrupted"] = sess.run(b).tolist()
        with open(snaps.last(1).places[1][1] + ".data-00000-of-00001", "r+b") as f:
            f.write(b"garbage!")
        set_b(sess, -1.0)
        report["both_corrupted"] = snaps.restore(sess, 1, ckpt30, logs.append)
        report["after_both_corrupted"] = sess.run(b).tolist()
        report["recoveries"] = list(snaps.recoveries)
        set_all(sess, 5.0, 50)
        snaps.take(sess)  # a good snapshot of b of width 3, at step 50 (slot a)
        last = snaps.last(1)
        set_all(sess, 6.0, 60)
        snaps.take(sess)  # step 60 (slot b) ...
        for _, prefix in snaps.last(0).places:  # ... whose ps/0 and its copy are being written
            with open(prefix + ".meta", "w") as f:  # again: no whole snapshot of step 60
                f.write("")
        # a new chief, which took none of them: it finds what the earlier one left
        fresh = PsSnapshots({{"global_step": v1.train.get_global_step(), "a": a, "b": b}},
                            v1.train.get_global_step(), 2, folder, out,
                            addresses=addr[:2])
    with g.as_default(), v1.Session(worker.target) as sess:
        found = fresh.found(sess, [0, 1])
        report["found"] = {{k: [s.step, [h for h, _ in s.places]] for k, s in found.items()}}
        report["found_1"] = fresh.found(sess, [1])[1].step  # ps/1 alone: its newest
        # ps/1's host is gone: its own files with it; its copy on ps/0's host is read
        import shutil
        shutil.rmtree(SnapshotFolder(folder, out, 1).path)
        found = fresh.found(sess, [0, 1])
        report["found_without_host"] = {{
            k: [s.step, [h for h, _ in s.places]] for k, s in found.items()
        }}
        set_all(sess, -1.0, 0)
        for k in (0, 1):
            fresh.restore(sess, k, ckpt30, logs.append, found[k])
        report["after_found"] = sess.run([a, b, v1.train.get_global_step()]).__repr__()
        report["fresh_recoveries"] = list(fresh.recoveries)
    g2, snaps2, _, (_, b2), set_all2, set_b2 = build(5)  # the model changed shape
    os.makedirs(SnapshotFolder(folder, out, 1).path + "/a", exist_ok=True)
    with g2.as_default(), v1.Session(worker.target) as sess:
        sess.run(v1.global_variables_initializer())
        snaps2._last[1] = last  # as if this chief had taken it
        report["other_shape"] = snaps2.restore(sess, 1, None, logs.append)
        report["after_other_shape"] = sess.run(b2).tolist()
        os.rename(os.path.join(SnapshotFolder(folder, out, 0).path, "a"), folder + "/moved")
        with open(os.path.join(SnapshotFolder(folder, out, 0).path, "a"), "w") as f:
            f.write("a file where the folder was")
        hook = SnapshotHook(snaps2, 1.0, logs.append)
        hook._take(sess)
        hook._take(sess)
        report["hook_taken"] = hook.taken
    report["logs"] = logs
    print("REPORT " + json.dumps(report))
    """
)


def test_each_ps_snapshots_on_itself_and_one_ps_is_restored_alone(tmp_path: Path) -> None:
    folder = tmp_path / "shm"  # the case's snapshot folder
    r = run_snapshot_case(CASE, tmp_path)
    assert r["taken"] == 20
    # each ps's save op runs on that ps, and writes into that ps's own folder; the copy of each
    # ps's runs on the other ps (its host), and writes there
    assert r["save_devices"] == [
        ["snapshot_ps0", "/job:ps/task:0"],
        ["snapshot_ps0_on_ps1", "/job:ps/task:1"],
        ["snapshot_ps1", "/job:ps/task:1"],
        ["snapshot_ps1_on_ps0", "/job:ps/task:0"],
    ]
    jobs = [p.name for p in folder.glob("tfplan-snapshots-*")]
    assert len(jobs) == 1, jobs
    job = jobs[0]
    for k in (0, 1):
        for name in ("snapshot", f"copy-of-ps{1 - k}"):
            for suffix in (".index", ".meta"):
                assert f"{job}/ps{k}/a/{name}{suffix}" in r["files"], r["files"]
    logs = r["logs"]
    # a refused re-sent request while the snapshot is read is raised for the session's creation
    # to retry: not taken for unreadable files (which fell back to the older checkpoint)
    assert r["resent"] == "raised" and r["resent_logs"] == [], (r["resent"], r["resent_logs"])
    # ps/1 alone from its snapshot (step 20 >= the checkpoint's 10); ps/0 keeps its live 3.0
    assert r["from_snapshot"].startswith("snapshot of step 20 (")
    assert (
        r["after_snapshot"]
        == "[array([3., 3., 3., 3.], dtype=float32), array([2., 2., 2.], dtype=float32)]"
    )
    assert logs[0].startswith("ps/1 restored from its snapshot of step 20 (")
    assert logs[0].endswith(
        ": 13 steps lost (the chief saw step 33); the last checkpoint was at step 10"
    )
    # a snapshot older than the checkpoint is not used
    assert r["older_than_checkpoint"] == "checkpoint of step 30"
    assert r["after_checkpoint"] == [3.0, 3.0, 3.0]
    assert logs[1] == "ps/1 restored from its checkpoint of step 30"
    # its own files corrupted: one line, then the copy on ps/0's host
    assert (
        r["corrupted"].endswith(", the copy on ps/0's host") and r["after_corrupted"] == [4.0] * 3
    )
    assert logs[2].startswith("ps/1: its snapshot cannot be read (") and logs[2].endswith(
        "); trying its copy"
    ), logs[2]
    assert "DataLoss" in logs[2] or "checksum" in logs[2].lower(), logs[2]
    assert logs[3].startswith("ps/1 restored from its snapshot of step 40 (")
    assert ", the copy on ps/0's host: 0 steps lost" in logs[3], logs[3]
    # both corrupted: the checkpoint
    assert r["both_corrupted"] == "checkpoint of step 30"
    assert r["after_both_corrupted"] == [3.0, 3.0, 3.0]
    assert logs[5].startswith("ps/1: the copy of its snapshot on ps/0's host cannot be read (")
    assert logs[5].endswith("); using the checkpoint") and logs[6] == logs[1], logs[5:7]
    # a new chief finds what the earlier one left: the newest snapshot every ps has whole (step
    # 60's ps/0 was being written, own and copy), own files first, then the copy
    assert r["found"] == {"0": [50, [0, 1]], "1": [50, [1, 0]]}
    assert r["found_1"] == 60  # ps/1 alone: its newest
    # ps/1's host gone: ps/0 from its own, ps/1 from the copy on ps/0's host
    assert r["found_without_host"] == {"0": [50, [0]], "1": [50, [0]]}
    assert r["after_found"] == (
        "[array([5., 5., 5., 5.], dtype=float32), array([5., 5., 5.], dtype=float32), np.int64(50)]"
    )
    assert logs[7].startswith("ps/0 restored from its snapshot of step 50 (")
    assert logs[8].startswith("ps/1 restored from its snapshot of step 50 (")
    assert logs[8].endswith(
        "), the copy on ps/0's host 127.0.0.1; the last checkpoint was at step 30"
    )
    assert all(isinstance(x.pop("at"), float) for x in r["fresh_recoveries"])
    assert r["fresh_recoveries"] == [
        {"ps": 0, "source": "snapshot", "step": 50, "lost_steps": None},
        {"ps": 1, "source": "snapshot", "step": 50, "lost_steps": None, "copy_on": "127.0.0.1"},
    ]
    # a snapshot of another shape is never loaded (here no checkpoint: the initial values); its
    # own files gone with its host, the copy has the other shape too
    assert r["after_other_shape"] == [0.0] * 5, r["after_other_shape"]
    assert r["other_shape"] == "initial values"
    assert logs[9].startswith("ps/1: its snapshot cannot be read (NotFoundError") and logs[
        9
    ].endswith("trying its copy"), logs[9]
    assert logs[10] == (
        "ps/1: the copy of its snapshot on ps/0's host cannot be read (InvalidArgumentError: "
        "another shape: b: [3] not [5]); using the checkpoint"
    ), logs[10]
    # a folder that cannot be written: said once, whatever the number of tries
    said = [m for m in logs if m.startswith("snapshots: ")]
    assert len(said) == 1 and "a restarted ps comes back from the last checkpoint" in said[0], logs
    assert r["hook_taken"] == 0
    # what result.json's ps_recoveries says of each restore (and when: the chief's clock)
    assert all(isinstance(x.pop("at"), float) for x in r["recoveries"]), r["recoveries"]
    assert r["recoveries"] == [
        {"ps": 1, "source": "snapshot", "step": 20, "lost_steps": 13},
        {"ps": 1, "source": "checkpoint", "step": 30, "lost_steps": 3},
        {"ps": 1, "source": "snapshot", "step": 40, "lost_steps": 0, "copy_on": "ps/0's host"},
        {"ps": 1, "source": "checkpoint", "step": 30, "lost_steps": 3},
    ]
