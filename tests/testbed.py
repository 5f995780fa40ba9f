"""Real test hosts on one machine: an sshd on loopback, and three network namespaces with one
sshd each (the measured recipe is ../shared/TESTBED.md, the shared material beside a checkout).

Everything is made under a temporary folder the test owns, named uniquely per run (from the
PID), and torn down by PID / by name of what this run created: never by process name.
Only loopback and addresses inside the namespaces made here are ever contacted.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfplan.backends.transports.specs import HostTarget

__all__ = ["LoopbackSshd", "NetnsTestbed", "SshdProcess", "free_port", "make_key"]

SSHD = "/usr/sbin/sshd"
SFTP_SERVER = "/usr/lib/openssh/sftp-server"


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def make_key(path: Path) -> Path:
    """Generate an ed25519 key pair without passphrase at ``path`` (+ ``.pub``)."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "tfplan-test", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


def _sshd_config(tmp: Path, address: str, port: int, host_key: Path, authorized: Path) -> Path:
    config = tmp / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {host_key}\nPidFile {tmp}/sshd.pid\n"
        f"AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "UsePAM no\nStrictModes no\n"
        # SHLVL=2 makes root's bash skip a slow .bashrc for ssh commands (TESTBED.md)
        "SetEnv SHLVL=2\n"
        f"Subsystem sftp {SFTP_SERVER}\n"
    )
    return config


