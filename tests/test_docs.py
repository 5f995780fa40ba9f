"""Every documented command runs as written (issue "newcomer's path", item 2).

Why: a newcomer copies the commands of README.md, docs/*.md and examples/*/README.md in the order
the page gives them; a command that fails as written (a renamed key, a folder the page never
made, an output path stated wrongly) is the first thing they meet. So each fenced block whose
info string is ``bash`` is run, or is listed in tests/doc_exclusions.yaml with the reason it
cannot run here (no Kubernetes API server, hosts that do not exist, a user's own script, ...).

How a document runs (:func:`run_document`):

- in a fresh scratch copy of the repository (the working tree's files, tracked and untracked
  but not ignored), from the folder the page says (:func:`doc_folder`): the copy's root, an
  empty folder (the tutorial: "in an empty folder"), or the example's own folder;
- with the venv's ``bin`` first on ``PATH`` (``tfplan``, ``python``) and ``PYTHONPATH`` at the
  copy, so the copy's code runs (the venv's editable install points at the working tree);
- all of its blocks in order in one bash session, each block with ``set -e`` semantics (an ERR
  trap names the block, the command and its exit status); a failing command fails the test
  with the block, the command and the block's output;
- on a pseudo-terminal, as a user types them: ``tfplan apply`` asks for approval on a terminal,
  and the runner answers ``yes`` as the user would (only ``yes`` approves);
- with ``TFPLAN_MAX_STEPS_CAP`` set (tfplan/config/step_cap.py): training is shortened through
  the environment, never by editing a command.

At the end of each document, whatever it left running (a detached TensorBoard, a task a failed
command left behind) is killed by the process groups its states record and by a marker in the
environment of every process it started; the test then asserts that nothing is left.

Counts (blocks run and excluded per file) are printed (``-s``); ``python tests/test_docs.py``
prints them in the form of tests/doc_exclusions.yaml's header.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pty
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
EXCLUSIONS = Path(__file__).resolve().parent / "doc_exclusions.yaml"

# A few dozen steps: a documented run trains for seconds, and still checkpoints, logs, evaluates.
STEP_CAP = 40
# One document's whole session, at most: a bound for a hung session, not a speed limit. The
# sweeps page (19 clusters) takes 70 s on a quiet machine; in CI, niced beside the test beds, it
# once ran past 900 s while every point still trained at its usual speed between starts.
DOC_DEADLINE_SECS = 1800.0
# The environment variable every process a document starts inherits: what is left running at
# the end is found by it (besides the process groups the states record).
MARKER = "TFPLAN_DOCS_TEST_RUN"
# What tfplan's approval prints last (tfplan/cli/common.py approved()): the runner types yes.
PROMPT = b"Enter a value:"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^\s`]*)")
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07]*\x07|\x1b[()][A-Z0-9]|\x1b[=>]")


@dataclass(frozen=True)
class Block:
    """One fenced ``bash`` block of a document."""

    doc: str  # relative to the repository, e.g. docs/tutorial.md
    index: int  # 0-based among the document's bash blocks
    line: int  # 1-based line of its first line of text in the document
    text: str  # dedented, as a user pastes it

    @property
    def first_line(self) -> str:
        """Its first command: the first line that is neither blank nor a comment."""
        for line in self.text.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                return line.strip()
        return ""


def documents() -> list[str]:
    """The pages whose commands a newcomer runs: README.md, docs/*.md, examples/*/README.md."""
    found = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    found += sorted((REPO / "examples").glob("*/README.md"))
    return [str(p.relative_to(REPO)) for p in found if p.is_file()]


def bash_blocks(doc: str, root: Path = REPO) -> list[Block]:
    """The fenced blocks of ``doc`` whose info string is ``bash``, in order.

    A fence closes on a line of the same character, at least as long, with nothing after it
    (CommonMark), so a ```` ``` ```` inside a ````` ```` ````` block does not end it."""
    lines = (root / doc).read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        fence, info = opened.group("fence"), opened.group("info")
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            body.append(lines[i])
            i += 1
        start = i - len(body) + 1  # 1-based line of the body's first line
        if info == "bash":
            blocks.append(Block(doc, len(blocks), start, textwrap.dedent("\n".join(body))))
        i += 1
    return blocks


def load_entries(path: Path = EXCLUSIONS) -> list[dict[str, Any]]:
    """tests/doc_exclusions.yaml: a list of ``{file, block, first_line, reason}``; an entry
    with ``expect_error`` is no exclusion: its block runs and must fail with that text, as its
    page shows (a refusal the page demonstrates)."""
    data = yaml.safe_load(path.read_text()) or []
    assert isinstance(data, list), f"{path}: a list of entries"
    return data


def excluded(entries: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(file, block) -> reason, of the entries that exclude their block."""
    return {(e["file"], e["block"]): e["reason"] for e in entries if "expect_error" not in e}


def expected_errors(entries: list[dict[str, Any]]) -> dict[tuple[str, int], str]:
    """(file, block) -> the text the block's failure must print."""
    return {(e["file"], e["block"]): e["expect_error"] for e in entries if "expect_error" in e}


def counts() -> dict[str, tuple[int, int]]:
    """doc -> (blocks run, blocks excluded), for every document with a bash block."""
    skip = excluded(load_entries())
    out = {}
    for doc in documents():
        blocks = bash_blocks(doc)
        if blocks:
            n_excluded = sum((doc, b.index) in skip for b in blocks)
            out[doc] = (len(blocks) - n_excluded, n_excluded)
    return out


def counts_text() -> str:
    """The counts, one line per file and a total (tests/doc_exclusions.yaml's header)."""
    table = counts()
    width = max(len(doc) for doc in table)
    lines = [f"{doc:<{width}}  run {r:>2}  excluded {x:>2}" for doc, (r, x) in table.items()]
    run = sum(r for r, _ in table.values())
    skipped = sum(x for _, x in table.values())
    lines.append(f"{'total':<{width}}  run {run:>2}  excluded {skipped:>2}")
    return "\n".join(lines)


# ---- where a document runs ------------------------------------------------------------------

# The pages that say where their commands run, when it is not the repository's root.
_FOLDERS = {
    # "Every command below was run exactly as written, in an empty folder"
    "docs/tutorial.md": None,
    # "A conf/ folder in the folder you run tfplan from adds your own options": a user's
    # project folder, which holds no conf/ of tfplan's
    "docs/planning.md": None,
    # "Run tfplan in the project's folder" (section 9: "in examples/tabular")
    "docs/your_model.md": "examples/tabular",
}


def doc_folder(doc: str, copy: Path, scratch: Path) -> Path:
    """The folder ``doc``'s commands run from, in the scratch copy ``copy``: an example's
    README from its example's folder, a page that says so from an empty folder or the folder
    it names, anything else from the repository's root."""
    if doc.startswith("examples/"):
        return copy / Path(doc).parent
    if doc in _FOLDERS:
        named = _FOLDERS[doc]
        if named is None:
            empty = scratch / "empty"
            empty.mkdir()
            return empty
        return copy / named
    return copy


def scratch_copy(dest: Path) -> Path:
    """The working tree's files (tracked, and untracked unless ignored) copied to ``dest``:
    what a fresh clone of the working tree holds, without outputs, workspaces or the venv."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the working tree, not yet in the index
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return dest


def session_env(copy: Path, run_id: str, home: Path) -> dict[str, str]:
    """A user's environment: the venv first on PATH, the copy's code, the step cap, the run's
    cache of model inspections; none of the other tfplan variables the test run itself may
    carry (TFPLAN_CONF would pick the config)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TFPLAN_", "PYTEST_"))}
    venv_bin = Path(sys.executable).parent
    env.update(
        PATH=f"{venv_bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}",
        PYTHONPATH=str(copy),
        TFPLAN_MAX_STEPS_CAP=str(STEP_CAP),
        TERM="xterm",
        COLUMNS="200",
        HOME=str(home),
    )
    # The run's cache of model inspections (tests/conftest.py), as a user's home keeps it from
    # one page to the next: a model another page built is read, not built again (keyed by
    # everything that can change the answer, tfplan/engine/model_shapes.py)
    if os.environ.get("TFPLAN_CACHE_DIR"):
        env["TFPLAN_CACHE_DIR"] = os.environ["TFPLAN_CACHE_DIR"]
    env[MARKER] = run_id
    return env


# ---- the bash session -----------------------------------------------------------------------

_TRAP = (
    "trap '__doc_rc=$?; printf \"\\n@@doc-failed block=%s line=%s status=%s@@\\n%s\\n"
    '@@doc-failed-end@@\\n" "$__doc_block" "$LINENO" "$__doc_rc" "$BASH_COMMAND"; '
    'exit "$__doc_rc"\' ERR'
)


@dataclass(frozen=True)
class Script:
    """The generated session: its text, and which of its lines came from which block line."""

    text: str
    origin: dict[int, tuple[int, int]]  # script line -> (block index, line in the document)


def session_script(blocks: list[Block], expect: dict[int, str]) -> Script:
    """One bash script that runs ``blocks`` in order, each with ``set -e`` semantics: the ERR
    trap prints the block, the line and the command that failed, and ends the session. A
    block in ``expect`` runs in a subshell without the trap and must fail."""
    lines = ["set -E", _TRAP]
    origin: dict[int, tuple[int, int]] = {}
    for block in blocks:
        lines.append(f"__doc_block={block.index}; printf '\\n@@doc-block {block.index}@@\\n'")
        body = block.text.splitlines()
        if block.index in expect:
            lines += ["trap - ERR", "( set -e"]
        for offset, text in enumerate(body):
            lines.append(text)
            origin[len(lines)] = (block.index, block.line + offset)
        if block.index in expect:
            lines += [
                ")",
                "__doc_rc=$?",
                _TRAP,
                f"printf '\\n@@doc-expected block={block.index} status=%s@@\\n' \"$__doc_rc\"",
            ]
    lines.append("printf '\\n@@doc-done@@\\n'")
    return Script("\n".join(lines) + "\n", origin)


def clean(raw: bytes) -> str:
    """A terminal's bytes as text: escape sequences gone, each line as it was left after its
    last carriage return (a progress bar's final state)."""
    text = _ANSI.sub("", raw.decode(errors="replace")).replace("\r\n", "\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))


@dataclass
class Session:
    """A finished (or timed-out) session: its exit status and terminal output."""

    returncode: int | None
    raw: bytes
    answered: int  # approvals the runner typed yes to

    @property
    def output(self) -> str:
        return clean(self.raw)


def run_on_terminal(
    script: Path, cwd: Path, env: dict[str, str], log: Path, deadline: float
) -> Session:
    """``bash script`` on a new pseudo-terminal, in its own session; ``yes`` typed at each
    approval prompt; everything it prints kept in ``log``. Killed (its process group) when it
    runs past ``deadline`` (``time.monotonic()``); then ``returncode`` is None."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(
        ["bash", str(script)],
        cwd=cwd,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    raw = bytearray()
    answered = 0
    timed_out = False
    ended_at: float | None = None
    with log.open("wb") as sink:
        while True:
            now = time.monotonic()
            if proc.poll() is not None and ended_at is None:
                ended_at = now
            # after bash ended, what it wrote last is drained; a detached process that still
            # holds the terminal must not keep the session open
            if ended_at is not None and now - ended_at > 2.0:
                break
            if now > deadline:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                timed_out = True
                break
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError as error:  # EIO: every holder of the terminal closed it
                if error.errno != errno.EIO:
                    raise
                if proc.poll() is not None:
                    break
                continue
            if not chunk:
                break
            raw += chunk
            sink.write(chunk)
            sink.flush()
            if raw.count(PROMPT) > answered:
                os.write(master, b"yes\n")
                answered += 1
    os.close(master)
    return Session(None if timed_out else proc.poll(), bytes(raw), answered)


def block_outputs(output: str) -> dict[int, str]:
    """block index -> what the session printed while it ran."""
    parts = re.split(r"^@@doc-block (\d+)@@$", output, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


# ---- what a document leaves running ---------------------------------------------------------


def marked_processes(run_id: str) -> list[int]:
    """The live processes whose environment carries this document's marker."""
    needle = f"{MARKER}={run_id}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0") and _alive(entry):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def recorded_groups(folders: list[Path]) -> list[int]:
    """The process groups of every task, standby and warm seed recorded under ``folders``
    (the workspaces' states, the sweeps' seeds.json)."""
    groups: set[int] = set()
    for folder in folders:
        for path in folder.rglob("seeds.json"):
            try:
                groups |= {int(s["pgid"]) for s in json.loads(path.read_text())["seeds"]}
            except (OSError, ValueError, KeyError, TypeError):
                continue
        for path in folder.rglob(".tfplan/*/state.json"):
            try:
                state = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            for task in [*state.get("tasks", []), *state.get("standbys", [])]:
                pgid = (task.get("handle") or {}).get("pgid")
                if pgid is not None:
                    groups.add(int(pgid))
    return sorted(groups)


def _alive(proc_dir: Path) -> bool:
    try:
        stat = (proc_dir / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def describe(pids: list[int]) -> list[str]:
    """``pid: command line`` of each process, for a report."""
    out = []
    for pid in pids:
        try:
            cmd = (Path(f"/proc/{pid}") / "cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        out.append(f"{pid}: {cmd.decode(errors='replace').strip()[:160]}")
    return out


def stop_leftovers(run_id: str, folders: list[Path]) -> list[str]:
    """Kill what the document left running: the recorded process groups, then every process
    that carries its marker (TensorBoard --detach, a background supervisor); what was left,
    described. Raises AssertionError when something survives SIGKILL."""
    left = describe(marked_processes(run_id))
    for pgid in recorded_groups(folders):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in marked_processes(run_id):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 30
    while marked_processes(run_id) and time.monotonic() < deadline:
        time.sleep(0.1)  # SIGKILL is sent; the kernel reaps them
    survivors = describe(marked_processes(run_id))
    assert not survivors, "still running after SIGKILL:\n" + "\n".join(survivors)
    return left


# ---- the tests ------------------------------------------------------------------------------


def without_task_bodies(output: str) -> str:
    """``output`` without the lines inside a plan's ``task "NAME" { ... }`` bodies: what a CI
    log has room for is the plans' headers and what happened, not every field of every task."""
    kept, inside = [], False
    for line in output.splitlines():
        if re.match(r"\s*(?:[-+~]|-/\+)?\s*task \"[^\"]+\" \{\s*$", line):
            inside = True
            kept.append(line)
        elif inside:
            inside = not re.match(r"\s*\}\s*$", line)
        else:
            kept.append(line)
    return "\n".join(kept)


def supervisor_logs(folder: Path, chars: int = 1500) -> str:
    """The end of every background supervisor's log under ``folder`` (a failed document's
    detached jobs say there what happened to their tasks)."""
    parts = [
        f"--- {path.relative_to(folder)} (last {chars} chars) ---\n{path.read_text()[-chars:]}\n"
        for path in sorted(folder.rglob(".tfplan/*/supervisor.log"))
    ]
    return "".join(parts)


def task_logs(folder: Path, count: int = 4, chars: int = 800) -> str:
    """The end of the ``count`` task logs under ``folder`` written last: what a session that
    hung was waiting on."""
    logs = sorted(folder.rglob("tfplan/logs/*.log"), key=lambda p: p.stat().st_mtime)[-count:]
    return "".join(
        f"--- {path.relative_to(folder)} (last {chars} chars) ---\n{path.read_text()[-chars:]}\n"
        for path in logs
    )


def failure_report(
    doc: str,
    blocks: list[Block],
    script: Script,
    session: Session,
    log: Path,
    left: Sequence[str] = (),
) -> str:
    """The failed block, the command and its output, or why the session did not finish
    (then also what was still running, ``left``, and the task logs written last)."""
    output = session.output
    by_block = block_outputs(output)
    failed = re.search(
        r"@@doc-failed block=(\d+) line=(\d+) status=(\d+)@@\n(.*?)\n@@", output, re.S
    )
    if failed:
        index, line, status, command = failed.groups()
        block = blocks[int(index)]
        doc_line = script.origin.get(int(line), (int(index), block.line))[1]
        shown = without_task_bodies(by_block.get(int(index), "").split("@@doc-failed")[0])
        # the end of the output first: a CI summary that shortens a long report keeps its head
        return (
            f"{doc}, block {index} (line {block.line}): `{command}` (line {doc_line}) exited "
            f"{status}\n--- the end of its output ---\n{shown[-1500:]}\n"
            f"{supervisor_logs(log.parent)}--- the block ---\n{block.text}\n"
            f"--- its output (last 6000 chars, the plans' task bodies left out) ---\n"
            f"{shown[-6000:]}\n(the whole session: {log})"
        )
    if session.returncode is None:
        last = max(by_block, default=0)
        shown = by_block.get(last, "")
        # the end of the output first: a CI summary that shortens a long report keeps its head
        return (
            f"{doc}: the session ran past {DOC_DEADLINE_SECS:.0f}s in block {last}\n"
            f"--- the end of its output ---\n{shown[-1500:]}\n"
            f"--- still running at the deadline ---\n" + "\n".join(left) + "\n"
            f"{task_logs(log.parent)}{supervisor_logs(log.parent)}"
            f"--- the block ---\n{blocks[last].text}\n"
            f"--- its output (last 6000 chars) ---\n{shown[-6000:]}\n(the whole session: {log})"
        )
    return f"{doc}: the session exited {session.returncode}\n{output[-6000:]}\n(log: {log})"


def check_expected(doc: str, blocks: list[Block], expect: dict[int, str], output: str) -> None:
    """Each block the page shows failing failed, with the text the page shows."""
    by_block = block_outputs(output)
    for index, text in expect.items():
        shown = by_block.get(index, "")
        status = re.search(rf"@@doc-expected block={index} status=(\d+)@@", shown)
        assert status, f"{doc} block {index} did not run:\n{shown[-3000:]}"
        assert status.group(1) != "0", (
            f"{doc} block {index} should fail as the page shows ({text!r}) but succeeded:\n"
            f"{blocks[index].text}\n{shown[-3000:]}"
        )
        flat = " ".join(shown.split())
        assert " ".join(text.split()) in flat, (
            f"{doc} block {index} failed without {text!r}:\n{blocks[index].text}\n{shown[-3000:]}"
        )


def run_document(doc: str, tmp: Path) -> tuple[int, int]:
    """Run ``doc``'s bash blocks as a user would (module docstring); (run, excluded)."""
    entries = load_entries()
    skip, expect_all = excluded(entries), expected_errors(entries)
    blocks = bash_blocks(doc)
    to_run = [b for b in blocks if (doc, b.index) not in skip]
    print(
        f"\n{doc}: {len(blocks)} bash block(s), {len(to_run)} run, "
        f"{len(blocks) - len(to_run)} excluded"
    )
    if not to_run:
        return 0, len(blocks)
    expect = {i: t for (d, i), t in expect_all.items() if d == doc}
    for block in to_run:
        syntax = subprocess.run(["bash", "-n"], input=block.text, text=True, capture_output=True)
        assert syntax.returncode == 0, (
            f"{doc} block {block.index} (line {block.line}) is not valid bash: {syntax.stderr}"
            f"\n{block.text}"
        )
    copy = scratch_copy(tmp / "repo")
    home = tmp / "home"
    home.mkdir()
    cwd = doc_folder(doc, copy, tmp)
    script = session_script(to_run, expect)
    script_path = tmp / "session.sh"
    script_path.write_text(script.text)
    log = tmp / "session.log"
    run_id = uuid.uuid4().hex
    started = time.monotonic()
    try:
        session = run_on_terminal(
            script_path, cwd, session_env(copy, run_id, home), log, started + DOC_DEADLINE_SECS
        )
    finally:
        left = stop_leftovers(run_id, [copy, cwd])
    print(f"{doc}: {time.monotonic() - started:.0f}s, {session.answered} approval(s) typed")
    if left:
        print(f"{doc}: left running at its end, killed:\n  " + "\n  ".join(left))
    finished = "@@doc-done@@" in session.output and session.returncode == 0
    assert finished, failure_report(doc, to_run, script, session, log, left)
    check_expected(doc, to_run, expect, session.output)
    return len(to_run), len(blocks) - len(to_run)


def _runnable_documents() -> Iterator[Any]:
    for doc in documents():
        if bash_blocks(doc):
            yield pytest.param(doc, id=doc)


@pytest.mark.full
@pytest.mark.cluster
@pytest.mark.timeout(DOC_DEADLINE_SECS + 120)
@pytest.mark.parametrize("doc", list(_runnable_documents()))
def test_every_command_of_the_document_runs_as_written(doc: str, tmp_path: Path) -> None:
    run_document(doc, tmp_path)


def test_every_exclusion_names_an_existing_block_with_a_reason() -> None:
    """An edit that moves, removes or changes an excluded block is caught here: the entry's
    first line must still be that block's first command (a moved block is not silently
    excluded in another's place), and its reason must say why it cannot run."""
    seen: set[tuple[str, int]] = set()
    docs = set(documents())
    for entry in load_entries():
        where = f"{entry.get('file')} block {entry.get('block')}"
        assert set(entry) <= {"file", "block", "first_line", "reason", "expect_error"}, where
        assert entry.get("file") in docs, f"{where}: no such document"
        blocks = bash_blocks(entry["file"])
        assert isinstance(entry.get("block"), int) and 0 <= entry["block"] < len(blocks), (
            f"{where}: the document has {len(blocks)} bash block(s)"
        )
        actual = blocks[entry["block"]].first_line
        assert entry.get("first_line") == actual, (
            f"{where}: its first command is now {actual!r}, not {entry.get('first_line')!r}: "
            "update tests/doc_exclusions.yaml (index and first_line) or run the block"
        )
        assert str(entry.get("reason") or "").strip(), f"{where}: give the reason"
        assert (entry["file"], entry["block"]) not in seen, f"{where}: listed twice"
        seen.add((entry["file"], entry["block"]))
    print("\n" + counts_text())


def test_blocks_are_found_as_a_reader_sees_them(tmp_path: Path) -> None:
    """Only ``bash`` blocks count, a longer fence holds a shorter one, and the first command
    skips comments: what the exclusions' first_line is compared with."""
    (tmp_path / "page.md").write_text(
        "text\n```bash\n# a comment\n\ntfplan plan   # first\ntfplan apply\n```\n"
        "```\nnot bash\n```\n````markdown\n```bash\ninside\n```\n````\n"
        "  ```bash\n  indented\n  ```\n"
    )
    blocks = bash_blocks("page.md", tmp_path)
    assert [(b.index, b.line, b.first_line) for b in blocks] == [
        (0, 3, "tfplan plan   # first"),
        (1, 17, "indented"),
    ]


