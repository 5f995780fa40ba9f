"""A TFRecord set 4x larger than the memory the cluster may use trains to the end (streaming).

    sudo .venv/bin/python bench/bench_streaming.py [--limit-mib 1024] [--ratio 4] [--out docs/bench_streaming.md]

Writes ``ratio * limit`` bytes of tf.Example records (8 shards; each example 1,024 float32 values
and an integer label), then runs ``tfplan apply`` of hogwild (1 ps + 1 worker, the built-in MLP,
``data=tfrecord``) for one pass over the data inside a memory cgroup (cgroup v1
``memory.limit_in_bytes``, or v2 ``memory.max``) that holds tfplan and every task it starts: the
whole cluster may use ``limit`` bytes, page cache included (about 0.75 GiB is the processes
themselves: tfplan, the ps and the worker with TensorFlow loaded; at 1 GiB the kernel evicts
TensorFlow's own code pages and the run crawls on major faults, so the default is 1.5 GiB). Reports the data size, the limit, the
cgroup's peak usage, whether the kernel killed anything (``memory.failcnt`` / ``oom_kill``) and
the training's result. Needs root (cgroups). ``--limit-mib 900 --ratio 1`` is a quick run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_FLOATS = 1024
SHARDS = 8

WRITE = r"""
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import numpy as np, tensorflow as tf
out, n, shards, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
mine = [int(k) for k in sys.argv[5].split(",")]
protos = np.random.RandomState(0).uniform(size=(10, width)).astype(np.float32)
for k in mine:
    rng = np.random.RandomState(k + 1)
    with tf.io.TFRecordWriter(os.path.join(out, f"train-{k:03d}.tfrecord")) as w:
        for i in range(k, n, shards):
            label = i % 10
            x = protos[label] + rng.normal(scale=0.3, size=width).astype(np.float32)
            f = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                 "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label]))}
            w.write(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
"""


class MemoryCgroup:
    """A memory cgroup of our own (v1 or v2), removed at the end."""

    def __init__(self, limit: int) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers")
        if v2.is_file() and "memory" in v2.read_text():
            self.path, self.v2 = Path(f"/sys/fs/cgroup/tfplan-bench-{os.getpid()}"), True
        else:
            self.path, self.v2 = Path(f"/sys/fs/cgroup/memory/tfplan-bench-{os.getpid()}"), False
        self.path.mkdir()
        limit_file = "memory.max" if self.v2 else "memory.limit_in_bytes"
        (self.path / limit_file).write_text(str(limit))

    def enter(self) -> None:
        """Put the calling process (and so what it starts from now on) in the cgroup."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak(self) -> int:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text())
        except OSError:
            return -1

    def oom_kills(self) -> int:
        if self.v2:
            events = dict(
                line.split() for line in (self.path / "memory.events").read_text().splitlines()
            )
            return int(events.get("oom_kill", 0))
        control = (self.path / "memory.oom_control").read_text()
        for line in control.splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        parent = self.path.parent / "cgroup.procs"
        for pid in (self.path / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                pass
        self.path.rmdir()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit-mib", type=int, default=1536)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--out", default=str(REPO / "docs" / "bench_streaming.md"))
    args = parser.parse_args()
    limit = args.limit_mib * 2**20
    record_bytes = EXAMPLE_FLOATS * 4 + 60  # the floats and the Example's framing
    n = int(args.ratio * limit / record_bytes) + 1
    with tempfile.TemporaryDirectory(prefix="bench-streaming-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        t0 = time.monotonic()
        writers = [  # one writer per core, each its own shards
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITE,
                    str(data),
                    str(n),
                    str(SHARDS),
                    str(EXAMPLE_FLOATS),
                    ",".join(str(k) for k in range(w, SHARDS, os.cpu_count() or 1)),
                ]
            )
            for w in range(min(SHARDS, os.cpu_count() or 1))
        ]
        if any(p.wait(timeout=3600) != 0 for p in writers):
            raise RuntimeError("writing the data failed")
        size = sum(f.stat().st_size for f in data.iterdir())
        print(f"wrote {size / 2**30:.2f} GiB in {time.monotonic() - t0:.0f}s", flush=True)
        # drop this machine's cached copy of the files: the run reads them from disk
        subprocess.run(["sync"], check=False)
        Path("/proc/sys/vm/drop_caches").write_text("1")
        batch = 100
        steps = n // batch  # one pass over the data (one worker)
        group = MemoryCgroup(limit)
        try:
            pid = os.fork()
            if pid == 0:  # the child joins the cgroup, then becomes tfplan apply
                group.enter()
                os.chdir(tmp)
                os.environ["TFPLAN_CONF"] = str(REPO / "conf")
                os.execv(
                    sys.executable,
                    [
                        sys.executable,
                        "-m",
                        "tfplan",
                        "apply",
                        "--auto-approve",
                        "experiment.id=stream",
                        "cluster.workers=1",
                        "lifecycle.ps_standby=false",  # a second ps process would share the limit
                        f"cluster.workdir={tmp}/work",
                        f"cluster.output_dir={tmp}/out",
                        "algo=hogwild",
                        "data=tfrecord",
                        "data.train=data/train-*.tfrecord",
                        f"data.batch_size={batch}",
                        "data.shuffle_buffer=2000",
                        "data.eval_examples=2000",
                        f"trainer.max_steps={steps}",
                        f"trainer.checkpoint_steps={steps}",
                        "trainer.log_steps=1000",
                    ],
                )
            started = time.monotonic()
            _, status = os.waitpid(pid, 0)
            wall = time.monotonic() - started
            peak, kills = group.peak(), group.oom_kills()
        finally:
            group.remove()
        code = os.waitstatus_to_exitcode(status)
        result_path = Path(tmp) / "out" / "result.json"
        result = json.loads(result_path.read_text()) if result_path.exists() else {}
    ok = code == 0 and kills == 0 and result.get("global_step", 0) >= steps
    lines = [
        "# Benchmark: streaming a data set larger than the tasks' memory",
        "",
        f"`sudo .venv/bin/python bench/bench_streaming.py --limit-mib {args.limit_mib} --ratio "
        f"{args.ratio:g}` on {platform.node()} ({os.cpu_count()} cores), "
        f"{time.strftime('%Y-%m-%d')}. hogwild, 1 ps + 1 worker, the built-in MLP "
        f"({EXAMPLE_FLOATS} inputs), `data=tfrecord` over {SHARDS} shards, one pass, batch "
        f"{batch}; tfplan and every task in one memory cgroup (page cache included).",
        "",
        "| measure | value |",
        "|---|---|",
        f"| data (TFRecord files) | {size / 2**30:.2f} GiB ({n:,} examples) |",
        f"| memory limit of the whole cluster | {limit / 2**30:.2f} GiB |",
        f"| data / limit | {size / limit:.1f}x |",
        f"| peak memory use of the cgroup | {peak / 2**30:.2f} GiB |",
        f"| processes killed by the OOM killer | {kills} |",
        f"| apply exit status | {code} |",
        f"| global step reached / planned | {result.get('global_step', 0)} / {steps} |",
        f"| examples/s | {result.get('examples_per_sec', 0):,.0f} |",
        f"| apply, start to end | {wall:.0f} s |",
        f"| trained to the end under the limit | {'yes' if ok else 'NO'} |",
    ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
