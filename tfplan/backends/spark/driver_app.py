"""The Spark application of one tfplan apply: one long Spark task per executor, each a tfplan agent.

Run by ``spark-submit`` (client deploy mode: the driver runs beside tfplan, a detached process
recorded in the state) as::

    spark-submit ... --py-files tfplan_spark_agent.py driver_app.py REGISTRY WANTED

with the agents' token in ``TFPLAN_SPARK_TOKEN``. Stdlib and pyspark only (no tfplan import:
it runs under whatever Python the driver uses). ``WANTED`` is a JSON file: one ``{"place",
"profile"}`` per agent, ``profile`` None (the application's default executors) or ``{"cores",
"memory", "gpus"}``: a resource profile, so that Spark gives that agent an executor of that
shape (stage-level scheduling, with dynamic allocation on).

- A registry server on ``spark.driver.host`` takes each agent's registration and writes every
  agent's record to ``REGISTRY`` (JSON, atomically): ``{"app_id", "driver_pid", "agents":
  {place: record}, "lost": {place: why}}``.
- Each agent is a job of its own (one partition, job group ``tfplan-agent-<place>``), so agents
  start, fail and are cancelled one by one: Spark retries a failed agent task (an executor
  lost) on another executor, and when the job itself fails the agent is started again as a new
  job; each new agent registers again and the registry names where it is now. An agent reports
  the GPUs Spark gave its task (``TaskContext.resources()``).
- SIGTERM (``tfplan destroy``) cancels every job, stops the SparkContext (the executors end,
  and with them the agents, whose guards kill what they started), and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

TOKEN_ENV = "TFPLAN_SPARK_TOKEN"
RELAUNCH_PAUSE_SECS = 1.0


class Registry:
    """The agents' records, written to a JSON file at each change."""

    def __init__(self, path: str, app_id: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.data: dict[str, Any] = {
            "app_id": app_id,
            "driver_pid": os.getpid(),
            "agents": {},
            "lost": {},
        }
        self.write()

    def write(self) -> None:
        tmp = f"{self.path}.tmp.{os.getpid()}"
        with open(tmp, "w") as out:
            json.dump(self.data, out, indent=1)
        os.replace(tmp, self.path)

    def agent(self, record: dict[str, Any]) -> None:
        with self.lock:
            place = str(record["place"])
            self.data["agents"][place] = {**record, "registered_at": time.time()}
            self.data["lost"].pop(place, None)
            self.write()

    def lost(self, place: str, why: str) -> None:
        with self.lock:
            self.data["agents"].pop(place, None)
            self.data["lost"][place] = why
            self.write()


def serve_registry(registry: Registry, host: str) -> tuple[str, int]:
    """Accept registrations on ``host``; the address agents connect to."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((host, 0))
    server.listen(64)

    def accept() -> None:
        while True:
            conn, _ = server.accept()
            try:
                conn.settimeout(10.0)
                data = bytearray()
                while not data.endswith(b"\n"):
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                registry.agent(json.loads(data))
                conn.sendall(b"ok\n")
            except (OSError, ValueError):
                pass
            finally:
                conn.close()

    threading.Thread(target=accept, name="registry", daemon=True).start()
    return host, int(server.getsockname()[1])


def resource_profile(profile: dict[str, Any], gpu_script: str | None) -> Any:
    """A Spark resource profile: executors of ``cores``/``memory``/``gpus``, whose one task
    (the agent) takes every core and GPU of its executor."""
    from pyspark.resource import (
        ExecutorResourceRequests,
        ResourceProfileBuilder,
        TaskResourceRequests,
    )

    cores, gpus = int(profile["cores"]), int(profile.get("gpus") or 0)
    executor = ExecutorResourceRequests().cores(cores).memory(str(profile["memory"]))
    task = TaskResourceRequests().cpus(cores)
    if gpus:
        executor = executor.resource("gpu", gpus, discoveryScript=gpu_script or "")
        task = task.resource("gpu", gpus)
    return ResourceProfileBuilder().require(executor).require(task).build


def main(argv: list[str]) -> int:
    from pyspark import SparkContext, TaskContext
    from pyspark.sql import SparkSession

    registry_path = argv[1]
    with open(argv[2]) as wanted_file:
        wanted: list[dict[str, Any]] = json.load(wanted_file)
    token = os.environ[TOKEN_ENV]
    spark = SparkSession.builder.appName(os.environ.get("TFPLAN_SPARK_APP", "tfplan")).getOrCreate()
    sc: SparkContext = spark.sparkContext
    registry = Registry(registry_path, sc.applicationId)
    driver_host = sc.getConf().get("spark.driver.host") or socket.gethostbyname(
        socket.gethostname()
    )
    address = serve_registry(registry, driver_host)
    stopping = threading.Event()

    gpu_script = os.environ.get("TFPLAN_SPARK_GPU_SCRIPT") or None
    built: dict[str, Any] = {}  # one resource profile per shape, shared by its agents

    def profile_of(wanted_agent: dict[str, Any]) -> Any:
        shape = wanted_agent.get("profile")
        if not shape:
            return None  # the application's default executors
        key = json.dumps(shape, sort_keys=True)
        if key not in built:
            built[key] = resource_profile(shape, gpu_script)
        return built[key]

    def run_agent(place: str) -> Any:
        def agent_task(_: Any) -> Any:
            import tfplan_spark_agent

            context = TaskContext.get()
            attempt = context.attemptNumber() if context is not None else 0
            gpus: list[str] = []
            if context is not None:
                found = context.resources().get("gpu")
                gpus = list(found.addresses) if found is not None else []
            tfplan_spark_agent.serve(token, address, place, attempt, gpus)
            yield place  # never reached: the agent serves until it is killed

        return agent_task

    def keep_agent(place: str, profile: Any) -> None:
        while not stopping.is_set():
            sc.setJobGroup(f"tfplan-agent-{place}", f"tfplan agent {place}", interruptOnCancel=True)
            try:
                rdd = sc.parallelize([place], 1)
                if profile is not None:
                    rdd = rdd.withResources(profile)
                rdd.mapPartitions(run_agent(place)).collect()
                why = "its Spark task ended"
            except Exception as error:  # noqa: BLE001 - py4j's, Spark's: recorded, retried
                why = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            if stopping.is_set():
                return
            registry.lost(place, why)
            time.sleep(RELAUNCH_PAUSE_SECS)

    threads = [
        threading.Thread(
            target=keep_agent,
            args=(str(w["place"]), profile_of(w)),
            name=f"agent-{w['place']}",
            daemon=True,
        )
        for w in wanted
    ]
    for thread in threads:
        thread.start()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    jvm = os.getppid()  # spark-submit's JVM runs this program: it does not outlive the JVM
    while not stopping.wait(0.5):
        if os.getppid() != jvm:
            print(
                f"tfplan driver: its JVM (pid {jvm}) is gone: exiting", file=sys.stderr, flush=True
            )
            os._exit(1)
    try:
        sc.cancelAllJobs()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