def test_a_failing_command_names_its_block_and_line_and_the_session_stops(
    tmp_path: Path,
) -> None:
    """The harness itself: ``set -e`` per block, the failing command reported with its
    document line, the blocks after it not run; a block expected to fail does not stop it."""
    blocks = [
        Block("d.md", 0, 10, "cd sub\necho one"),
        Block("d.md", 1, 20, "echo two\nls /nonexistent-doc-test\necho never"),
        Block("d.md", 2, 30, "echo three"),
    ]
    (tmp_path / "sub").mkdir()
    script = session_script(blocks, expect={})
    (tmp_path / "s.sh").write_text(script.text)
    session = run_on_terminal(
        tmp_path / "s.sh", tmp_path, dict(os.environ), tmp_path / "log", time.monotonic() + 60
    )
    assert session.returncode == 2
    report = failure_report("d.md", blocks, script, session, tmp_path / "log")
    assert "d.md, block 1 (line 20): `ls /nonexistent-doc-test` (line 21) exited 2" in report, (
        report
    )
    assert "never" not in session.output.split("@@doc-failed")[0].split("@@doc-block 1@@")[1]
    assert "three" not in session.output

    script = session_script(
        blocks[:1] + [Block("d.md", 1, 20, "echo refused; exit 2")] + blocks[2:],
        expect={1: "refused"},
    )
    (tmp_path / "s.sh").write_text(script.text)
    session = run_on_terminal(
        tmp_path / "s.sh", tmp_path, dict(os.environ), tmp_path / "log", time.monotonic() + 60
    )
    assert session.returncode == 0 and "@@doc-done@@" in session.output, session.output
    check_expected("d.md", blocks, {1: "refused"}, session.output)


