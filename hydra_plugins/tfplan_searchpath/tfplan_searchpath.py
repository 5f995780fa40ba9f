"""Hydra takes search path plugins only from the ``hydra_plugins`` namespace package: this one
puts tfplan's own ``conf/`` right after a primary config folder that holds only the user's
groups (``conf/cluster/mine.yaml``, no config.yaml), so that ``cluster=mine`` is found, the
user's file wins over tfplan's of the same name, and config.yaml and the rest are tfplan's.

It acts on every Hydra initialisation in the process, so a sweep's points find the user's
groups as ``tfplan plan`` does; a folder with its own config.yaml is a whole tree, left alone.
"""

from __future__ import annotations

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.plugins.search_path_plugin import SearchPathPlugin

from tfplan.config.compose import groups_over

__all__ = ["TfplanSearchPath"]


class TfplanSearchPath(SearchPathPlugin):
    """Appends tfplan's ``conf/`` after the primary folder when that one is only groups."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        main = next((e.path for e in search_path.get_path() if e.provider == "main"), None)
        below = groups_over(main)
        if below is not None:
            search_path.append("tfplan", f"file://{below}", anchor=SearchPathQuery(provider="main"))
