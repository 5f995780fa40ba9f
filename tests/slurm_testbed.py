"""A real Slurm cluster on one machine, for the tests of the Slurm backend.

A private ``munged`` (own key, own socket), ``slurmctld`` in the root network namespace on a
bridge address, and one ``slurmd`` per node n1..nN, each in its own network namespace with its
own address (recipe measured in ../shared/SLURM.md and ../shared/TESTBED.md; what Slurm does
under a launcher is in docs/slurm_notes.md).

Everything (slurm.conf, state, spool, logs, pid files, munge key) lies in a folder the test
owns; the munge socket lies in a short private folder under /tmp (munged wants every parent
folder of its socket searchable by all, which pytest's 0700 temp folders are not, and a Unix
socket path is limited to 107 bytes). Namespaces, bridge, veths, cluster name are unique per
bed (PID + a counter), ports are picked free, the /24 is chosen under a lock file: several test
runs and engineers can run beds at once. Teardown ends processes by PID only (the daemons it
started, then whatever still lives in the namespaces it made, i.e. slurmstepd and tasks).

Clients (sbatch, srun, squeue, scancel, sinfo, scontrol, sacct) need only ``SLURM_CONF``: the
munge socket is named in slurm.conf (``AuthInfo=socket=...``). Use :meth:`SlurmTestbed.env`, or
:meth:`SlurmTestbed.run` / :meth:`SlurmTestbed.popen`, which start clients in the bed's
``work`` folder (so ``slurm-ID.out`` files land there) and end leftover clients at ``stop()``.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["SlurmTestbed", "alive", "slurm_missing"]

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
MUNGEKEY = "/usr/sbin/mungekey"
CLIENTS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")
_SUBNET_LOCK = Path(tempfile.gettempdir()) / "tfplan-slurm-subnet.lock"
_counter = itertools.count()


def slurm_missing() -> list[str]:
    """The Slurm/munge programs this machine lacks (scripts/setup.sh installs them)."""
    missing = [p for p in (SLURMCTLD, SLURMD, MUNGED, MUNGEKEY) if not os.access(p, os.X_OK)]
    missing += [c for c in CLIENTS if shutil.which(c) is None]
    return missing


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def alive(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (PID 1 here reaps slowly: see TESTBED.md)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _stop_proc(proc: subprocess.Popen[Any], what: str, grace: float = 5.0) -> str | None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns a problem or None."""
    if proc.poll() is not None:
        return None
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
        return None
    except subprocess.TimeoutExpired:
        proc.kill()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        return f"{what} (pid {proc.pid}) survived SIGKILL"
    return None