def test_a_session_past_its_deadline_is_reported_as_such_with_what_ran(tmp_path: Path) -> None:
    """A hung document is killed at the deadline and reported as hung (not as an exit status),
    with what was still running and the end of the task logs written last."""
    blocks = [Block("d.md", 0, 10, "echo started\nsleep 600")]
    script = session_script(blocks, expect={})
    (tmp_path / "s.sh").write_text(script.text)
    logs = tmp_path / "outputs" / "0" / "tfplan" / "logs"
    logs.mkdir(parents=True)
    (logs / "worker-0.log").write_text("waiting for the chief\n")
    session = run_on_terminal(
        tmp_path / "s.sh", tmp_path, dict(os.environ), tmp_path / "log", time.monotonic() + 3
    )
    assert session.returncode is None
    report = failure_report("d.md", blocks, script, session, tmp_path / "log", ["123 sleep 600"])
    assert "the session ran past" in report and "in block 0" in report, report
    assert "123 sleep 600" in report and "waiting for the chief" in report, report
    assert "started" in report, report


def test_an_approval_prompt_is_answered_yes_on_a_terminal(tmp_path: Path) -> None:
    """tfplan asks only on a terminal, and only ``yes`` approves: the runner is one."""
    asker = (
        "import sys; assert sys.stdin.isatty() and sys.stdout.isatty(); "
        "print('ok' if input('  Enter a value: ').strip() == 'yes' else 'no')"
    )
    (tmp_path / "s.sh").write_text(f'"{sys.executable}" -c "{asker}"\n')
    session = run_on_terminal(
        tmp_path / "s.sh", tmp_path, dict(os.environ), tmp_path / "log", time.monotonic() + 60
    )
    assert session.returncode == 0 and session.answered == 1
    assert session.output.strip().endswith("ok"), session.output


