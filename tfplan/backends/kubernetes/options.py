"""Pure: the Kubernetes backend's options (``cluster.options``) and the names of its objects.

Every check raises a one-line :class:`~tfplan.errors.ConfigError` naming
``cluster.options.<key>``. The resolved options travel in the plan's
:class:`~tfplan.planning.plan.BackendRef` (``KubeOptions.to_config``), so ``apply``, ``status``
and ``destroy`` in later processes build exactly the objects the plan showed.

Names (all derived from ``name``, a DNS label, and the namespace)::

    Service/<name>                  headless; the pods' subdomain
    ConfigMap/<name>-config         run.yaml (+ the recipes package with code=configmap)
    Job/<name>-<role>-<index>       one per task; its pod's hostname is the Job's name
    address                         <name>-<role>-<index>.<name>.<namespace>.svc[.<cluster_domain>]
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tfplan.errors import ConfigError
from tfplan.planning.plan import BackendRef

if TYPE_CHECKING:
    from tfplan.config.schema import ClusterConfig

__all__ = [
    "CODE_MODES",
    "CONTAINER",
    "LABEL_EXPERIMENT",
    "LABEL_ROLE",
    "LABEL_TASK",
    "PULL_POLICIES",
    "ROLES",
    "KubeOptions",
    "dns_label",
    "parse_options",
]

ROLES = ("ps", "chief", "worker", "evaluator")
CODE_MODES = ("configmap", "image")
PULL_POLICIES = ("IfNotPresent", "Always", "Never")
CONTAINER = "tensorflow"  # TFJob requires this container name; the same everywhere
PORT_NAME = "tfjob-port"  # TFJob reads the port from the container port of this name
LABEL_EXPERIMENT = "tfplan/experiment"
LABEL_TASK = "tfplan/task"
LABEL_ROLE = "tfplan/role"
MAX_NAME = 40  # <name>-evaluator-0 and JobSet's <name>-<role>-<i>-0 stay within 63 characters
_LABEL_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_QUANTITY_RE = re.compile(r"^[+-]?[0-9.]+([eEinumkKMGTP]*[-+]?[0-9]*)$")
_TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
_RESOURCE_KINDS = ("requests", "limits")


def dns_label(text: str, limit: int = MAX_NAME) -> str:
    """``text`` as a DNS-1035 label of at most ``limit`` characters (deterministic: a name that
    had to be changed or cut keeps a short digest of the original, so two ids stay apart)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    if not label or not label[0].isalpha():
        label = f"t-{label}".rstrip("-")
    if label == text and len(label) <= limit:
        return label
    digest = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{label[: limit - 7].rstrip('-')}-{digest}"


@dataclass(frozen=True)
class KubeOptions:
    """``cluster.options`` of a cluster with ``backend: kubernetes``, resolved and checked."""

    name: str = "tfplan"  # base of every object's name (conf/cluster/k8s.yaml: tfplan-<id>)
    namespace: str = "default"
    image: str = "tensorflow/tensorflow:latest"
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    code: str = "configmap"  # configmap: ship the recipes in a ConfigMap | image: they are in it
    python: str = "python3"  # the interpreter inside the image
    service_account: str | None = None
    resources: dict[str, dict[str, dict[str, str]]] = field(default_factory=dict)
    gpus: int = 0  # per training task (chief, workers)
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, Any], ...] = ()
    output_volume: str | None = None  # a PersistentVolumeClaim, mounted at output_dir
    kubeconfig: str | None = None  # default: $KUBECONFIG, else ~/.kube/config
    context: str | None = None  # default: the kubeconfig's current context
    port: int = 2222
    cluster_domain: str | None = None  # appended to addresses (".svc.<domain>") when set
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    ttl_seconds_after_finished: int | None = None  # exported manifests only
    # Not options: the cluster's folders, resolved by target() (absolute inside the container).
    workdir: str = "/tfplan"
    output_dir: str = "/tfplan-output"

    # ---- names ---------------------------------------------------------------------------
    @property
    def service(self) -> str:
        return self.name

    @property
    def config_map(self) -> str:
        return f"{self.name}-config"

    def job(self, role: str, index: int | str) -> str:
        """The Job of a task, and its pod's hostname."""
        return f"{self.name}-{role}-{index}"

    def address(self, role: str, index: int | str) -> str:
        """The task's stable DNS name: its pod's hostname under the headless Service."""
        return self.dns(f"{self.job(role, index)}.{self.service}")

    def dns(self, name: str) -> str:
        """``name`` (within the namespace) as a name every pod of the cluster resolves."""
        suffix = f".{self.cluster_domain}" if self.cluster_domain else ""
        return f"{name}.{self.namespace}.svc{suffix}"

    def labels_for(self, role: str | None = None, index: int | None = None) -> dict[str, str]:
        labels = {
            **self.labels,
            LABEL_EXPERIMENT: self.name,
            "app.kubernetes.io/managed-by": "tfplan",
        }
        if role is not None:
            labels[LABEL_ROLE] = role
            if index is not None:
                labels[LABEL_TASK] = f"{role}-{index}"
        return labels

    @property
    def selector(self) -> str:
        return f"{LABEL_EXPERIMENT}={self.name}"

    # ---- serialisation -------------------------------------------------------------------
    def to_config(self) -> dict[str, Any]:
        data = asdict(self)
        data["image_pull_secrets"] = list(self.image_pull_secrets)
        data["tolerations"] = [dict(t) for t in self.tolerations]
        return data

    @classmethod
    def from_ref(cls, ref: BackendRef) -> KubeOptions:
        data = dict(ref.config)
        data["image_pull_secrets"] = tuple(data.get("image_pull_secrets") or ())
        data["tolerations"] = tuple(dict(t) for t in data.get("tolerations") or ())
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