class SlurmTestbed:
    """A Slurm cluster: ``nodes`` slurmd in network namespaces, one partition ``debug``.

    Node i (n1..nN) has address 10.78.<x>.(10+i); slurmctld listens on 10.78.<x>.1, the bridge
    address in the root namespace. Use as a context manager, or ``start()``, ``wait_ready()``,
    and ``stop()`` in a ``finally`` (``stop()`` also undoes a half-made bed).
    """

    partition = "debug"

    def __init__(self, tmp: Path, nodes: int = 3, cpus: int = 8, extra_conf: str = "") -> None:
        """``extra_conf``: more slurm.conf lines (e.g. ``"KillWait=5\\nMinJobAge=10"``); they
        come after the defaults, before the node lines."""
        if not 1 <= nodes <= 9:
            raise ValueError("1..9 nodes")
        self.tmp = Path(tmp)
        self.cpus = cpus
        self.extra_conf = extra_conf.strip()
        # unique per bed: PID + counter; interface names stay <= 15 chars (sl + 7 + 2 + br)
        prefix = f"sl{os.getpid()}{next(_counter)}"
        self.cluster_name = f"tfp{prefix}"
        self.bridge = f"{prefix}br"
        self.node_names = [f"n{i}" for i in range(1, nodes + 1)]
        self.namespaces = [f"{prefix}n{i}" for i in range(1, nodes + 1)]
        self.veths = [f"{prefix}v{i}" for i in range(1, nodes + 1)]
        self.subnet: int | None = None
        self.addresses: dict[str, str] = {}  # node name -> address, set by start()
        self.controller_address = ""
        self.hostname = socket.gethostname().split(".")[0]
        self.conf = self.tmp / "slurm.conf"
        self.log_dir = self.tmp / "log"
        self.work_dir = self.tmp / "work"  # where run()/popen() start clients by default
        self.run_dir = self.tmp / "run"
        self.ctld_port = 0
        self.slurmd_port = 0
        self.munge_dir: Path | None = None  # short private folder with the munge socket
        self.munged: subprocess.Popen[bytes] | None = None
        self.slurmctld: subprocess.Popen[bytes] | None = None
        self.slurmds: dict[str, subprocess.Popen[bytes]] = {}
        self._clients: list[subprocess.Popen[str]] = []  # from popen(), ended by stop()
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name) for teardown
        self._made_run_netns = False
        self.started_s = 0.0  # seconds start() + wait_ready() took

    @classmethod
    def attach(cls, conf: Path) -> SlurmTestbed:
        """A bed another process started and still runs, known by its ``slurm.conf`` (e.g.
        the ``slurm_cluster`` fixture's, for a benchmark the tests start): its clients are
        this object's (``run``, ``popen``, ``env``), its daemons are not: ``stop()`` ends only
        the clients started here."""
        conf = Path(conf).resolve()
        settings: dict[str, str] = {}
        addresses: dict[str, str] = {}
        partition = cls.partition
        for line in conf.read_text().splitlines():
            fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
            if "NodeName" in fields:
                addresses[fields["NodeName"]] = fields.get("NodeAddr", fields["NodeName"])
            elif "PartitionName" in fields:
                partition = fields["PartitionName"]
            elif len(fields) == 1:
                settings.update(fields)
        if not addresses:
            raise ValueError(f"{conf}: no NodeName line: not a test bed's slurm.conf")
        bed = cls(conf.parent, nodes=len(addresses))
        bed.conf = conf
        bed.partition = partition
        bed.cluster_name = settings.get("ClusterName", bed.cluster_name)
        bed.node_names = list(addresses)
        bed.addresses = addresses
        bed.namespaces, bed.veths = [], []  # the owner's, not this object's to undo
        return bed

    # -- public API -------------------------------------------------------------------------

    @property
    def munge_socket(self) -> Path:
        assert self.munge_dir is not None, "start() first"
        return self.munge_dir / "munge.socket"

    @property
    def jobcomp_log(self) -> Path:
        """jobcomp/filetxt: one line per ended job (JobId, JobName, JobState, ...)."""
        return self.tmp / "jobcomp.log"

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients: ``base`` (default os.environ) without inherited
        SLURM_*/SBATCH_*/SRUN_*/SALLOC_*/SQUEUE_* settings (a test run inside a Slurm job
        would otherwise talk about the wrong job), plus ``SLURM_CONF``."""
        env = dict(os.environ if base is None else base)
        for key in list(env):
            if key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SQUEUE_", "SINFO_")):
                del env[key]
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(
        self,
        *argv: str,
        timeout: float = 30,
        check: bool = True,
        input: str | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run one Slurm client command against this cluster (text output captured).

        It runs in ``cwd``, by default :attr:`work_dir` (a step's task starts in the client's
        folder, and sbatch writes ``slurm-ID.out`` there unless ``--output`` says otherwise).
        """
        done = subprocess.run(
            list(argv),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            input=input,
            cwd=cwd or self.work_dir,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()[-2000:]}"
            )
        return done

    def popen(self, *argv: str, **kwargs: object) -> subprocess.Popen[str]:
        """Start one Slurm client command (e.g. a long ``srun``) against this cluster.

        ``stop()`` ends it if it still runs then: an srun whose slurmstepd is gone keeps
        waiting for the controller long after the bed (measured: > 30 s).
        """
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        kwargs.setdefault("cwd", self.work_dir)
        proc: subprocess.Popen[str] = subprocess.Popen(  # type: ignore[call-overload]
            list(argv), env=self.env(), text=True, **kwargs
        )
        self._clients.append(proc)
        return proc

    def netns_pids(self, node: str) -> list[int]:
        """Live processes in node ``node``'s namespace: its slurmd, slurmstepds and tasks."""
        ns = self.namespaces[self.node_names.index(node)]
        return [p for p in self._netns_pids(ns) if alive(p)]

    def pids(self) -> list[int]:
        """Every live process of this bed: its daemons and all processes in its namespaces."""
        pids = {p.pid for p in self._daemons() if p.poll() is None}
        for ns in self.namespaces:
            if ("netns", ns) in self._made:
                pids.update(self._netns_pids(ns))
        return sorted(p for p in pids if alive(p))

    def start(self) -> None:
        """Build the cluster (raises RuntimeError naming the failed step; call stop() after)."""
        if os.geteuid() != 0:
            raise PermissionError("the Slurm test bed needs root (network namespaces)")
        missing = slurm_missing()
        if missing:
            raise RuntimeError(f"not installed: {', '.join(missing)} (run scripts/setup.sh)")
        t0 = time.monotonic()
        for sub in ("state", "spool", "log", "run", "munge", "work"):
            (self.tmp / sub).mkdir(parents=True, exist_ok=True)
        self._network()
        self._start_munged()
        self.ctld_port, self.slurmd_port = _free_port(), _free_port()
        self._write_conf()
        self._start_slurmctld()
        for name, ns in zip(self.node_names, self.namespaces, strict=True):
            self._start_slurmd(name, ns)
        self.started_s = time.monotonic() - t0

    def wait_ready(self, timeout: float = 60) -> None:
        """Wait until ``sinfo`` shows every node idle (polls, deadline ``timeout`` s)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        states: dict[str, str] = {}
        while True:
            self._check_daemons()
            done = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False, timeout=15)
            if done.returncode == 0:
                states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
                if all(states.get(n) == "idle" for n in self.node_names):
                    self.started_s += time.monotonic() - t0
                    return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"nodes not idle after {timeout:.0f}s: {states or done.stderr.strip()}\n"
                    + self._log_tails()
                )
            time.sleep(0.1)

    def stop(self) -> list[str]:
        """Undo everything this bed made; returns the problems met (never raises)."""
        problems: list[str] = []
        for client in self._clients:  # SIGTERM: srun cancels its step while slurmctld is up
            if problem := _stop_proc(client, f"client {client.args!r}", grace=3):
                problems.append(problem)
        for name, proc in self.slurmds.items():
            problems += self._check_pid_file(f"slurmd-{name}.pid", proc)
            if problem := _stop_proc(proc, f"slurmd {name}"):
                problems.append(problem)
        # slurmd leaves its slurmstepd and their tasks running: end what lives in our namespaces
        for ns in self.namespaces:
            if ("netns", ns) in self._made:
                problems += self._kill_netns(ns)
        if self.slurmctld is not None:
            problems += self._check_pid_file("slurmctld.pid", self.slurmctld)
            if problem := _stop_proc(self.slurmctld, "slurmctld"):
                problems.append(problem)
        if self.munged is not None and (problem := _stop_proc(self.munged, "munged")):
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
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
        return problems

    def __enter__(self) -> SlurmTestbed:
        try:
            self.start()
            self.wait_ready()
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
            raise RuntimeError("Slurm test bed teardown: " + "; ".join(problems))

    # -- building ---------------------------------------------------------------------------

    def _network(self) -> None:
        self._made_run_netns = not Path("/run/netns").exists()
        # choose the /24 and put it on our bridge under a lock, so two beds never share one
        with open(_SUBNET_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self.subnet = self._free_subnet()
            net = f"10.78.{self.subnet}"
            _ip("link", "add", self.bridge, "type", "bridge")
            self._made.append(("link", self.bridge))
            _ip("addr", "add", f"{net}.1/24", "dev", self.bridge)
        self.controller_address = f"{net}.1"
        _ip("link", "set", self.bridge, "up")
        for i, (name, ns, veth) in enumerate(
            zip(self.node_names, self.namespaces, self.veths, strict=True), 1
        ):
            address = f"{net}.{10 + i}"
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(("link", veth))
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            self.addresses[name] = address

    def _free_subnet(self) -> int:
        used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        start = os.getpid() % 250
        for step in range(250):
            x = (start + step) % 250 + 1
            if f" 10.78.{x}." not in used:
                return x
        raise RuntimeError("no free 10.78.x.0/24 subnet for the Slurm test bed")

    def _start_munged(self) -> None:
        # a private munged: own key, own socket, so no system munged is needed or touched
        key = self.tmp / "munge" / "munge.key"
        self.tmp.joinpath("munge").chmod(0o700)
        subprocess.run(
            [MUNGEKEY, "--create", "--force", f"--keyfile={key}"], check=True, capture_output=True
        )
        self.munge_dir = Path(tempfile.mkdtemp(prefix="tfpmunge"))
        self.munge_dir.chmod(0o755)  # munged: every folder above its socket searchable by all
        log = self.log_dir / "munged.log"
        with open(self.log_dir / "munged.out", "wb") as out:
            self.munged = subprocess.Popen(
                [
                    MUNGED,
                    "--foreground",
                    f"--socket={self.munge_socket}",
                    f"--key-file={key}",
                    f"--pid-file={self.run_dir / 'munged.pid'}",
                    f"--log-file={log}",
                    f"--seed-file={self.tmp / 'munge' / 'munged.seed'}",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if self.munged.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-1500:] if log.exists() else ""
                raise RuntimeError(f"munged did not start (rc={self.munged.returncode}): {tail}")
            time.sleep(0.02)

    def _write_conf(self) -> None:
        t = self.tmp
        nodes = "".join(
            f"NodeName={name} NodeAddr={addr} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN\n"
            for name, addr in self.addresses.items()
        )
        self.conf.write_text(
            f"ClusterName={self.cluster_name}\n"
            f"SlurmctldHost={self.hostname}({self.controller_address})\n"
            f"SlurmctldPort={self.ctld_port}\n"
            f"SlurmdPort={self.slurmd_port}\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            f"StateSaveLocation={t}/state\n"
            f"SlurmdSpoolDir={t}/spool/%n\n"
            f"SlurmctldPidFile={t}/run/slurmctld.pid\n"
            f"SlurmdPidFile={t}/run/slurmd-%n.pid\n"
            f"SlurmctldLogFile={t}/log/slurmctld.log\n"
            f"SlurmdLogFile={t}/log/slurmd-%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "ProctrackType=proctrack/linuxproc\n"
            "TaskPlugin=task/none\n"
            "SchedulerType=sched/backfill\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "ReturnToService=2\n"
            "MpiDefault=none\n"
            "MailProg=/bin/true\n"
            # declared CPUs, not the machine's 2, so several tasks fit on a node
            "SlurmdParameters=config_overrides\n"
            # no slurmdbd: plain sacct has nothing; job end states go to a text file that
            # `sacct -c` reads (docs/slurm_notes.md)
            "AccountingStorageType=accounting_storage/none\n"
            f"JobCompType=jobcomp/filetxt\nJobCompLoc={self.jobcomp_log}\n"
            + (self.extra_conf + "\n" if self.extra_conf else "")
            + nodes
            + f"PartitionName={self.partition} Nodes={','.join(self.node_names)} Default=YES "
            "MaxTime=INFINITE State=UP\n"
        )

    def _start_slurmctld(self) -> None:
        with open(self.log_dir / "slurmctld.out", "wb") as out:
            self.slurmctld = subprocess.Popen(
                [SLURMCTLD, "-D", "-c", "-f", str(self.conf)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
            )

    def _start_slurmd(self, name: str, ns: str) -> None:
        (self.tmp / "spool" / name).mkdir(parents=True, exist_ok=True)
        # nsenter --net only: `ip netns exec` remounts /sys and slurmd then exits (SLURM.md)
        argv = ["nsenter", f"--net=/run/netns/{ns}", SLURMD, "-D", "-f", str(self.conf)]
        with open(self.log_dir / f"slurmd-{name}.out", "wb") as out:
            self.slurmds[name] = subprocess.Popen(
                [*argv, "-N", name],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.env(),
            )

    # -- helpers ----------------------------------------------------------------------------

    def _daemons(self) -> list[subprocess.Popen[bytes]]:
        procs = [self.munged, self.slurmctld, *self.slurmds.values()]
        return [p for p in procs if p is not None]

    def _check_daemons(self) -> None:
        for what, proc in [("munged", self.munged), ("slurmctld", self.slurmctld)] + [
            (f"slurmd {n}", p) for n, p in self.slurmds.items()
        ]:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}\n" + self._log_tails())

    def _log_tails(self) -> str:
        tails = []
        for log in sorted(self.log_dir.glob("*")):
            text = log.read_text(errors="replace").strip()
            if text:
                tails.append(f"--- {log.name}\n" + "\n".join(text.splitlines()[-8:]))
        return "\n".join(tails)

    def _check_pid_file(self, name: str, proc: subprocess.Popen[bytes]) -> list[str]:
        path = self.run_dir / name
        if proc.poll() is not None or not path.exists():
            return []
        text = path.read_text().strip()
        if text != str(proc.pid):
            return [f"{name} says {text}, but the daemon started here has pid {proc.pid}"]
        return []

    @staticmethod
    def _netns_pids(ns: str) -> list[int]:
        done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in done.stdout.split() if p.isdigit()]

    def _kill_netns(self, ns: str, timeout: float = 10) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            pids = [p for p in self._netns_pids(ns) if alive(p)]
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