# ---- the step cap (tfplan/config/step_cap.py) -----------------------------------------------


def test_the_step_cap_caps_max_steps_and_scales_the_cadences() -> None:
    from tfplan.config.schema import TrainerConfig
    from tfplan.config.step_cap import capped_trainer

    trainer, note = capped_trainer(TrainerConfig(), 40)  # 1000 steps, 200/100/50
    assert (trainer.max_steps, trainer.checkpoint_steps, trainer.log_steps) == (40, 8, 4)
    assert trainer.summary_steps == 2
    assert note == (
        "TFPLAN_MAX_STEPS_CAP=40: trainer.max_steps 1000 -> 40 "
        "(checkpoint_steps 200 -> 8, log_steps 100 -> 4, summary_steps 50 -> 2)"
    )
    # never 0, never above the cap; a null checkpoint_steps stays null
    trainer, _ = capped_trainer(
        TrainerConfig(max_steps=3000, checkpoint_steps=None, log_steps=1, summary_steps=3000), 5
    )
    assert (trainer.max_steps, trainer.checkpoint_steps, trainer.log_steps) == (5, None, 1)
    assert trainer.summary_steps == 5
    # within the cap: untouched, and nothing said
    same = TrainerConfig(max_steps=30)
    assert capped_trainer(same, 40) == (same, None)


