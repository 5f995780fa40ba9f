"""A real Spark standalone cluster on one machine, for the tests of the Spark backend.

The master runs in the root network namespace on a bridge address; each worker runs in a
network namespace of its own with its own address, as a host of its own would (recipe measured
in ../shared/SPARK.md; the namespaces as in tests/testbed.py and tests/slurm_testbed.py). The
daemons are Spark's own foreground ``spark-class`` launches of the pyspark wheel (``SPARK_HOME``
is the installed ``pyspark`` folder): no ``sbin/start-*.sh``, so the bed owns their PIDs.

Everything Spark writes (conf, logs, worker dirs, scratch) lies in a folder the test owns.
Namespaces, bridge and veths are unique per bed (PID + a counter), ports are picked free, the
/24 (10.79.x.0/24: 10.77 is the netns bed's, 10.78 the Slurm bed's) is chosen under a lock
file: several test runs and beds can run at once. Processes are ended by PID / process group
only: the daemons started here, then whatever still lives in the namespaces made here
(executors, their Python workers, what those started).

A driver in the root namespace must bind and advertise the bridge address
(:attr:`SparkTestbed.driver_host`): the namespaces have a route to the bridge's /24 only, not
to the machine's own addresses. :meth:`SparkTestbed.env` sets ``SPARK_LOCAL_IP`` to it, which
is what ``spark.driver.host`` and ``spark.driver.bindAddress`` default to.
"""

from __future__ import annotations

import fcntl
import importlib.util
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Collection, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from slurm_testbed import alive  # tests/ is on sys.path (no __init__.py)

