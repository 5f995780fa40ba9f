"""Start a task forked from its node's warm seed, from inside a step of its own.

Run on the node as ``python -S seed_client.py SEED_FOLDER REQUEST_FILE`` (stdlib only, started
in milliseconds) by a scheduler that gives every task a step of its own (Slurm: the step's
``srun`` forwards its output to the task's log, ``scancel JOB.STEP`` signals it, its end is the
task's end). The client is the step's task; the program is forked by the node's seed
(:mod:`.seed_agent`), so it runs without importing TensorFlow again, and the client stands for
it in the step:

- the request (``argv``, ``workdir``) comes from REQUEST_FILE; the environment is the client's
  own, whole (what the step gives a task, the scheduler's variables included); the program's
  output goes to the client's own stdout (``/proc/<client>/fd/1``: the step's pipe, so the
  scheduler forwards it as it would the task's);
- signals the step gets (TERM, INT, HUP, QUIT, USR1, USR2, ALRM) are passed on to the program's
  process group;
- the program watches the client (``owner``): a client killed outright (SIGKILL, the step
  cancelled) takes the program's group with it at once, so nothing outlives its step;
- the client exits with the program's exit status (recorded by the program, or by the seed for a
  program killed by a signal: 128+N).

A seed that is gone, never got ready, or cannot fork: one line on stderr, then the client
``exec``s the program itself: a cold start in the same step, same output, same status.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from typing import Any

FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGALRM,
)
IMPORT_WAIT_SECS = 180.0  # a seed still importing is waited for: a cold start would race it
ANSWER_WAIT_SECS = 30.0  # a ready seed answers within milliseconds
TAKEN_WAIT_SECS = 20.0  # more, for a request the seed took: it answers once the child leads
EXIT_WAIT_SECS = 10.0  # for the seed to record the status of a program killed by a signal
UNKNOWN_EXIT = 137  # no record at all (the seed gone too): counted as killed


def _say(text: str) -> None:
    print(f"tfplan: {text}", file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def _seed_pid(folder: str, deadline: float) -> int | str:
    """The seed's PID once it is ready, or why not (gone, still importing at the deadline)."""
    while True:
        ready = _read(os.path.join(folder, "ready")).split()
        if ready and ready[0].isdigit():
            return int(ready[0])
        started = _read(os.path.join(folder, "started"))
        if started.isdigit() and not _alive(int(started)):
            return "is gone"
        if time.monotonic() > deadline:
            return f"was still importing after {IMPORT_WAIT_SECS:.0f}s"
        time.sleep(0.05)


def _fork(folder: str, request: dict[str, Any]) -> int | str:
    """Ask the seed in ``folder`` for the program: its PID, or why it was not forked."""
    seed = _seed_pid(folder, time.monotonic() + IMPORT_WAIT_SECS)
    if isinstance(seed, str):
        return seed
    token = f"step-{os.getpid()}-{int(time.time() * 1000)}"
    path = os.path.join(folder, "requests", f"{token}.json")
    answer = path[: -len(".json")] + ".pid"
    _write_atomic(path, json.dumps(request))
    try:
        os.kill(seed, signal.SIGUSR1)
    except ProcessLookupError:
        os.unlink(path)
        return "is gone"
    deadline = time.monotonic() + ANSWER_WAIT_SECS
    while not _read(answer):
        if not _alive(seed):
            _withdraw(path)
            return "is gone"
        if time.monotonic() > deadline:
            if _withdraw(path):
                return "did not answer"
            # taken (the seed removes a request before it forks): the program is being forked;
            # a cold start beside it would run it twice, so its answer is waited for
            if time.monotonic() > deadline + TAKEN_WAIT_SECS:
                return f"took the request but did not answer within {TAKEN_WAIT_SECS:.0f}s more"
        time.sleep(0.005)
    text = _read(answer)
    os.unlink(answer)
    return int(text) if text.isdigit() else f"could not fork it ({text})"


def _withdraw(request: str) -> bool:
    """Remove a request the seed has not taken; False when it had (it is being forked)."""
    try:
        os.unlink(request)
    except OSError:
        return False
    return True


def _wait_gone(pid: int) -> None:
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while _alive(pid):
            time.sleep(0.2)
        return
    try:
        while not select.select([fd], [], [], 1.0)[0]:
            pass
    finally:
        os.close(fd)


def _exit_status(exit_file: str) -> int:
    deadline = time.monotonic() + EXIT_WAIT_SECS
    while True:
        text = _read(exit_file)
        if text.lstrip("-").isdigit():
            # left in place: the seed may still write it once more when it reaps the program
            # (it does when it finds no record), and the next fork of this life removes it
            return int(text)
        if time.monotonic() > deadline:
            return UNKNOWN_EXIT
        time.sleep(0.02)


def main(argv: list[str]) -> None:
    folder, request_file = argv
    with open(request_file) as f:
        request = json.load(f)
    me = os.getpid()
    exit_file = f"{os.path.splitext(request_file)[0]}.exit"
    request.update(
        env=dict(os.environ),
        env_whole=True,
        log_path=f"/proc/{me}/fd/1",
        log_append=True,
        exit_file=exit_file,
        owner=me,
    )
    # blocked until the program exists: a signal before then is passed on once it does
    signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))
    program = _fork(folder, request)
    if isinstance(program, str):
        _say(f"the warm seed on this node {program}; a cold start")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, set(FORWARDED))
        os.chdir(request["workdir"])
        os.execvp(request["argv"][0], request["argv"])

    def forward(signum: int, frame: object) -> None:
        try:
            os.killpg(program, signum)
        except ProcessLookupError:
            pass

    for signum in FORWARDED:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(FORWARDED))
    _wait_gone(program)
    sys.stdout.flush()
    os._exit(_exit_status(exit_file))


if __name__ == "__main__":
    main(sys.argv[1:])