def test_the_step_cap_comes_from_the_environment_and_applies_when_composing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tfplan.config import step_cap
    from tfplan.config.compose import compose_config, to_config
    from tfplan.errors import ConfigError

    assert step_cap.read_cap({}) is None and step_cap.read_cap({step_cap.ENV_VAR: ""}) is None
    assert step_cap.read_cap({step_cap.ENV_VAR: " 30 "}) == 30
    for bad in ("0", "-3", "ten", "1.5"):
        with pytest.raises(ConfigError, match=step_cap.ENV_VAR):
            step_cap.read_cap({step_cap.ENV_VAR: bad})

    monkeypatch.delenv(step_cap.ENV_VAR, raising=False)
    assert to_config(compose_config(["trainer.max_steps=500"])).trainer.max_steps == 500
    monkeypatch.setenv(step_cap.ENV_VAR, "25")
    monkeypatch.setattr(step_cap, "_said", set())
    cfg = to_config(compose_config(["trainer.max_steps=500"]))
    again = to_config(compose_config(["trainer.max_steps=500"]))  # a sweep's next point
    assert cfg.trainer.max_steps == again.trainer.max_steps == 25
    assert cfg.trainer.checkpoint_steps == 10 and cfg.trainer.log_steps == 5
    err = capsys.readouterr().err
    assert err.count("Warning: TFPLAN_MAX_STEPS_CAP=25: trainer.max_steps 500 -> 25") == 1, err


if __name__ == "__main__":
    print(counts_text())