__all__ = ["SparkTestbed", "spark_home", "spark_missing"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# every worker has a namespace of its own, where nothing else listens before it: a fixed port
WORKER_WEBUI_PORT = 8081
# JVM options for the daemons, drivers and executors: the client compiler only and the serial
# collector halved the daemons' CPU at start (14.6 s instead of 27 s of CPU for four daemons on
# a 2-core machine) and their RSS (215 MB instead of 245); these JVMs only schedule.
_QUICK_JVM = (
    "-XX:TieredStopAtLevel=1",
    "-XX:+UseSerialGC",
    "-XX:+UnlockDiagnosticVMOptions",
    "-XX:-BytecodeVerificationRemote",
)
_NET = "10.79"
_SUBNET_LOCK = Path(tempfile.gettempdir()) / "tfplan-spark-subnet.lock"
_counter = itertools.count()
# the master's JSON is read directly, never through a proxy named in the environment
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def spark_home() -> str | None:
    """The installed pyspark folder (Spark's ``SPARK_HOME`` in the wheel), or None."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return os.path.dirname(spec.origin)


def _java() -> str | None:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return os.path.join(java_home, "bin", "java")
    return shutil.which("java")


def spark_missing() -> list[str]:
    """What this machine lacks for the bed (scripts/setup.sh installs it)."""
    missing = []
    if _java() is None:
        missing.append("java (openjdk-17-jre-headless)")
    home = spark_home()
    if home is None or not os.access(os.path.join(home, "bin", "spark-class"), os.X_OK):
        missing.append("pyspark (the dev extra)")
    return missing


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _netns_pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _end_group(proc: subprocess.Popen[bytes], what: str, grace: float) -> str | None:
    """SIGTERM the process group ``proc`` leads (start_new_session), SIGKILL it after
    ``grace`` seconds; returns a problem or None. A reaped leader's group is left alone (its
    id may be another's by now): what it left lives in a namespace and is ended there."""
    if proc.poll() is not None:
        return None
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
            return None
        except subprocess.TimeoutExpired:
            continue
    return f"{what} (pid {proc.pid}) survived SIGKILL"


class SparkTestbed:
    """A Spark standalone cluster: one master, ``workers`` workers in network namespaces.

    Worker i (0-based, as in :attr:`worker_addresses` and :attr:`namespaces`) has address
    10.79.<x>.(11+i) and offers ``cores`` cores and ``memory`` of memory; the master listens on
    10.79.<x>.1, the bridge address in the root namespace. Use as a context manager, or
    ``start()`` and ``stop()`` in a ``finally`` (``stop()`` also undoes a half-made bed).
    """

    def __init__(
        self, tmp: Path, workers: int = 3, cores: int = 2, memory: str = "2g", gpus: int = 2
    ) -> None:
        if not 1 <= workers <= 9:
            raise ValueError("1..9 workers")
        self.tmp = Path(tmp)
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.gpus = gpus  # stand-ins: a discovery script names them, nothing computes on them
        # unique per bed: PID + counter; interface names stay <= 15 chars (sp + 7 + 2 + br)
        prefix = f"sp{os.getpid()}{next(_counter)}"
        self.bridge = f"{prefix}br"
        self.namespaces = [f"{prefix}n{i}" for i in range(workers)]
        self.veths = [f"{prefix}v{i}" for i in range(workers)]
        self.subnet: int | None = None
        self.driver_host = ""  # the bridge address, set by start()
        self.worker_addresses: list[str] = []
        self.master_port = 0
        self.webui_port = 0
        self.spark_home = spark_home() or ""
        self.conf_dir = self.tmp / "conf"  # SPARK_CONF_DIR: the bed's own, so no other applies
        self.log_dir = self.tmp / "logs"
        self.master: subprocess.Popen[bytes] | None = None
        self.worker_procs: list[subprocess.Popen[bytes] | None] = [None] * workers
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name) for teardown
        self._made_run_netns = False
        self.started_s = 0.0  # seconds start() took, until every worker was ALIVE
        self.stopped_s = 0.0  # seconds the last stop() took

    # -- public API -------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        return f"spark://{self.driver_host}:{self.master_port}"

    @property
    def web_url(self) -> str:
        return f"http://{self.driver_host}:{self.webui_port}"

    def worker_dir(self, i: int) -> Path:
        """Worker i's ``--work-dir``: one folder per application, with each executor's
        stdout and stderr."""
        return self.tmp / f"worker{i}"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a client in the root namespace (``spark-submit``, a driver):
        ``base`` (default os.environ) without inherited SPARK_*/PYSPARK_* settings, plus
        SPARK_HOME, the bed's SPARK_CONF_DIR (its spark-defaults.conf: quick JVMs), scratch
        (SPARK_LOCAL_DIRS) under the bed's folder, this Python for driver and executors, and
        ``SPARK_LOCAL_IP`` = :attr:`driver_host`: the driver binds and advertises the bridge
        address, the only one the workers' namespaces reach. Without it the driver would
        advertise what the machine's host name resolves to (127.0.0.1 here, so Spark takes
        some other interface's address: the machine's own, or another bed's bridge), which
        the namespaces have no route to."""
        env = {
            k: v
            for k, v in (os.environ if base is None else base).items()
            if not k.startswith(("SPARK_", "PYSPARK_"))
        }
        env.update(
            SPARK_HOME=self.spark_home,
            SPARK_CONF_DIR=str(self.conf_dir),
            SPARK_LOCAL_DIRS=str(self.tmp / "local" / "client"),
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            SPARK_LOCAL_IP=self.driver_host,
        )
        return env

    def master_state(self, timeout: float = 5) -> dict[str, Any]:
        """The master's JSON (``workers`` with their ``host``/``state``/``cores``,
        ``aliveworkers``, ``cores``, ``coresused``, ``activeapps``, ``completedapps``...)."""
        with _OPENER.open(f"{self.web_url}/json/", timeout=timeout) as answer:
            state: dict[str, Any] = json.load(answer)
        return state

    def alive_workers(self) -> dict[str, dict[str, Any]]:
        """The master's ALIVE workers by address (the newest registration per address)."""
        workers = self.master_state().get("workers", [])
        return {w["host"]: w for w in workers if w.get("state") == "ALIVE"}

    def processes_on_worker(self, i: int) -> list[tuple[int, str]]:
        """(pid, command line) of every live process in worker i's namespace except the
        worker daemon itself: executors, their Python workers, what those started."""
        proc = self.worker_procs[i]
        daemon = proc.pid if proc is not None and proc.poll() is None else None
        return [
            (pid, _cmdline(pid))
            for pid in _netns_pids(self.namespaces[i])
            if pid != daemon and alive(pid)
        ]

    def start(self) -> None:
        """Build the cluster and wait until every worker is ALIVE (raises RuntimeError naming
        the failed step and the log to read; call stop() after)."""
        if os.geteuid() != 0:
            raise PermissionError("the Spark test bed needs root (network namespaces)")
        missing = spark_missing()
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)} (run scripts/setup.sh)")
        t0 = time.monotonic()
        for folder in (self.conf_dir, self.log_dir, self.tmp / "local"):
            folder.mkdir(parents=True, exist_ok=True)
        self._write_defaults()
        self._network()
        self.master_port = _free_port(self.driver_host)
        self.webui_port = _free_port(self.driver_host)
        self._start_master()
        for i in range(self.workers):
            self._start_worker(i)
        self.wait_alive(range(self.workers), timeout=120)
        self.started_s = time.monotonic() - t0

    def wait_alive(
        self, workers: Sequence[int], timeout: float = 120, exclude: Collection[str] = ()
    ) -> None:
        """Wait until the master lists each of ``workers`` ALIVE with the cores asked (and a
        worker id not in ``exclude``: a registration older than a restart does not count)."""
        deadline = time.monotonic() + timeout
        seen: dict[str, dict[str, Any]] | str = "no answer yet"
        while True:
            self._check_daemons(workers)
            try:
                seen = self.alive_workers()
            except (OSError, ValueError) as exc:  # the web UI is not up yet, or half up: an
                seen = f"master's web UI: {exc}"  # empty answer was seen once while it starts
            if isinstance(seen, dict) and all(
                (w := seen.get(self.worker_addresses[i])) is not None
                and w["cores"] == self.cores
                and w["id"] not in exclude
                for i in workers
            ):
                return
            if time.monotonic() > deadline:
                logs = ", ".join(str(self._log(f"worker{i}")) for i in workers)
                raise RuntimeError(
                    f"Spark workers {list(workers)} not ALIVE after {timeout:.0f}s "
                    f"(master at {self.web_url} lists {seen}): read {self._log('master')} "
                    f"and {logs}\n" + self._log_tails()
                )
            time.sleep(0.2)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker i's daemon (its process group) and everything in its namespace,
        as a host that dies would; the master notices when its connection drops."""
        proc = self.worker_procs[i]
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(10)
        problems = self._kill_netns(self.namespaces[i])
        if problems:
            raise RuntimeError("; ".join(problems))

    def start_worker(self, i: int, wait: bool = True, timeout: float = 120) -> None:
        """Start worker i again (after :meth:`kill_worker`); with ``wait``, until the master
        lists its new registration ALIVE."""
        proc = self.worker_procs[i]
        if proc is not None and proc.poll() is None:
            raise RuntimeError(f"worker {i} still runs (pid {proc.pid})")
        address = self.worker_addresses[i]
        try:
            old = {w["id"] for w in self.master_state()["workers"] if w["host"] == address}
        except OSError:
            old = set()
        self._start_worker(i)
        if wait:
            self.wait_alive([i], timeout=timeout, exclude=old)

    def stop(self) -> list[str]:
        """Undo everything this bed made; returns the problems met (never raises)."""
        t0 = time.monotonic()
        problems: list[str] = []
        for i, proc in enumerate(self.worker_procs):
            if proc is not None and (problem := _end_group(proc, f"worker {i}", grace=5)):
                problems.append(problem)
        # executors (and their Python workers) a worker left: end what lives in our namespaces
        for ns in self.namespaces:
            if ("netns", ns) in self._made:
                problems += self._kill_netns(ns)
        if self.master is not None and (problem := _end_group(self.master, "master", grace=5)):
            problems.append(problem)
        for kind, name in reversed(self._made):
            args = ["netns", "del", name] if kind == "netns" else ["link", "del", name]
            done = subprocess.run(["ip", *args], capture_output=True, text=True)
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                problems.append(f"ip {' '.join(args)}: {done.stderr.strip()}")
        self._made.clear()
        run_netns = Path("/run/netns")
        if self._made_run_netns and run_netns.exists() and not any(run_netns.iterdir()):
            subprocess.run(["umount", str(run_netns)], capture_output=True)
            try:
                run_netns.rmdir()
            except OSError:
                pass
        self.stopped_s = time.monotonic() - t0
        return problems

    def __enter__(self) -> SparkTestbed:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        problems = self.stop()
        if problems and exc_type is None:
            raise RuntimeError("Spark test bed teardown: " + "; ".join(problems))

    # -- building ---------------------------------------------------------------------------

    def _network(self) -> None:
        self._made_run_netns = not Path("/run/netns").exists()
        # choose the /24 and put it on our bridge under a lock, so two beds never share one
        with open(_SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = self._free_subnet()
            net = f"{_NET}.{self.subnet}"
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        self.driver_host = f"{net}.1"
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.namespaces, self.veths, strict=True)):
            address = f"{net}.{11 + i}"
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(("link", veth))
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.worker_addresses.append(address)

    def _free_subnet(self) -> int:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        start = os.getpid() % 250
        for step in range(250):
            x = (start + step) % 250 + 1
            if f" {_NET}.{x}." not in used:
                return x
        raise RuntimeError(f"no free {_NET}.x.0/24 subnet for the Spark test bed")

    def _write_defaults(self) -> None:
        """The cluster's spark-defaults.conf (an administrator's settings, read by spark-submit
        from SPARK_CONF_DIR): JVMs that start cheaply, and nothing an application must say
        itself (no master, no driver host): a client that forgets those still fails here."""
        jvm = " ".join(_QUICK_JVM)
        defaults = (
            f"spark.driver.defaultJavaOptions {jvm}\nspark.executor.defaultJavaOptions {jvm}\n"
        )
        if self.gpus:
            # each worker offers GPUs by name (no machine here has one): Spark's standalone
            # scheduling of them is real (an executor that asks for one is given an address, the
            # worker's free list shrinks); nothing runs on them
            script = self.conf_dir / "gpus.sh"
            found = {"name": "gpu", "addresses": [str(i) for i in range(self.gpus)]}
            script.write_text(f"#!/bin/sh\necho '{json.dumps(found)}'\n")
            script.chmod(0o755)
            defaults += (
                f"spark.worker.resource.gpu.amount {self.gpus}\n"
                f"spark.worker.resource.gpu.discoveryScript {script}\n"
            )
        (self.conf_dir / "spark-defaults.conf").write_text(defaults)

    def _daemon_env(self, local_ip: str, local_dirs: Path) -> dict[str, str]:
        env = self.env()
        env.update(
            SPARK_LOCAL_IP=local_ip,
            SPARK_LOCAL_DIRS=str(local_dirs),
            SPARK_LOG_DIR=str(self.log_dir),
            # the daemons' own heap; executors get spark.executor.memory (default 1g)
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=" ".join(_QUICK_JVM),
        )
        local_dirs.mkdir(parents=True, exist_ok=True)
        return env

    def _log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _spawn(self, argv: list[str], env: dict[str, str], log: str) -> subprocess.Popen[bytes]:
        with open(self._log(log), "ab") as out:
            out.write(f"--- {time.strftime('%H:%M:%S')} {' '.join(argv)}\n".encode())
            out.flush()
            return subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.tmp,
                start_new_session=True,  # its own process group: ended as one
            )

    def _start_master(self) -> None:
        spark_class = os.path.join(self.spark_home, "bin", "spark-class")
        argv = [spark_class, MASTER_CLASS, "--host", self.driver_host]
        argv += ["--port", str(self.master_port), "--webui-port", str(self.webui_port)]
        env = self._daemon_env(self.driver_host, self.tmp / "local" / "master")
        self.master = self._spawn(argv, env, "master")

    def _start_worker(self, i: int) -> None:
        address = self.worker_addresses[i]
        self.worker_dir(i).mkdir(parents=True, exist_ok=True)
        spark_class = os.path.join(self.spark_home, "bin", "spark-class")
        # ip netns exec and spark-class both exec: the process started is the worker's JVM
        argv = ["ip", "netns", "exec", self.namespaces[i], spark_class, WORKER_CLASS]
        argv += ["--host", address, "--cores", str(self.cores), "--memory", self.memory]
        argv += ["--webui-port", str(WORKER_WEBUI_PORT), "--work-dir", str(self.worker_dir(i))]
        env = self._daemon_env(address, self.tmp / "local" / f"worker{i}")
        self.worker_procs[i] = self._spawn([*argv, self.master_url], env, f"worker{i}")

    # -- helpers ----------------------------------------------------------------------------

    def _check_daemons(self, workers: Sequence[int]) -> None:
        daemons = [("master", self.master)]
        daemons += [(f"worker{i}", self.worker_procs[i]) for i in workers]
        for name, proc in daemons:
            if proc is None or proc.poll() is not None:
                rc = None if proc is None else proc.returncode
                raise RuntimeError(
                    f"Spark {name} exited with {rc}: read {self._log(name)}\n" + self._log_tails()
                )

    def _log_tails(self) -> str:
        tails = []
        for log in sorted(self.log_dir.glob("*.log")):
            text = log.read_text(errors="replace").strip()
            if text:
                tails.append(f"--- {log.name}\n" + "\n".join(text.splitlines()[-8:]))
        return "\n".join(tails)

    @staticmethod
    def _kill_netns(ns: str, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            pids = [p for p in _netns_pids(ns) if alive(p)]
            if not pids:
                return []
            if time.monotonic() > deadline:
                return [f"processes left in {ns}: {pids}"]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
