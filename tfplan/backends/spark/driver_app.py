"""The Spark application of one tfplan apply: one long Spark task per executor, each a tfplan agent.

Run by ``spark-submit`` (client deploy mode: the driver runs beside tfplan, a detached process
recorded in the state) as::

    spark-submit ... --py-files tfplan_spark_agent.py driver_app.py REGISTRY AGENTS

with the agents' token in ``TFPLAN_SPARK_TOKEN``. Stdlib and pyspark only (no tfplan import:
it runs under whatever Python the driver uses).

- A registry server on ``spark.driver.host`` takes each agent's registration and writes every
  agent's record to ``REGISTRY`` (JSON, atomically): ``{"app_id", "driver_pid", "agents":
  {index: record}, "lost": {index: why}}``.
- Agent ``i`` is a job of its own (one partition, job group ``tfplan-agent-i``), so agents
  start, fail and are cancelled one by one: Spark retries a failed agent task (an executor
  lost) on another executor, and when the job itself fails the agent is started again as a new
  job; each new agent registers again and the registry names where it is now.
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
            index = str(int(record["index"]))
            self.data["agents"][index] = {**record, "registered_at": time.time()}
            self.data["lost"].pop(index, None)
            self.write()

    def lost(self, index: int, why: str) -> None:
        with self.lock:
            self.data["agents"].pop(str(index), None)
            self.data["lost"][str(index)] = why
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


def main(argv: list[str]) -> int:
    from pyspark import SparkContext, TaskContext
    from pyspark.sql import SparkSession

    registry_path, count = argv[1], int(argv[2])
    token = os.environ[TOKEN_ENV]
    spark = SparkSession.builder.appName(os.environ.get("TFPLAN_SPARK_APP", "tfplan")).getOrCreate()
    sc: SparkContext = spark.sparkContext
    registry = Registry(registry_path, sc.applicationId)
    driver_host = sc.getConf().get("spark.driver.host") or socket.gethostbyname(
        socket.gethostname()
    )
    address = serve_registry(registry, driver_host)
    stopping = threading.Event()

    def run_agent(index: int) -> Any:
        def agent_task(_: Any) -> Any:
            import tfplan_spark_agent

            context = TaskContext.get()
            attempt = context.attemptNumber() if context is not None else 0
            tfplan_spark_agent.serve(token, address, index, attempt)
            yield index  # never reached: the agent serves until it is killed

        return agent_task

    def keep_agent(index: int) -> None:
        job = 0
        while not stopping.is_set():
            sc.setJobGroup(f"tfplan-agent-{index}", f"tfplan agent {index}", interruptOnCancel=True)
            try:
                sc.parallelize([index], 1).mapPartitions(run_agent(index)).collect()
                why = "its Spark task ended"
            except Exception as error:  # noqa: BLE001 - py4j's, Spark's: recorded, retried
                why = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
            if stopping.is_set():
                return
            registry.lost(index, why)
            job += 1
            time.sleep(RELAUNCH_PAUSE_SECS)

    threads = [
        threading.Thread(target=keep_agent, args=(i,), name=f"agent-{i}", daemon=True)
        for i in range(count)
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
            os._exit(1)
    try:
        sc.cancelAllJobs()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
