"""Fan-out over hosts: a partial failure is data (like Fabric's ``GroupResult``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

from tfplan.errors import BackendError

__all__ = ["HostResults", "run_on_hosts"]

K = TypeVar("K")
T = TypeVar("T")


class HostResults(dict[str, "T | Exception"], Generic[T]):
    """Host name -> the value ``fn`` returned there, or the exception it raised."""

    @property
    def succeeded(self) -> dict[str, T]:
        return {h: r for h, r in self.items() if not isinstance(r, Exception)}

    @property
    def failed(self) -> dict[str, Exception]:
        return {h: r for h, r in self.items() if isinstance(r, Exception)}

    def raise_if_failed(self, what: str) -> dict[str, T]:
        """Return the values, or raise one error naming every host that failed.

        Raises:
            BackendError: ``what`` failed on at least one host.
        """
        failed = self.failed
        if failed:
            detail = "; ".join(f"{h}: {e}" for h, e in sorted(failed.items()))
            raise BackendError(f"{what} failed on {len(failed)} of {len(self)} host(s): {detail}")
        return self.succeeded


def run_on_hosts(
    items: Mapping[str, K], fn: Callable[[K], T], max_workers: int = 32
) -> HostResults[T]:
    """Call ``fn`` once per host, concurrently, and collect every outcome.

    Args:
        items: host name -> what ``fn`` gets (a Transport, a HostTarget, ...).
        fn: the work for one host.
        max_workers: threads at most.

    Returns:
        Host name -> result or the Exception raised (KeyboardInterrupt etc. still propagate),
        in the order of ``items``.
    """
    results: HostResults[T] = HostResults()
    if not items:
        return results
    with ThreadPoolExecutor(max_workers=min(max_workers, len(items))) as pool:
        futures = {name: pool.submit(fn, item) for name, item in items.items()}
        for name, future in futures.items():
            try:
                results[name] = future.result()
            except Exception as exc:  # noqa: BLE001 - a failed host is data here
                results[name] = exc
    return results
