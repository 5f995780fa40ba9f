"""The host watcher: one process per host follows every task tfplan watches there.

This file is a standalone program (standard library only, Python 3.6+): the transport runs it
on the host as ``python3 -u -c <this file's text>`` over one pipe (local) or one SSH channel,
so observing N tasks costs one process and one connection per host, not a shell loop, a
``ps`` poll and a ``tail`` per task.

Protocol. Commands arrive on stdin, one JSON object per line:

- ``{"op": "follow", "id": K, "log": PATH, "pid": P, "pgid": G, "exit": EXIT_FILE, "adopt": A}``:
  deliver the log from its first byte; report the end once process ``P`` (the task's wrapper)
  is gone; with ``A`` true, a wrapper gone without an exit status while processes of its group
  run on (its program, orphaned) is not an end: the agent follows the group's lowest live PID
  instead (re-adopted) until the group is empty;
- ``{"op": "drop", "id": K}``: stop following ``K`` (no end is reported).

Events go to stdout, one per line (``K`` has no spaces):

- ``L K <line>``: a whole line of ``K``'s log (raw bytes, no newline);
- ``A K <pid> <live processes in its group>``: ``K``'s wrapper is gone, its program runs on:
  followed now by that PID;
- ``X K <exit code or -> <live processes left in its group>``: ``K``'s wrapper is gone (and,
  re-adopted, every process of its group) and its log was delivered to the end;
- ``H``: a heartbeat, every second, so the reader knows the host still answers.

Events, not polling: each wrapper's exit is a ``pidfd`` becoming readable, each log write an
inotify event; where either is missing (old kernels or Pythons; or ``TFPLAN_WATCH_POLL=1`` in
its environment, for tests) the agent checks the files and processes itself every quarter
second, still in one process. stdin's end (the caller went away)
ends the agent; the tasks are never touched.
"""

import ctypes
import ctypes.util
import errno
import json
import os
import resource
import select
import struct
import sys
import time

HEARTBEAT_SECS = 1.0
FALLBACK_POLL_SECS = 0.25
READ_CHUNK = 1 << 16
MAX_LINE = 1 << 20  # a longer run of bytes without a newline is delivered as a line
IN_MODIFY = 0x2
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000


def _raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass


class Inotify:
    """inotify through libc (ctypes): a watch per followed log, one fd for all of them."""

    def __init__(self):
        self.fd = -1
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            self._add = libc.inotify_add_watch
            self._rm = libc.inotify_rm_watch
            fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        except (OSError, AttributeError):
            return
        self.fd = fd if fd >= 0 else -1

    def add(self, path):
        if self.fd < 0:
            return -1
        return self._add(self.fd, path.encode(), IN_MODIFY)

    def remove(self, wd):
        if self.fd >= 0 and wd >= 0:
            self._rm(self.fd, wd)

    def read(self):
        """The watch descriptors with events since the last read."""
        wds = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EINTR):
                    return wds
                raise
            if not data:
                return wds
            at = 0
            while at + 16 <= len(data):
                wd, _mask, _cookie, size = struct.unpack_from("iIII", data, at)
                wds.add(wd)
                at += 16 + size


class Followed:
    def __init__(self, key, log, pid, pgid, exit_file, adopt=False):
        self.key = key
        self.adopt = adopt
        self.log = log
        self.pid = pid
        self.pgid = pgid
        self.exit_file = exit_file
        self.fd = -1  # the log, open for reading (follows the file, not the name)
        self.wd = -1
        self.pidfd = -1
        self.buffer = b""


