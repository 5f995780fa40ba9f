"""One transport per host, opened lazily and closed together."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Iterable
from types import TracebackType

from tfplan.backends.transports.base import Transport
from tfplan.backends.transports.specs import HostTarget
from tfplan.errors import BackendError

__all__ = ["TRANSPORTS", "TransportPool", "transport_for"]

# kind -> "module:class", imported on first use (SSH pulls in paramiko and Fabric)
TRANSPORTS: dict[str, str] = {
    "local": "tfplan.backends.transports.local:LocalTransport",
    "ssh": "tfplan.backends.transports.ssh:SSHTransport",
}


def transport_for(target: HostTarget) -> Transport:
    """The transport for one host (not yet connected: SSH connects on first use).

    Raises:
        BackendError: the kind is not one of the registered ones.
    """
    kind = target.resolved_kind()
    if kind not in TRANSPORTS:
        raise BackendError(
            f"host {target.name}: unknown transport {kind!r}; available: auto, "
            + ", ".join(sorted(TRANSPORTS))
        )
    module_name, class_name = TRANSPORTS[kind].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    transport: Transport = cls(target)
    return transport


class TransportPool:
    """Transports by host name: ``pool[name].start(...)``; thread-safe."""

    def __init__(self, targets: Iterable[HostTarget]) -> None:
        self.targets = {t.name: t for t in targets}
        self._open: dict[str, Transport] = {}
        self._lock = threading.Lock()  # tasks are stopped from several threads at once

    def __getitem__(self, name: str) -> Transport:
        with self._lock:
            if name not in self._open:
                if name not in self.targets:
                    raise BackendError(
                        f"host {name} is not one of this cluster's hosts "
                        f"({', '.join(self.targets)}): was the state written by another plan?"
                    )
                self._open[name] = self._make(self.targets[name])
            return self._open[name]

    def _make(self, target: HostTarget) -> Transport:
        """A new transport to ``target`` (a pool of other transports overrides it)."""
        return transport_for(target)

    def close(self) -> None:
        for transport in self._open.values():
            try:
                transport.close()
            except Exception:  # noqa: BLE001 - closing must never hide the real outcome
                pass
        self._open.clear()

    def __enter__(self) -> TransportPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
