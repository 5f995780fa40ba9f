"""The official ``kubernetes`` client, connected through a kubeconfig, with one-line errors.

Imported only when the backend talks to a cluster (apply, status, logs, destroy): planning and
exporting need no client. Every API failure becomes a :class:`KubeError` (a
:class:`~tfplan.errors.BackendError`) whose message names the call, the HTTP status and the
API server's own reason.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tfplan.backends.kubernetes.options import KubeOptions
from tfplan.errors import BackendError

__all__ = ["REQUEST_TIMEOUT_SECS", "Kube", "KubeError", "kubeconfig_path"]

REQUEST_TIMEOUT_SECS = 15.0
T = TypeVar("T")


class KubeError(BackendError):
    """An API call failed; ``status`` is the HTTP status (None: the API was not reached)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        self.status = status
        super().__init__(message)


def kubeconfig_path(opts: KubeOptions) -> Path:
    """``cluster.options.kubeconfig``, else the first file of ``$KUBECONFIG``, else
    ``~/.kube/config`` (what kubectl reads)."""
    if opts.kubeconfig:
        return Path(opts.kubeconfig).expanduser()
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return Path(env[0]).expanduser() if env else Path.home() / ".kube" / "config"


class Kube:
    """The API groups the backend uses, on one connection pool.

    Raises:
        KubeError: no kubeconfig, or it lacks the context asked for.
    """

    def __init__(self, opts: KubeOptions) -> None:
        try:
            from kubernetes import client, config
            from kubernetes.config.config_exception import ConfigException
        except ImportError:
            raise KubeError(
                "the kubernetes client is not installed: pip install 'tfplan[kubernetes]' "
                "(tfplan plan and tfplan export work without it)"
            ) from None

        path = kubeconfig_path(opts)
        if not path.is_file():
            raise KubeError(
                f"no kubeconfig at {path}: tfplan apply on Kubernetes needs one (set KUBECONFIG "
                "or cluster.options.kubeconfig; `kubectl config view` shows what it holds)"
            )
        configuration = client.Configuration()
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(path), context=opts.context, client_configuration=configuration
            )
        except (ConfigException, OSError, ValueError, TypeError) as error:
            where = f"context {opts.context!r} of " if opts.context else ""
            raise KubeError(
                f"cannot use {where}kubeconfig {path}: {_one_line(str(error))}"
            ) from None
        configuration.retries = 1
        self.host = configuration.host
        self.client = client
        # Typed as Any: the backend reads a few fields of the models, all optional there.
        self.api: Any = client.ApiClient(configuration)
        self.core: Any = client.CoreV1Api(self.api)
        self.batch: Any = client.BatchV1Api(self.api)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` with a timeout; errors as :class:`KubeError`."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_SECS)
        try:
            return fn(*args, **kwargs)
        except ApiException as error:
            raise KubeError(f"{what}: {_reason(error)}", error.status) from None
        except (HTTPError, OSError) as error:
            raise KubeError(
                f"{what}: the Kubernetes API at {self.host} does not answer ({_one_line(str(error))})"
            ) from None

    def model(self, kind: str, body: dict[str, Any]) -> Any:
        """``body`` as the client's model ``kind`` (V1Job, V1Service, ...)."""
        cls = getattr(self.client, kind)
        if hasattr(cls, "from_dict"):  # kubernetes >= 36: pydantic models
            return cls.from_dict(body)
        return self.api.deserialize(_Response(json.dumps(body)), kind)

    def close(self) -> None:
        self.api.close()


class _Response:
    """What ``ApiClient.deserialize`` reads: an object with the JSON in ``data``."""

    def __init__(self, data: str) -> None:
        self.data = data


def _reason(error: Any) -> str:
    status = f"{error.status} {error.reason or ''}".strip()
    try:
        message = json.loads(error.body or "{}").get("message")
    except (TypeError, ValueError, AttributeError):
        message = None
    return f"{status}: {_one_line(message)}" if message else status


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
