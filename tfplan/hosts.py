"""One executor per host of a plan or a state, opened lazily and closed together."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from types import TracebackType

from tfplan.executors import Executor, HostTarget, executor_for
from tfplan.plan import HostSpec

__all__ = ["HostPool", "target_of"]


def target_of(host: HostSpec) -> HostTarget:
    return HostTarget(
        name=host.name,
        address=host.address,
        ssh_user=host.ssh_user,
        ssh_port=host.ssh_port,
        ssh_key=host.ssh_key,
        python=host.python,
        accept_new_host_keys=host.accept_new_host_keys,
        known_hosts=host.known_hosts,
        kind=host.executor,
    )


class HostPool:
    """Executors by host name; ``with HostPool(hosts) as pool: pool[name].start(...)``."""

    def __init__(self, hosts: Iterable[HostSpec]) -> None:
        self.hosts = {h.name: h for h in hosts}
        self._open: dict[str, Executor] = {}
        self._lock = threading.Lock()  # tasks are stopped from several threads at once

    def __getitem__(self, name: str) -> Executor:
        with self._lock:
            if name not in self._open:
                self._open[name] = executor_for(target_of(self.hosts[name]))
            return self._open[name]

    def targets(self, names: Iterable[str]) -> list[HostTarget]:
        return [target_of(self.hosts[n]) for n in names]

    def close(self) -> None:
        for executor in self._open.values():
            try:
                executor.close()
            except Exception:  # noqa: BLE001 - closing must never hide the real outcome
                pass
        self._open.clear()

    def __enter__(self) -> HostPool:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
