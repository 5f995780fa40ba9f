"""The Spark test bed itself works: every worker ALIVE in its own namespace, an application
submitted from the root namespace runs a task on each worker and leaves nothing running there,
and a killed worker is seen dead, then alive again once restarted. Real Spark standalone
master and workers (tests/spark_testbed.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from spark_testbed import SparkTestbed

pytestmark = [pytest.mark.spark, pytest.mark.netns, pytest.mark.full]

# One barrier stage of one task per worker: with spark.task.cpus equal to an executor's cores,
# each executor has one slot, so the stage's tasks run at once on three different executors.
# Each task reports where it ran, from the kernel, not from Spark: the address its packets to
# the driver leave from, and its network namespace.
APP = """
import json, os, socket, sys
from pyspark import BarrierTaskContext, SparkContext

driver_host, n = sys.argv[1], int(sys.argv[2])

def where(_):
    ctx = BarrierTaskContext.get()
    ctx.barrier()  # every task reaches the driver's barrier coordinator
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((driver_host, 9))
        address = s.getsockname()[0]
    yield {"partition": ctx.partitionId(), "address": address,
           "netns": os.stat("/proc/self/ns/net").st_ino}

sc = SparkContext(appName="tfplan-spark-testbed")
rows = sc.parallelize(range(n), n).barrier().mapPartitions(where).collect()
print("APP_ID " + sc.applicationId, flush=True)
print("ROWS " + json.dumps(rows), flush=True)
sc.stop()
"""


def _wait(condition: Callable[[], bool], what: Callable[[], str], timeout: float = 60) -> None:
    """Poll ``condition`` until it holds; past ``timeout`` s, fail saying ``what()``."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what()} after {timeout:.0f}s"
        time.sleep(0.2)


def test_every_worker_alive_with_the_cores_asked(spark_cluster: SparkTestbed) -> None:
    bed = spark_cluster
    state = bed.master_state()
    alive = {w["host"]: w for w in state["workers"] if w["state"] == "ALIVE"}
    assert sorted(alive) == sorted(bed.worker_addresses)
    assert {w["cores"] for w in alive.values()} == {bed.cores}
    assert state["aliveworkers"] == bed.workers
    assert state["cores"] == bed.workers * bed.cores and state["coresused"] == 0
    assert len(bed.namespaces) == bed.workers
    assert all(bed.processes_on_worker(i) == [] for i in range(bed.workers))


def test_an_application_runs_on_every_worker_and_leaves_nothing(
    spark_cluster: SparkTestbed, tmp_path: Path
) -> None:
    bed = spark_cluster
    app = tmp_path / "app.py"
    app.write_text(APP)
    argv = [os.path.join(bed.spark_home, "bin", "spark-submit"), "--master", bed.master_url]
    for conf in (
        f"spark.driver.host={bed.driver_host}",
        f"spark.executor.cores={bed.cores}",
        f"spark.cores.max={bed.workers * bed.cores}",
        f"spark.task.cpus={bed.cores}",
        "spark.executor.memory=512m",
        # the stage waits for every executor (standalone's default waits for none, 30 s)
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
    ):
        argv += ["--conf", conf]
    t0 = time.monotonic()
    done = subprocess.run(
        [*argv, str(app), bed.driver_host, str(bed.workers)],
        env=bed.env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-4000:]
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines() if " " in line)
    app_id, rows = lines["APP_ID"], json.loads(lines["ROWS"])
    print(f"spark-submit took {took:.1f}s")
    netns = {
        addr: os.stat(f"/run/netns/{ns}").st_ino
        for addr, ns in zip(bed.worker_addresses, bed.namespaces, strict=True)
    }
    assert sorted(r["partition"] for r in rows) == list(range(bed.workers))
    assert sorted(r["address"] for r in rows) == sorted(bed.worker_addresses)
    assert all(r["netns"] == netns[r["address"]] for r in rows)
    completed = {a["id"]: a for a in bed.master_state()["completedapps"]}
    assert completed[app_id]["state"] == "FINISHED"
    # the workers end the application's executors (and those their Python workers) on its end
    _wait(
        lambda: all(bed.processes_on_worker(i) == [] for i in range(bed.workers)),
        lambda: (
            "processes left on the workers: "
            + repr({i: bed.processes_on_worker(i) for i in range(bed.workers)})
        ),
    )
    assert bed.master_state()["coresused"] == 0


def test_a_killed_worker_is_seen_dead_then_alive_once_restarted(
    spark_cluster: SparkTestbed,
) -> None:
    bed = spark_cluster
    address = bed.worker_addresses[1]
    bed.kill_worker(1)
    assert bed.processes_on_worker(1) == []
    # the master drops the worker when its connection does (a SIGKILL closes it at once)
    _wait(
        lambda: (
            any(
                w["host"] == address and w["state"] == "DEAD" for w in bed.master_state()["workers"]
            )
            and address not in bed.alive_workers()
        ),
        lambda: f"the master lists {address} not DEAD: {bed.master_state()['workers']}",
    )
    bed.start_worker(1)  # waits for its new registration ALIVE
    alive = bed.alive_workers()
    assert sorted(alive) == sorted(bed.worker_addresses)
    assert alive[address]["cores"] == bed.cores
