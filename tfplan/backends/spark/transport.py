"""The transport to a tfplan agent inside a Spark executor (:mod:`.agent`): TCP instead of SSH.

Everything the process backend does on a host (preflight, copying code, starting tasks
detached, ``ps``, stopping by process group, following logs, the host's watcher) is a POSIX sh
script run through a transport; this one sends each script to the agent that runs in the
executor on that host, with the agent's token. Starting a task is the SSH transport's detached
start (``setsid``), run by the agent.
"""

from __future__ import annotations

import json
import socket
from dataclasses import dataclass
from typing import Any

from tfplan.backends.spark.agent import read_exact, read_line
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

__all__ = ["AgentTarget", "SparkAgentTransport", "CONNECT_TIMEOUT_SECS"]

CONNECT_TIMEOUT_SECS = 10.0


@dataclass(frozen=True)
class AgentTarget(HostTarget):
    """An executor's host, reached through its agent at ``address:agent_port``; ``gpus``: the
    addresses of the GPUs Spark gave the executor."""

    agent_port: int = 0
    token: str = ""
    kind: str = "spark"
    gpus: tuple[str, ...] = ()


class SparkAgentTransport(Transport):
    """Runs the shared sh scripts through the agent of one Spark executor."""

    kind = "spark"

    def __init__(self, target: HostTarget) -> None:
        super().__init__(target)
        if not isinstance(target, AgentTarget) or not target.agent_port:
            raise BackendError(f"host {target.name}: no Spark agent is known for it")
        self.agent: AgentTarget = target

    @property
    def python(self) -> str:
        return self.target.python or "python3"

    def _connect(self, timeout: float | None) -> socket.socket:
        try:
            sock = socket.create_connection(
                (self.agent.address, self.agent.agent_port), timeout=CONNECT_TIMEOUT_SECS
            )
        except OSError as exc:
            raise BackendError(
                f"host {self.target.name}: its Spark agent at {self.agent.address}:"
                f"{self.agent.agent_port} does not answer ({exc.strerror or exc}): the executor "
                "may be gone"
            ) from exc
        sock.settimeout(timeout)
        return sock

    def _request(self, sock: socket.socket, header: dict[str, Any], payload: bytes = b"") -> None:
        sock.sendall(json.dumps({**header, "token": self.agent.token}).encode() + b"\n" + payload)

    def _run(self, script: str, stdin: bytes | None, timeout: float) -> CommandResult:
        argv, data = _scripts.shell_invocation(script, stdin)
        payload = data or b""
        sock = self._connect(timeout + 5.0)
        try:
            self._request(
                sock,
                {"op": "run", "args": argv[1:], "stdin": len(payload), "timeout": timeout},
                payload,
            )
            header = json.loads(read_line(sock))
            if "error" in header:
                raise BackendError(
                    f"host {self.target.name}: the Spark agent refused: {header['error']}"
                )
            body = read_exact(sock, int(header["out"]) + int(header["err"]))
        except (OSError, ValueError, ConnectionError) as exc:
            raise BackendError(
                f"host {self.target.name}: the Spark agent did not answer a command: {exc}"
            ) from exc
        finally:
            sock.close()
        out = int(header["out"])
        result = CommandResult(int(header["rc"]), body[:out], body[out:])
        if result.returncode == 124 and b"agent: timed out" in result.stderr:
            raise BackendError(
                f"host {self.target.name}: a command timed out after {timeout:.0f}s: "
                "the machine may be overloaded"
            )
        return result

    def _start(self, spec: LaunchSpec) -> Launched:
        return self._start_by_script(spec)

    def _open_stream(self, script: str) -> StreamPipe:
        sock = self._connect(None)
        try:
            self._request(sock, {"op": "stream", "script": script})
        except OSError as exc:
            sock.close()
            raise BackendError(f"host {self.target.name}: could not start a stream: {exc}") from exc

        def read_chunk() -> bytes:
            try:
                return sock.recv(65536)
            except OSError:
                return b""

        def write(data: bytes) -> None:
            sock.sendall(data)

        def end_input() -> None:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

        def force_close() -> None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

        return StreamPipe(read_chunk, write, end_input, force_close)

    def _close(self) -> None:
        pass

    def ping(self) -> dict[str, Any]:
        """What the agent says of itself (pid, python, hostname, address).

        Raises:
            BackendError: it does not answer.
        """
        sock = self._connect(CONNECT_TIMEOUT_SECS)
        try:
            self._request(sock, {"op": "ping"})
            answer: dict[str, Any] = json.loads(read_line(sock))
        except (OSError, ValueError, ConnectionError) as exc:
            raise BackendError(
                f"host {self.target.name}: the Spark agent did not answer: {exc}"
            ) from exc
        finally:
            sock.close()
        if "error" in answer:
            raise BackendError(
                f"host {self.target.name}: the Spark agent refused: {answer['error']}"
            )
        return answer