def _wait_for_banner(address: str, port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection((address, port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not answer in 10s: {log.read_text()[-2000:]}")


@dataclass
class SshdProcess:
    """One running sshd (possibly inside a network namespace); stop() ends it by PID."""

    address: str
    port: int
    host_key: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def known_hosts_line(self) -> str:
        key = " ".join(self.host_key.with_suffix(".pub").read_text().split()[:2])
        host = self.address if self.port == 22 else f"[{self.address}]:{self.port}"
        return f"{host} {key}\n"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_sshd(
    tmp: Path,
    address: str,
    port: int,
    authorized: Path,
    netns: str | None = None,
    hostname: str | None = None,
    private_dirs: tuple[Path, ...] = (),
) -> SshdProcess:
    """Start ``sshd -D`` in a private mount namespace (own /run, so /run/sshd exists there).

    Args:
        tmp: a folder for the host key, config, pid file and log.
        netns: run inside this network namespace (``ip netns exec``).
        hostname: set in a private UTS namespace (shows which host a command ran on).
        private_dirs: folders over-mounted with an empty tmpfs for this sshd's sessions only,
            to simulate a host that does not share them.
    """
    tmp.mkdir(parents=True, exist_ok=True)
    host_key = make_key(tmp / "host_ed25519")
    config = _sshd_config(tmp, address, port, host_key, authorized)
    setup = ["mount -t tmpfs -o mode=755 tmpfs /run", "mkdir -m 755 /run/sshd"]
    setup += [f"mount -t tmpfs tmpfs {d}" for d in private_dirs]
    unshare = ["unshare", "-m"]
    if hostname:
        unshare.append("-u")
        setup.insert(0, f"hostname {hostname}")
    script = " && ".join(setup) + f" && exec {SSHD} -D -e -f {config}"
    argv = [*unshare, "--", "sh", "-c", script]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    log = tmp / "sshd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    sshd = SshdProcess(address, port, host_key, proc, log)
    try:
        _wait_for_banner(address, port, proc, log)
    except BaseException:
        sshd.stop()
        raise
    return sshd


@dataclass
class LoopbackSshd:
    """A real sshd on 127.0.0.1 with a client key and a known_hosts file that trusts it."""

    tmp: Path
    sshd: SshdProcess = field(init=False)
    client_key: Path = field(init=False)
    known_hosts: Path = field(init=False)

    def __post_init__(self) -> None:
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.client_key = make_key(self.tmp / "client_ed25519")
        authorized = self.tmp / "authorized_keys"
        shutil.copy(self.client_key.with_suffix(".pub"), authorized)
        self.sshd = start_sshd(self.tmp / "sshd", "127.0.0.1", free_port(), authorized)
        self.known_hosts = self.tmp / "known_hosts"
        self.known_hosts.write_text(self.sshd.known_hosts_line())

    @property
    def port(self) -> int:
        return self.sshd.port

    def target(self, name: str = "sshd", **overrides: object) -> HostTarget:
        fields: dict[str, object] = dict(
            name=name,
            address="127.0.0.1",
            ssh_port=self.port,
            ssh_user=getpass.getuser(),
            ssh_key=str(self.client_key),
            known_hosts=str(self.known_hosts),
            python=sys.executable,
            kind="ssh",
        )
        fields.update(overrides)
        return HostTarget(**fields)  # type: ignore[arg-type]

    def stop(self) -> None:
        self.sshd.stop()


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _free_subnet(start: int) -> int:
    used = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
    for step in range(250):
        x = (start + step) % 250 + 1
        if f" 10.77.{x}." not in used:
            return x
    raise RuntimeError("no free 10.77.x.0/24 subnet for the netns testbed")


class NetnsTestbed:
    """Three hosts: network namespaces on a bridge, each with its own sshd on port 22.

    Host i (1..3) has address 10.77.<x>.1i; the root namespace has 10.77.<x>.1 on the bridge.
    ``unshared_dir`` is a folder that hosts 1 and 2 share but host 3 sees as its own empty
    tmpfs (a host that forgot to mount the shared disk). ``private_dir`` is a folder every host
    sees as its own empty tmpfs, and the machine running the tests as the real folder: hosts
    that share no output folder with each other nor with the launcher. What a host holds there
    is read with :meth:`host_files` / :meth:`read_on_host` (inside its mount namespace).
    """

    def __init__(self, tmp: Path, count: int = 3, tag: str = "") -> None:
        prefix = f"tfp{os.getpid()}{tag}"  # unique per run; at most 15 chars per interface name
        self.tmp = tmp
        self.bridge = f"{prefix}br"
        self.namespaces = [f"{prefix}n{i}" for i in range(1, count + 1)]
        self.veths = [f"{prefix}v{i}" for i in range(1, count + 1)]
        self.subnet = _free_subnet(os.getpid() % 250)
        self.addresses = [f"10.77.{self.subnet}.1{i}" for i in range(1, count + 1)]
        self.shared_dir = tmp / "shared"
        self.unshared_dir = tmp / "nfs"
        self.private_dir = tmp / "private"
        self.sshds: list[SshdProcess] = []
        self._made_run_netns = not Path("/run/netns").exists()
        self._made: list[tuple[str, str]] = []  # ("netns"|"link", name), for teardown
        self.client_key = make_key(tmp / "client_ed25519")
        self.known_hosts = tmp / "known_hosts"

    def setup(self) -> None:
        """Create bridge, namespaces, veths and sshds. Raises RuntimeError naming the step."""
        self.shared_dir.mkdir(parents=True, exist_ok=True)
        self.unshared_dir.mkdir(parents=True, exist_ok=True)
        self.private_dir.mkdir(parents=True, exist_ok=True)
        authorized = self.tmp / "authorized_keys"
        shutil.copy(self.client_key.with_suffix(".pub"), authorized)
        _ip("link", "add", self.bridge, "type", "bridge")
        self._made.append(("link", self.bridge))
        _ip("addr", "add", f"10.77.{self.subnet}.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth, addr) in enumerate(
            zip(self.namespaces, self.veths, self.addresses, strict=True), 1
        ):
            _ip("netns", "add", ns)
            self._made.append(("netns", ns))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._made.append(("link", veth))
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            private = (self.private_dir, *((self.unshared_dir,) if i == 3 else ()))
            self.sshds.append(
                start_sshd(
                    self.tmp / f"host{i}",
                    addr,
                    22,
                    authorized,
                    netns=ns,
                    hostname=f"tfp-h{i}",
                    private_dirs=private,
                )
            )
        self.known_hosts.write_text("".join(s.known_hosts_line() for s in self.sshds))

    def targets(self) -> list[HostTarget]:
        return [
            HostTarget(
                name=f"h{i}",
                address=addr,
                ssh_user=getpass.getuser(),
                ssh_key=str(self.client_key),
                known_hosts=str(self.known_hosts),
                python=sys.executable,
                kind="ssh",
            )
            for i, addr in enumerate(self.addresses, 1)
        ]

    def _in_host(self, host: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in host ``host``'s (1-based) mount and network namespaces."""
        pid = self.sshds[host - 1].proc.pid  # ip netns exec and unshare exec: this is sshd
        return subprocess.run(
            ["nsenter", "-t", str(pid), "-m", "-n", "--", *argv],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def host_files(self, host: int, folder: Path | str) -> list[str]:
        """The files under ``folder`` as host ``host`` (1-based) sees them, relative, sorted."""
        done = self._in_host(host, ["find", str(folder), "-type", "f", "-printf", "%P\\n"])
        return sorted(done.stdout.split()) if done.returncode == 0 else []

    def remove_on_host(self, host: int, path: Path | str) -> None:
        """Remove a file as host ``host`` (1-based) sees it (a disk that lost it)."""
        done = self._in_host(host, ["rm", str(path)])
        assert done.returncode == 0, done.stderr

    def read_on_host(self, host: int, path: Path | str) -> str | None:
        """A file as host ``host`` (1-based) sees it, or None when it has none there."""
        done = self._in_host(host, ["cat", str(path)])
        return done.stdout if done.returncode == 0 else None

    def teardown(self) -> list[str]:
        """Undo everything this run made; returns the problems met (teardown never raises)."""
        problems: list[str] = []
        for sshd in self.sshds:
            try:
                sshd.stop()
            except Exception as exc:  # noqa: BLE001 - go on cleaning up
                problems.append(f"sshd {sshd.address}: {exc}")
        for kind, name in reversed(self._made):
            if kind == "netns":
                # Tasks a test left running in the namespace would keep it alive: end them by PID.
                pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
                for pid in pids.stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                args = ["netns", "del", name]
            else:
                args = ["link", "del", name]
            done = subprocess.run(["ip", *args], capture_output=True, text=True)
            if done.returncode != 0 and "Cannot find device" not in done.stderr:
                problems.append(f"ip {' '.join(args)}: {done.stderr.strip()}")
        run_netns = Path("/run/netns")
        if self._made_run_netns and run_netns.exists() and not any(run_netns.iterdir()):
            subprocess.run(["umount", str(run_netns)], capture_output=True)
            try:
                run_netns.rmdir()
            except OSError:
                pass
        return problems