_OPTION_KEYS = tuple(
    k for k in KubeOptions.__dataclass_fields__ if k not in ("workdir", "output_dir")
)


def _err(key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"cluster.options.{key}" if key else "cluster.options", problem, fix)


def parse_options(cluster: ClusterConfig) -> KubeOptions:
    """Check ``cluster`` for the Kubernetes backend and resolve its options.

    Raises:
        ConfigError: an unknown option, a value of the wrong kind, hosts listed, a relative or
            overlapping folder, or a role count that needs hosts (``per_host``, ``per_gpu``).
    """
    raw = dict(cluster.options or {})
    for key in raw:
        if key not in _OPTION_KEYS:
            raise _err(key, "no such option", f"known: {', '.join(_OPTION_KEYS)}")
    _check_cluster(cluster)
    given = {k: v for k, v in raw.items() if v is not None}
    name = _text(given, "name", "tfplan")
    options = KubeOptions(
        name=dns_label(name),
        namespace=_label(given, "namespace", "default", 63),
        image=_text(given, "image", KubeOptions.image),
        image_pull_policy=_choice(given, "image_pull_policy", "IfNotPresent", PULL_POLICIES),
        image_pull_secrets=tuple(_strings(given, "image_pull_secrets")),
        code=_choice(given, "code", "configmap", CODE_MODES),
        python=_text(given, "python", "python3"),
        service_account=_optional_text(given, "service_account"),
        resources=_resources(given.get("resources") or {}),
        gpus=_count(given, "gpus", 0),
        gpu_resource=_text(given, "gpu_resource", "nvidia.com/gpu"),
        node_selector=_mapping(given, "node_selector"),
        tolerations=_tolerations(given.get("tolerations") or []),
        output_volume=_optional_text(given, "output_volume"),
        kubeconfig=_optional_text(given, "kubeconfig"),
        context=_optional_text(given, "context"),
        port=_port(given),
        cluster_domain=_domain(given),
        labels=_mapping(given, "labels"),
        annotations=_mapping(given, "annotations"),
        ttl_seconds_after_finished=(
            _count(given, "ttl_seconds_after_finished", 0)
            if "ttl_seconds_after_finished" in given
            else None
        ),
        workdir=posixpath.normpath(cluster.workdir),
        output_dir=posixpath.normpath(cluster.output_dir),
    )
    return options


def _check_cluster(cluster: ClusterConfig) -> None:
    if cluster.hosts:
        raise ConfigError(
            "cluster.hosts",
            "the kubernetes backend places one pod per task; it takes no hosts",
            "set cluster.hosts=[] (the scheduler picks the nodes; see cluster.options.node_selector)",
        )
    if cluster.ps == "per_host" or cluster.workers == "per_gpu":
        key = "cluster.ps" if cluster.ps == "per_host" else "cluster.workers"
        raise ConfigError(
            key,
            "per_host and per_gpu count hosts, and the kubernetes backend has none",
            "give a number (each worker gets cluster.options.gpus GPUs)",
        )
    for key in ("workdir", "output_dir"):
        value = getattr(cluster, key)
        if not value.startswith("/") or posixpath.normpath(value) == "/":
            raise ConfigError(
                f"cluster.{key}",
                f"{value!r} is not an absolute folder inside the container",
                "use an absolute path such as /tfplan (conf/cluster/k8s.yaml)",
            )
    work, out = posixpath.normpath(cluster.workdir), posixpath.normpath(cluster.output_dir)
    if posixpath.commonpath([work, out]) in (work, out):
        raise ConfigError(
            "cluster.output_dir",
            f"{out} and cluster.workdir {work} overlap (two volumes cannot be mounted one in the other)",
            "keep them apart, e.g. workdir=/tfplan and output_dir=/tfplan-output",
        )