def _proc_stat(pid):
    """(state, pgid, threads) of a process, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[2]), int(fields[17])


def _live(state, threads):
    # a zombie whose other threads still run still holds its files (see scripts._live)
    return state != "Z" or threads > 1


def _alive(task):
    stat = _proc_stat(task.pid)
    return stat is not None and stat[1] == task.pgid and stat[0] != "Z"


def _members_by_group():
    """pgid -> PIDs of its live processes, one pass over /proc."""
    members = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _proc_stat(int(name))
            if stat is not None and _live(stat[0], stat[2]):
                members.setdefault(stat[1], []).append(int(name))
    return members


def _exit_code(path):
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return "-"
    return text if text.lstrip("-").isdigit() else "-"


class Agent:
    def __init__(self, out):
        self.out = out
        self.tasks = {}  # key -> Followed
        self.by_wd = {}  # inotify wd -> set of keys
        self.by_pidfd = {}  # pidfd -> key
        polling = os.environ.get("TFPLAN_WATCH_POLL") == "1"
        self.inotify = Inotify() if not polling else None
        self.poll = select.poll()
        self.poll.register(0, select.POLLIN)
        if self.inotify is not None and self.inotify.fd >= 0:
            self.poll.register(self.inotify.fd, select.POLLIN)
        self.pidfds = hasattr(os, "pidfd_open") and not polling
        self.stdin = b""
        self.pending = []  # output chunks
        self.ending = []  # keys whose wrapper is gone: report once the log is read

    # ---- commands -------------------------------------------------------------------
    def command(self, line):
        try:
            cmd = json.loads(line)
        except ValueError:
            return
        key = str(cmd.get("id"))
        if cmd.get("op") == "follow":
            self.drop(key)
            task = Followed(
                key,
                cmd["log"],
                int(cmd["pid"]),
                int(cmd["pgid"]),
                cmd.get("exit"),
                bool(cmd.get("adopt")),
            )
            self.tasks[key] = task
            self.open_log(task)
            if task.fd >= 0:
                self.read_log(task)  # what it wrote before it was followed
            self.watch_pid(task)
            if not _alive(task):  # gone already (or its PID now belongs to another process)
                self.ending.append(key)
        elif cmd.get("op") == "drop":
            self.drop(key)

    def watch_pid(self, task):
        """Learn of ``task.pid``'s end from a pidfd (where there are pidfds)."""
        if task.pidfd >= 0:
            if self.by_pidfd.pop(task.pidfd, None) is not None:
                self.poll.unregister(task.pidfd)
            os.close(task.pidfd)
            task.pidfd = -1
        if self.pidfds:
            try:
                task.pidfd = os.pidfd_open(task.pid)
            except OSError:
                task.pidfd = -1
            if task.pidfd >= 0:
                self.by_pidfd[task.pidfd] = task.key
                self.poll.register(task.pidfd, select.POLLIN)

    def open_log(self, task):
        try:
            task.fd = os.open(task.log, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        task.wd = self.inotify.add(task.log) if self.inotify is not None else -1
        if task.wd >= 0:
            self.by_wd.setdefault(task.wd, set()).add(task.key)

    def drop(self, key):
        task = self.tasks.pop(key, None)
        if task is None:
            return
        if task.fd >= 0:
            os.close(task.fd)
        if task.wd >= 0:
            keys = self.by_wd.get(task.wd, set())
            keys.discard(key)
            if not keys:
                self.by_wd.pop(task.wd, None)
                if self.inotify is not None:
                    self.inotify.remove(task.wd)
        if task.pidfd >= 0:
            if self.by_pidfd.pop(task.pidfd, None) is not None:
                self.poll.unregister(task.pidfd)
            os.close(task.pidfd)

    # ---- events ---------------------------------------------------------------------
    def read_log(self, task, final=False):
        if task.fd < 0:
            self.open_log(task)
            if task.fd < 0:
                return
        while True:
            data = os.read(task.fd, READ_CHUNK)
            if not data:
                break
            task.buffer += data
            *lines, task.buffer = task.buffer.split(b"\n")
            for line in lines:
                self.emit(b"L %s %s\n" % (task.key.encode(), line))
            if len(task.buffer) > MAX_LINE:
                self.emit(b"L %s %s\n" % (task.key.encode(), task.buffer))
                task.buffer = b""
        if final and task.buffer:
            self.emit(b"L %s %s\n" % (task.key.encode(), task.buffer))
            task.buffer = b""

    def emit(self, data):
        self.pending.append(data)
        if len(self.pending) > 256:
            self.flush()

    def flush(self):
        if self.pending:
            self.out.write(b"".join(self.pending))
            self.out.flush()
            self.pending = []

    def finish_ended(self):
        """Deliver the ended tasks' last lines, then their ends (one /proc pass for all)."""
        keys = [k for k in dict.fromkeys(self.ending) if k in self.tasks]
        self.ending = []
        if not keys:
            return
        members = _members_by_group()
        for key in keys:
            task = self.tasks[key]
            code = _exit_code(task.exit_file) if task.exit_file else "-"
            group = sorted(members.get(task.pgid, ()))
            if code == "-" and task.adopt and group:
                # the wrapper is gone and left no status: its program (the group's first
                # process) runs on, and is followed instead of being reported ended
                task.pid = group[0]
                self.watch_pid(task)
                self.emit(b"A %s %d %d\n" % (key.encode(), task.pid, len(group)))
                if not _alive(task):
                    self.ending.append(key)
                continue
            self.read_log(task, final=True)
            self.emit(b"X %s %s %d\n" % (key.encode(), code.encode(), len(group)))
            self.drop(key)

    def check_without_events(self):
        """Where inotify or pidfds are missing: look at every followed task."""
        for task in list(self.tasks.values()):
            if task.wd < 0:
                self.read_log(task)
            if task.pidfd < 0 and not _alive(task):
                self.ending.append(task.key)

    def run(self):
        last_beat = 0.0
        fallback = self.inotify is None or self.inotify.fd < 0 or not self.pidfds
        while True:
            now = time.monotonic()
            if now - last_beat >= HEARTBEAT_SECS:
                self.emit(b"H\n")
                last_beat = now
            self.flush()
            wait = FALLBACK_POLL_SECS if fallback or self.some_unwatched() else HEARTBEAT_SECS
            try:
                ready = self.poll.poll(wait * 1000)
            except InterruptedError:
                continue
            for fd, _event in ready:
                if fd == 0:
                    data = os.read(0, READ_CHUNK)
                    if not data:
                        self.flush()
                        return
                    self.stdin += data
                    *lines, self.stdin = self.stdin.split(b"\n")
                    for line in lines:
                        if line.strip():
                            self.command(line)
                elif self.inotify is not None and fd == self.inotify.fd:
                    for wd in self.inotify.read():
                        for key in list(self.by_wd.get(wd, ())):
                            self.read_log(self.tasks[key])
                elif fd in self.by_pidfd:
                    self.ending.append(self.by_pidfd.pop(fd))
                    self.poll.unregister(fd)
            if fallback or self.some_unwatched():
                self.check_without_events()
            self.finish_ended()

    def some_unwatched(self):
        return any(t.fd < 0 or t.wd < 0 or t.pidfd < 0 for t in self.tasks.values())


def main():
    _raise_fd_limit()
    try:
        Agent(sys.stdout.buffer).run()
    except (BrokenPipeError, KeyboardInterrupt):
        pass


if __name__ == "__main__":
    main()
