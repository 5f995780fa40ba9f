"""The Kubernetes backend: one Job per task under a headless Service (``cluster=k8s``).

- :mod:`.options`    ``cluster.options`` checked and resolved; the objects' names (pure)
- :mod:`.manifests`  ConfigMap, Service, Jobs (pure; what apply creates, ``--format jobs``)
- :mod:`.replicated` one JobSet or one TFJob for ``tfplan export`` (pure)
- :mod:`.export`     ``tfplan export kubernetes``: a saved plan as YAML
- :mod:`.client`     the official ``kubernetes`` client (imported only to talk to a cluster)
- :mod:`.backend`    :class:`KubernetesBackend`: apply, status, logs, destroy through the API
"""

from tfplan.backends.kubernetes.backend import KubernetesBackend
from tfplan.backends.kubernetes.export import FORMATS, export_manifests, to_yaml

__all__ = ["FORMATS", "KubernetesBackend", "export_manifests", "to_yaml"]
