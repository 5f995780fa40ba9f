"""The process backend: every task is a process on a host tfplan reaches itself.

Hosts are listed in the cluster config (``cluster.hosts``). Loopback hosts use the local
transport (``subprocess``), the others SSH (Fabric); both run the same POSIX scripts, so tasks
start detached in their own process group, record their exit code in their workdir, and are
stopped by process group, never by name.

Handle: ``{"pid": ..., "pgid": ...}`` of the task's wrapper, the leader of its process group;
a warm standby's (and a task that was one) adds ``"exit_file"``, its own exit record in the
task's workdir; a task forked from a warm seed (:mod:`tfplan.backends.transports.seeds`, a sweep's) adds
``"forked": true``: its PID is the program's own; it records its exit status itself (the seed
when a signal ended it).

Every process of a task is in its group: a stop signals the group, so it reaches the program
whichever of the wrapper and the program died first. A wrapper that died while its program runs
on is reported ``running`` and ``readopted`` (the host's watcher follows the program until its
group is empty; its exit status is then unknown); a forked task's program that died leaving
processes in its group is ``failed`` with ``detail`` saying how many are left.

- :mod:`.target`    ``cluster.hosts`` checked and resolved into places and transports (pure)
- :mod:`.outputs`   whether the hosts share the output folder; its files fetched back
- :mod:`.firewall`  ``cluster.firewall``: rules shown, checked, installed and removed per host
- :mod:`.seeds`     warm seeds: started at allocate, tasks forked from them, stopped at release
- :mod:`.running`   launched tasks, one round trip per host: state, stop, files, ports, logs
- :mod:`.shell`     one host's shell: a script's output, a folder's free space
- :mod:`.backend`   :class:`ProcessBackend`: the lifecycle, delegating to the modules above
"""

from tfplan.backends.process.backend import ProcessBackend
from tfplan.backends.process.outputs import FETCH_MAX_KIB, FETCH_SKIP, unpack_tree
from tfplan.backends.process.seeds import allocation_seeds
from tfplan.backends.process.target import host_name

__all__ = [
    "FETCH_MAX_KIB",
    "FETCH_SKIP",
    "ProcessBackend",
    "allocation_seeds",
    "host_name",
    "unpack_tree",
]
