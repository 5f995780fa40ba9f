"""The SSH transport: a Fabric ``Connection`` per host, raw channels for bytes in and out.

Fabric resolves the connection (``~/.ssh/config``: HostName, Port, User, IdentityFile,
ProxyJump; ssh-agent). Commands then run on paramiko channels of that connection, because
invoke's runner decodes stdin/stdout as text and tar/base64 transfers need bytes. Host keys are
verified against known_hosts (paramiko ``RejectPolicy``) unless the target accepts new keys.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import paramiko
from fabric import Config, Connection

from tfplan.backends.transports import scripts as _scripts
from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.specs import (
    CommandResult,
    HostTarget,
    Launched,
    LaunchSpec,
    StreamPipe,
)
from tfplan.errors import BackendError

__all__ = ["SSHTransport"]

CONNECT_TIMEOUT_SECS = 10
_base_config: Config | None = None
_config_lock = threading.Lock()
_known_hosts_lock = threading.Lock()  # accepting keys rewrites known_hosts: one writer at a time


def _exec(chan: paramiko.Channel, command: str, timeout: float) -> None:
    """``chan.exec_command``, bounded. paramiko waits for the host's reply with no timeout
    (``settimeout`` covers reads only): a host that drops off the network between opening the
    channel and this request hung the caller -- the supervisor's status poll, so the lost host
    was never detected -- forever. Past ``timeout`` the channel is closed: SSHException."""
    watchdog = threading.Timer(timeout, chan.close)
    watchdog.daemon = True
    watchdog.start()
    try:
        chan.exec_command(command)
    finally:
        watchdog.cancel()


def _fresh_config() -> Config:
    # Loading ~/.ssh/config once and cloning it per connection: a shared Config object would
    # accumulate key_filename entries across connections (see TESTBED.md).
    global _base_config
    with _config_lock:
        if _base_config is None:
            _base_config = Config()
        return _base_config.clone()


class SSHTransport(Transport):
    """Runs the shared sh scripts over SSH channels; one connection reused for every call.

    A host whose sshd limits sessions per connection (``MaxSessions``, 10 by default) gets
    extra connections when many log streams are open at once.
    """

    kind = "ssh"

    def __init__(self, target: HostTarget) -> None:
        super().__init__(target)
        self._lock = threading.Lock()
        self._connections: list[Connection] = []
        self.connect_secs: float | None = None  # how long the first connection took

    @property
    def python(self) -> str:
        return self.target.python or "python3"

    # ---- connection --------------------------------------------------------------------
    def _known_hosts_path(self) -> Path:
        return Path(self.target.known_hosts or "~/.ssh/known_hosts").expanduser()

    def _new_connection(self) -> Connection:
        target = self.target
        connect_kwargs: dict[str, Any] = {}
        if target.ssh_key:
            key = Path(target.ssh_key).expanduser()
            if not key.is_file():
                raise BackendError(
                    f"host {target.name}: ssh_key {key} does not exist: fix the host's ssh_key"
                )
            connect_kwargs.update(key_filename=[str(key)], look_for_keys=False, allow_agent=False)
        conn = Connection(
            target.address,
            user=target.ssh_user,
            port=target.ssh_port,
            config=_fresh_config(),
            connect_timeout=CONNECT_TIMEOUT_SECS,
            connect_kwargs=connect_kwargs,
        )
        known_hosts = self._known_hosts_path()
        if target.accept_new_host_keys:
            known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            known_hosts.touch(mode=0o600, exist_ok=True)
            conn.client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if known_hosts.is_file():
            conn.client.load_host_keys(str(known_hosts))
        began = time.monotonic()
        try:
            if target.accept_new_host_keys:
                with _known_hosts_lock:
                    conn.client.load_host_keys(str(known_hosts))  # others may have added keys
                    conn.open()
            else:
                conn.open()
        except Exception as exc:
            conn.close()
            raise self._connect_error(conn, exc) from exc
        if self.connect_secs is None:
            self.connect_secs = time.monotonic() - began
        transport = conn.client.get_transport()
        if transport is not None:
            transport.set_keepalive(30)
        return conn

    def _connect_error(self, conn: Connection, exc: BaseException) -> BackendError:
        name = self.target.name
        where = f"{conn.user}@{conn.host}:{conn.port}"
        if isinstance(exc, paramiko.BadHostKeyException):
            return BackendError(
                f"host {name}: the host key of {where} CHANGED (possible man-in-the-middle): if "
                f"the host was reinstalled, remove its line from {self._known_hosts_path()}"
            )
        if isinstance(exc, paramiko.AuthenticationException):
            return BackendError(
                f"host {name}: authentication failed as {where}: check the host's ssh_key and "
                "ssh_user, your ssh-agent, and authorized_keys on the host"
            )
        if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
            port = f"-p {conn.port} " if conn.port != 22 else ""
            return BackendError(
                f"host {name}: unknown host key for {where}: verify it and run `ssh-keyscan "
                f"{port}{conn.host} >> {self._known_hosts_path()}`, or set "
                "cluster.ssh_accept_new_host_keys=true to accept and remember it"
            )
        if isinstance(exc, paramiko.SSHException):
            return BackendError(f"host {name}: SSH to {where} failed: {exc}")
        if isinstance(exc, socket.gaierror):
            return BackendError(f"host {name}: cannot resolve {conn.host}: fix the host's address")
        if isinstance(exc, (TimeoutError, socket.timeout)):
            return BackendError(
                f"host {name}: timed out connecting to {where} after {CONNECT_TIMEOUT_SECS}s: "
                "check the host is up and reachable"
            )
        if isinstance(exc, OSError):
            why = (
                "connection refused"
                if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError)
                else (exc.strerror or str(exc))
            )
            return BackendError(
                f"host {name}: cannot connect to {where} ({why}): check the host is up and sshd "
                "listens on that port"
            )
        return BackendError(f"host {name}: SSH to {where} failed: {type(exc).__name__}: {exc}")

    def _open_channel(self) -> paramiko.Channel:
        with self._lock:
            for conn in list(self._connections):
                transport = conn.client.get_transport()
                if transport is None or not transport.is_active():
                    conn.close()
                    self._connections.remove(conn)
                    continue
                try:
                    return transport.open_session(timeout=CONNECT_TIMEOUT_SECS)
                except paramiko.ChannelException:
                    continue  # MaxSessions reached on this connection: try the next one
                except paramiko.SSHException:
                    conn.close()
                    self._connections.remove(conn)
            conn = self._new_connection()
            self._connections.append(conn)
            transport = conn.client.get_transport()
            assert transport is not None
            try:
                return transport.open_session(timeout=CONNECT_TIMEOUT_SECS)
            except paramiko.SSHException as exc:
                raise BackendError(
                    f"host {self.target.name}: sshd refused a session: {exc}"
                ) from exc

    def connect(self) -> float:
        """Open the connection now (otherwise the first call does); return the seconds it took.

        Raises:
            BackendError: unreachable, authentication failed, or unknown host key.
        """
        began = time.monotonic()
        self._open_channel().close()
        return time.monotonic() - began

    # ---- hooks -------------------------------------------------------------------------
    def _run(self, script: str, stdin: bytes | None, timeout: float) -> CommandResult:
        argv, stdin = _scripts.shell_invocation(script, stdin)
        chan = self._open_channel()
        try:
            chan.settimeout(timeout)
            _exec(chan, " ".join(_scripts.q(word) for word in argv), timeout)
            err: list[bytes] = []
            reader = threading.Thread(
                target=lambda: err.append(chan.makefile_stderr("rb").read()), daemon=True
            )
            reader.start()
            if stdin:
                chan.sendall(stdin)
                chan.shutdown_write()
            # Without input nothing is sent, EOF included: a command that ends before our EOF
            # reaches sshd has had its channel freed, and OpenSSH answers an EOF for a freed
            # channel by dropping the whole connection ("ieof packet referred to nonexistent
            # channel"), with every other command and log stream on it (seen with 1,000 starts
            # over ten hosts). The scripts sent without input never read their stdin.
            out = chan.makefile("rb").read()
            reader.join(timeout)
            status = chan.recv_exit_status()
        except TimeoutError as exc:
            raise BackendError(
                f"host {self.target.name}: a command timed out after {timeout:.0f}s: "
                "the host may be overloaded or unreachable"
            ) from exc
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise BackendError(
                f"host {self.target.name}: the SSH connection failed during a command: {exc}"
            ) from exc
        finally:
            chan.close()
        return CommandResult(status, out, b"".join(err))

    def _start(self, spec: LaunchSpec) -> Launched:
        return self._start_by_script(spec)

    def _open_stream(self, script: str) -> StreamPipe:
        chan = self._open_channel()
        try:
            _exec(chan, "sh -c " + _scripts.q(script), CONNECT_TIMEOUT_SECS)
        except paramiko.SSHException as exc:
            raise BackendError(f"host {self.target.name}: could not start a stream: {exc}") from exc

        def read_chunk() -> bytes:
            try:
                return bytes(chan.recv(65536))
            except (OSError, EOFError):
                return b""

        def end_input() -> None:
            try:
                chan.shutdown_write()
            except (OSError, EOFError, paramiko.SSHException):
                pass

        def write(data: bytes) -> None:
            try:
                chan.sendall(data)
            except (EOFError, paramiko.SSHException) as exc:
                raise OSError(str(exc)) from exc

        return StreamPipe(read_chunk, write, end_input, chan.close)

    def _close(self) -> None:
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