def _text(given: dict[str, Any], key: str, default: str) -> str:
    value = given.get(key, default)
    if not isinstance(value, str) or not value.strip():
        raise _err(key, f"{value!r} is not a non-empty string", "give a string")
    return value


def _optional_text(given: dict[str, Any], key: str) -> str | None:
    return _text(given, key, "") if key in given else None


def _label(given: dict[str, Any], key: str, default: str, limit: int) -> str:
    value = _text(given, key, default)
    if len(value) > limit or not _LABEL_RE.match(value):
        raise _err(key, f"{value!r} is not a DNS label", "use lowercase letters, digits and '-'")
    return value


def _domain(given: dict[str, Any]) -> str | None:
    value = _optional_text(given, "cluster_domain")
    if value is not None and not _DOMAIN_RE.match(value):
        raise _err("cluster_domain", f"{value!r} is not a DNS domain", "e.g. cluster.local")
    return value


def _choice(given: dict[str, Any], key: str, default: str, choices: tuple[str, ...]) -> str:
    value = given.get(key, default)
    if value not in choices:
        raise _err(key, f"{value!r} is not one of {', '.join(choices)}", "use one of them")
    return str(value)


def _count(given: dict[str, Any], key: str, default: int) -> int:
    value = given.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _err(key, f"{value!r} is not a count", "give a whole number >= 0")
    return value


def _port(given: dict[str, Any]) -> int:
    value = _count(given, "port", 2222)
    if not 0 < value < 65536:
        raise _err("port", f"{value} out of range", "use 1-65535")
    return value


def _strings(given: dict[str, Any], key: str) -> list[str]:
    value = given.get(key) or []
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise _err(key, f"{value!r} is not a list of names", "give e.g. [my-registry-secret]")
    return list(value)


def _mapping(given: dict[str, Any], key: str) -> dict[str, str]:
    value = given.get(key) or {}
    if not isinstance(value, dict):
        raise _err(key, f"{value!r} is not a mapping", "give key: value pairs")
    return {str(k): str(v) for k, v in value.items()}


def _resources(value: Any) -> dict[str, dict[str, dict[str, str]]]:
    if not isinstance(value, dict):
        raise _err(
            "resources", f"{value!r} is not a mapping", f"give one per role: {', '.join(ROLES)}"
        )
    resolved: dict[str, dict[str, dict[str, str]]] = {}
    for role, kinds in value.items():
        key = f"resources.{role}"
        if role not in ROLES:
            raise _err(key, "no such role", f"known: {', '.join(ROLES)}")
        if not isinstance(kinds, dict):
            raise _err(key, f"{kinds!r} is not a mapping", "give requests: and limits:")
        resolved[role] = {}
        for kind, amounts in (kinds or {}).items():
            if kind not in _RESOURCE_KINDS:
                raise _err(f"{key}.{kind}", "no such field", "use requests or limits")
            if amounts is None:
                continue
            if not isinstance(amounts, dict):
                raise _err(
                    f"{key}.{kind}", f"{amounts!r} is not a mapping", "e.g. {cpu: 2, memory: 4Gi}"
                )
            for resource, amount in amounts.items():
                if isinstance(amount, bool) or not _QUANTITY_RE.match(str(amount)):
                    raise _err(
                        f"{key}.{kind}.{resource}",
                        f"{amount!r} is not a Kubernetes quantity",
                        "use e.g. 2, 500m, 4Gi",
                    )
            resolved[role][kind] = {str(r): str(a) for r, a in amounts.items()}
    return resolved


def _tolerations(value: Any) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, (list, tuple)):
        raise _err("tolerations", f"{value!r} is not a list", "give a list of tolerations")
    out = []
    for i, item in enumerate(value):
        key = f"tolerations[{i}]"
        if not isinstance(item, dict):
            raise _err(key, f"{item!r} is not a mapping", "e.g. {key: gpu, operator: Exists}")
        for field_name in item:
            if field_name not in _TOLERATION_KEYS:
                raise _err(
                    f"{key}.{field_name}", "no such field", f"known: {', '.join(_TOLERATION_KEYS)}"
                )
        out.append(dict(item))
    return tuple(out)
