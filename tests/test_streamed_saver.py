"""The streamed saver (recipes/streamed_saver.py) on a real in-process cluster: two ps servers
and a worker over loopback gRPC. A table split over both ps (TensorFlow's partitioner), a
variable larger than a chunk and small ones are saved in chunks of 4 KiB: the checkpoint is
one V2 checkpoint of the usual names (the split table one name in slices) that a plain Saver
and TensorFlow's checkpoint reader (and the scorers' row reader) read with the same values; the save ran one ``SaveV2`` per
chunk on the chief, each chunk's read on its variable's ps; a restore in chunks brings every
value back into uninitialised variables; ``max_to_keep`` and the ``checkpoint`` file are
``Saver``'s own; a checkpoint a plain Saver wrote restores through it; a checkpoint file
missing where a restore reads it is one line naming the host and the file. Graph mode is
process-wide: the case runs in its own interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.full  # an in-process cluster: TensorFlow imported in its own interpreter

ROOT = Path(__file__).resolve().parents[1]

CASE = textwrap.dedent(
    """
    import json, os, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from inprocess_cluster import np, start_cluster, tf, v1
    from recipes.checkpoint_bundle import Bundle
    from recipes.ps_saving import missing_file_line
    from recipes.streamed_saver import chunks, streamed_saver

    out = {out!r}
    spec, addr, servers = start_cluster(ps=2, workers=1)
    worker = servers[-1]
    report = {{}}

    def build():
        g = tf.Graph()
        with g.as_default():
            with v1.device("/job:ps/task:0"):
                gs = v1.train.get_or_create_global_step()
                dense = v1.get_variable("dense", [3, 5], initializer=v1.random_uniform_initializer())
            with v1.device("/job:ps/task:1"):
                big = v1.get_variable("big", [100, 16], initializer=v1.random_uniform_initializer())
            with v1.device(v1.train.replica_device_setter(ps_tasks=2)):
                table = v1.get_variable(
                    "table", [90, 8], initializer=v1.random_uniform_initializer(),
                    partitioner=v1.fixed_size_partitioner(2),
                )
            names = {{"global_step": gs, "dense": dense, "big": big, "table": list(table)}}
            streamed = streamed_saver(names, keep=2, chunk_bytes=4096)
            plain = v1.train.Saver(names, sharded=False)
        return g, names, streamed, plain, [gs, dense, big, table.as_tensor()]

    g, names, streamed, plain, values = build()
    report["chunks"] = [
        [(p.name, p.spec) for p in c.pieces] for c in chunks(names, 4096)
    ]
    report["save_devices"] = sorted({{
        op.device.split("/device")[0] or "(none)" for op in g.get_operations() if op.type == "SaveV2"
    }})
    report["read_devices"] = sorted({{
        op.device.split("/device")[0] for op in g.get_operations()
        if op.type == "StridedSlice" and op.name.startswith("streamed")
    }})
    with g.as_default(), v1.Session(worker.target) as sess:
        sess.run(v1.global_variables_initializer())
        sess.run(names["global_step"].assign(7))
        before = sess.run(values)
        paths = [streamed.save(sess, os.path.join(out, "model.ckpt"), global_step=s) for s in (5, 6, 7)]
        report["paths"] = [os.path.basename(p) for p in paths]
        report["kept"] = sorted(
            f for f in os.listdir(out) if f.endswith(".index") or f == "checkpoint"
        )
        report["temp_left"] = [f for f in os.listdir(out) if "_temp" in f]
        reader = tf.train.load_checkpoint(paths[-1])
        report["keys"] = sorted(reader.get_variable_to_shape_map())
        ids = np.array([99, 0, 63, 64, 63])  # across big's two slices (its two chunks)
        report["bundle_rows"] = bool(np.array_equal(Bundle(paths[-1]).rows("big", ids), before[2][ids]))
        report["read_equal"] = [
            bool(np.array_equal(reader.get_tensor(n), v))
            for n, v in zip(["global_step", "dense", "big", "table"], before)
        ]
    v1.Session.reset(worker.target)  # the ps forget their variables, as restarted ps would
    g, names, streamed, plain, values = build()  # a new chief: every variable uninitialised
    with g.as_default(), v1.Session(worker.target) as sess:
        report["uninitialised"] = len(sess.run(v1.report_uninitialized_variables()))
        streamed.restore(sess, paths[-1])
        report["restored_uninitialised"] = len(sess.run(v1.report_uninitialized_variables()))
        report["restored_equal"] = [bool(np.array_equal(a, b)) for a, b in zip(sess.run(values), before)]
        sess.run(v1.global_variables_initializer())
        plain.restore(sess, paths[-1])  # a plain Saver reads what the streamed one wrote
        report["plain_equal"] = [bool(np.array_equal(a, b)) for a, b in zip(sess.run(values), before)]
        sess.run(v1.global_variables_initializer())
        other = plain.save(sess, os.path.join(out, "plain.ckpt"))
        expected = sess.run(values)
        sess.run(v1.global_variables_initializer())
        streamed.restore(sess, other)  # and the other way round
        report["from_plain_equal"] = [bool(np.array_equal(a, b)) for a, b in zip(sess.run(values), expected)]
        # a file missing where the restore reads it: one line naming the host and the file
        sharded = v1.train.Saver(names, sharded=True)
        for kind, saver in (("sharded", sharded), ("streamed", streamed)):
            path = saver.save(sess, os.path.join(out, kind + ".ckpt"))
            data = sorted(f for f in os.listdir(out) if f.startswith(kind + ".ckpt.data-"))
            os.remove(os.path.join(out, data[-1]))
            try:
                saver.restore(sess, path)
            except tf.errors.NotFoundError as e:
                report[kind] = missing_file_line(
                    e, {{"ps": ["10.0.0.11:2222", "10.0.0.12:2222"]}}, "10.0.0.13:2222", out
                )
    print(json.dumps(report))
    """
)


def test_the_streamed_saver_writes_and_reads_the_usual_checkpoint_chunk_by_chunk(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            CASE.format(root=str(ROOT), tests=str(ROOT / "tests"), out=str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    chunks = report["chunks"]
    # big (100 x 16 float32, 6,400 B) in two chunks of 64 rows and 36 as slices of its name;
    # the table's two parts (45 x 8, 1,440 B each) slices of "table"; the small ones packed
    assert [["big", "100 16 0,64:0,16"]] in chunks and [["big", "100 16 64,36:0,16"]] in chunks
    flat = [piece for chunk in chunks for piece in chunk]
    assert ["table", "90 8 0,45:0,8"] in flat and ["table", "90 8 45,45:0,8"] in flat
    assert ["global_step", ""] in flat and ["dense", ""] in flat
    assert len(chunks) == 3  # the small ones share a SaveV2
    # every SaveV2 on the chief (no device: the session's own task), every row read on a ps
    assert report["save_devices"] == ["(none)"], report["save_devices"]
    assert report["read_devices"] == ["/job:ps/task:1"], report["read_devices"]
    # Saver's bookkeeping: the path it returns, max_to_keep=2, the checkpoint file; no part left
    assert report["paths"] == ["model.ckpt-5", "model.ckpt-6", "model.ckpt-7"]
    assert report["kept"] == ["checkpoint", "model.ckpt-6.index", "model.ckpt-7.index"]
    assert report["temp_left"] == []
    assert report["keys"] == ["big", "dense", "global_step", "table"]
    assert report["read_equal"] == [True] * 4
    assert report["bundle_rows"]  # the scorers' row reader (recipes/checkpoint_bundle.py) too
    # the restore: every variable of a new graph was uninitialised, none is after, same values
    assert report["uninitialised"] > 0 and report["restored_uninitialised"] == 0
    assert report["restored_equal"] == [True] * 4
    assert report["plain_equal"] == [True] * 4
    assert report["from_plain_equal"] == [True] * 4
    # the sharded save put big's part on ps/1 (its variables' device): read back there
    assert report["sharded"] == (
        f"checkpoint file {out}/sharded.ckpt.data-00001-of-00002 is missing on ps/1's host "
        f"10.0.0.12, which reads its own part of the checkpoint there: make {out} the same "
        "shared folder on every host again (each ps wrote its part into it), or start a new "
        "experiment.id"
    ), report["sharded"]
    assert report["streamed"].startswith(
        f"checkpoint file {out}/streamed.ckpt.data-00002-of-00003 is missing on the chief's host "
        "10.0.0.13, where the checkpoints of hosts without a shared folder are kept"
    ), report["streamed"]
