"""The run-folder layout on disk: the only module that knows its file names.

    <root>/<project>/<task>/
      TASK.md  DONE  .lock  supervisor.log  check.txt (what `run-agent check` printed last)
      race.yaml  .race.lock                                 (a race's task: store/race.py)
      issue.yaml  ISSUE.md  worktree/  worktree-*.diff      (an issue run)
      runs/<run_id>/
        run-info.yaml  prompt.md  agent-stdout.txt  agent-stderr.txt  output.md  (DONE, archived)
        check.txt                                           (what the task's check printed)
        operations.jsonl  events.jsonl  ops.json  approval-pending.json  .ops.lock  (operations)

`run-info.yaml` is rewritten atomically (temp file, fsync, rename), so a reader sees either the
old or the new version, never half of one; on a full disk, where the temp file gets no block, it
is rewritten in place, in the blocks it has. When even that fails, an empty file
`.unrecorded.ERRNO` says so, and readers take the run as failed for that reason, not as lost.

What run-agent makes under a runs root is its owner's alone, whatever the umask: files
FILE_MODE (0600), folders FOLDER_MODE (0700), as `prompt.md` always was. TASK.md and the
agent's output hold the same prompt, and run-info its command line: none is another user's to
read. Every file and folder of the layout is made here (`make_folder`, `private`, the writers
below); one that exists is left with the mode it has.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import itertools
import os
import resource
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from runagent.errors import OutsideRootError
from runagent.record import record
from runagent.store import yamltext
from runagent.store.runinfo import Reason, RunInfo, RunStatus

RUN_INFO = "run-info.yaml"
PROMPT = "prompt.md"
STDOUT = "agent-stdout.txt"
STDERR = "agent-stderr.txt"
OUTPUT = "output.md"
CHECK = "check.txt"  # what the task's check printed, judging a run that said it was done
TASK = "TASK.md"
TASK_USAGE = "usage.json"  # what the task's runs used, summed as each run ends
TASK_SETTINGS = "task.yaml"  # how the task was last started: agent, working folder, overrides
DONE = "DONE"
LOCK = ".lock"
SUPERVISOR_LOG = "supervisor.log"  # what a detached supervisor prints
SCHEDULE_STATE = ".schedules.yaml"  # in the runs root: what each schedule last fired
SCHEDULE_LOCK = ".schedules.lock"  # held while the schedule state is read, changed and written
FLEET = ".fleet"  # in the runs root: the queue's slots and records (runagent/fleet/)
# In the runs root: the sockets of this root's cluster brokers (runagent/executors/broker.py).
BROKER = ".broker"
SCHEDULE_LOG = "schedule.log"  # in the runs root: what the crontab lines' firings print
REMOVED = ".removed.json"  # in the runs root: what gc and delete removed, as /metrics counts it
REMOVED_LOCK = ".removed.lock"  # held by a removal exclusively, by a scrape of /metrics shared
RUNS = "runs"
OPERATIONS = "operations.jsonl"  # every message an operations run received, one per line
EVENTS = "events.jsonl"  # every events message it answered with, one per line
OPS_SETTINGS = "ops.json"  # the workspace and policy an operations run acts with
APPROVAL_PENDING = "approval-pending.json"  # the paused batch, while an approval is awaited
OPS_LOCK = ".ops.lock"  # held by whichever process answers a message of an operations run
ISSUE_RECORD = "issue.yaml"  # an issue run: the issue, repository, worktree, branch, fork point
WORKTREE_RECORD = "worktree.yaml"  # a worktree run's (not an issue run's) repository and branch
ISSUE_BODY = "ISSUE.md"  # the issue body as the agent reads it (COCODE_ISSUE_BODY_FILE)
WORKTREE = "worktree"  # an issue run's git worktree
WORKTREE_GIT = "worktree.git"  # its git folder: a clone of the repository, borrowing its objects
SAVED_DIFF = "worktree-{stamp}.diff"  # uncommitted work of a worktree removed by force
SETUP_LOG = "setup.log"  # what an issue run's setup command printed
SECCOMP = ".seccomp"  # in a task folder: the filter a sandboxed agent without network runs under
SANDBOX_VIEW = ".sandbox"  # what a sandboxed agent sees as its task folder (never read back)
CLI_COPIES = ".cli"  # a sandboxed agent's private copies of its CLI's own files (never read back)
RACE = "race.yaml"  # a race's task: its racers, its shared budget, its winner (store/race.py)
RACE_LOCK = ".race.lock"  # held while race.yaml is read, changed and written
LEFT_QUEUE = "left-queue.yaml"  # a task taken out of the queue before it ever ran: when, by what
MESSAGES = "messages.jsonl"  # a person's messages to the task's next attempt (store/steering.py)
MESSAGES_READ = "messages-read.json"  # which run each message was handed to (its loop writes it)
MESSAGES_LOCK = ".messages.lock"  # held while messages.jsonl is read, added to and written
UNRECORDED = ".unrecorded"  # + ".ENOSPC" (the error's name): run-info.yaml could not be written

FILE_MODE = 0o600  # every file run-agent makes under a runs root
FOLDER_MODE = 0o700  # every folder it makes there

# The files of a run a reader may ask for by a short name.
RUN_INFO_LIMIT = 1 << 20  # bytes of a run-info.yaml read; a larger one is unreadable
RUN_FILES = {"stdout": STDOUT, "stderr": STDERR, "output": OUTPUT, "prompt": PROMPT,
             "check": CHECK}  # fmt: skip


def load_yaml(text: str) -> Any:
    """`yaml.safe_load`, with libyaml where it is there; YAMLSyntaxError if it is not YAML."""
    return yamltext.load(text)


def dump_yaml(data: Any, *, sort_keys: bool = True, allow_unicode: bool = False) -> str:
    """`yaml.safe_dump` to a string; a run's own records without importing PyYAML."""
    return yamltext.dump(data, sort_keys=sort_keys, allow_unicode=allow_unicode)


@record
class TaskPaths:
    """Where one task's files live under a runs root."""

    root: Path
    project_id: str
    task_id: str

    @property
    def label(self) -> str:
        return f"{self.project_id}/{self.task_id}"

    @property
    def fence(self) -> str:
        """What the task's files must really lie under: its project's (`fence`)."""
        return fence(self.root, self.project_id)

    @functools.cached_property
    def folder(self) -> Path:  # joined once: a listing asks each task's for a dozen paths
        return self.root / self.project_id / self.task_id

    @property
    def task_md(self) -> Path:
        return self.folder / TASK

    @functools.cached_property
    def done(self) -> Path:
        return self.folder / DONE

    @functools.cached_property
    def lock(self) -> Path:
        return self.folder / LOCK

    @property
    def check(self) -> Path:
        """What the task's check printed when last run again by itself (`run-agent check`)."""
        return self.folder / CHECK

    @functools.cached_property  # this, and the paths a listing asks each task for, joined once
    def runs(self) -> Path:
        return self.folder / RUNS

    def run_folder(self, run_id: str) -> Path:
        return self.runs / run_id

    def run(self, run_id: str) -> RunPaths:
        return RunPaths(self.run_folder(run_id))

    @property
    def worktree(self) -> Path:
        return self.folder / WORKTREE

    @property
    def worktree_git(self) -> Path:
        return self.folder / WORKTREE_GIT

    @property
    def issue_record(self) -> Path:
        return self.folder / ISSUE_RECORD

    @property
    def worktree_record(self) -> Path:
        return self.folder / WORKTREE_RECORD

    @functools.cached_property
    def race(self) -> Path:
        return self.folder / RACE

    @functools.cached_property
    def left_queue(self) -> Path:
        return self.folder / LEFT_QUEUE

    @property
    def race_lock(self) -> Path:
        return self.folder / RACE_LOCK

    @property
    def messages(self) -> Path:
        return self.folder / MESSAGES

    @property
    def messages_read(self) -> Path:
        return self.folder / MESSAGES_READ

    @property
    def messages_lock(self) -> Path:
        return self.folder / MESSAGES_LOCK

    @property
    def issue_body(self) -> Path:
        return self.folder / ISSUE_BODY

    @property
    def setup_log(self) -> Path:
        return self.folder / SETUP_LOG

    @property
    def sandbox_view(self) -> Path:
        return self.folder / SANDBOX_VIEW

    @property
    def cli_copies(self) -> Path:
        return self.folder / CLI_COPIES

    def saved_diff(self, stamp: str) -> Path:
        return self.folder / SAVED_DIFF.format(stamp=stamp)

    def run_ids(self, since: str = "") -> list[str]:
        """The task's run ids, oldest first (ids sort in start order); none that lead out of
        its project; with `since` (a day, YYYYMMDD), none whose id says it started before."""
        if not since:
            return _subfolders(self.fence, self.runs, hidden=True)

        def maybe(name: str) -> bool:
            return not (name[:8].isdigit() and name[:8] < since)

        return _subfolders(self.fence, self.runs, hidden=True, keep=maybe)


@record
class RunPaths:
    """Where one run's files live, in its folder under the task's `runs/`."""

    folder: Path

    @property
    def fence(self) -> str:
        """What the run's files must really lie under: the project's (`fence`) of the layout
        ROOT/PROJECT/TASK/runs/RUN its folder is named by."""
        task = os.path.dirname(os.path.dirname(os.fspath(self.folder)))
        project = os.path.dirname(task)
        if not os.path.basename(project):  # not in a runs root's layout: its own folder
            return os.path.realpath(self.folder)
        return fence(os.path.dirname(project) or ".", os.path.basename(project))

    @property
    def info(self) -> Path:
        return self.folder / RUN_INFO

    @property
    def prompt(self) -> Path:
        return self.folder / PROMPT

    @property
    def stdout(self) -> Path:
        return self.folder / STDOUT

    @property
    def stderr(self) -> Path:
        return self.folder / STDERR

    @property
    def output(self) -> Path:
        return self.folder / OUTPUT

    @property
    def check(self) -> Path:
        return self.folder / CHECK

    @property
    def operations(self) -> Path:
        return self.folder / OPERATIONS

    @property
    def events(self) -> Path:
        return self.folder / EVENTS

    @property
    def ops_settings(self) -> Path:
        return self.folder / OPS_SETTINGS

    @property
    def approval_pending(self) -> Path:
        return self.folder / APPROVAL_PENDING

    @property
    def ops_lock(self) -> Path:
        return self.folder / OPS_LOCK

    @property
    def done(self) -> Path:
        """Where the next loop moves a DONE this run left in the task folder (`archive_done`)."""
        return self.folder / DONE


def within(root: Path, path: Path) -> bool:
    """Whether `path`, every symbolic link on the way resolved, stays inside `root`: the rule for
    what is not a project's (the root's own files, a folder a person names)."""
    try:
        path.resolve().relative_to(root.resolve())
    except (OSError, ValueError, RuntimeError):  # RuntimeError: a symlink loop
        return False
    return True


# A project's confinement, the one rule for whatever lies under a project: everything read of a
# project (its task folders, their runs/, run folders, their files) must really lie inside that
# project's folder, every symbolic link on the way followed. A link that stays inside is
# followed; one that leads into another project or out of the root is not, for every reader
# (a token of one project or of all, the command line), so no answer depends on who asks. The
# project's folder is the root's real path and the project's name: a project folder that is
# itself a link holds nothing. What is opened is checked by its descriptor, not by its name, so
# a link swapped in between a check and the open (an agent can write its task folder) is not
# followed either.


def fence(root: Path | str, project_id: str) -> str:
    """The real path everything of project `project_id` must lie under."""
    path = os.fspath(root)
    try:
        st = os.stat(path)
    except OSError:  # no root (yet): nothing is under it
        return os.path.join(os.path.realpath(path), project_id)
    return os.path.join(_real_root(path, st.st_dev, st.st_ino), project_id)


@functools.lru_cache(maxsize=64)
def _real_root(path: str, device: int, inode: int) -> str:
    """The real path of a runs root, resolved once for as long as its name leads to the same
    folder (a root swapped for another is resolved afresh): a listing asks it for every run."""
    return os.path.realpath(path)


def _inside(fence: str, real: str) -> bool:
    return real.startswith(fence) and real[len(fence) : len(fence) + 1] in ("", "/")


def holds(fence: str, path: Path | str) -> bool:
    """Whether `path`, every link on the way resolved, lies inside `fence` now (for a path that
    is looked at, not read: what is read is opened with `open_in`)."""
    return _inside(fence, os.path.realpath(path))


def open_in(fence: str, path: Path | str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of `path` (opened with `flags`, and never blocking on a FIFO), if what was
    opened lies inside `fence`; else an OSError saying it leads out. The descriptor's own path
    is what is checked, so no link swapped in after a look at the name can lead it out."""
    return _opened(fence, path, flags)[0]


def _opened(fence: str, path: Path | str, flags: int) -> tuple[int, str]:
    """`open_in`'s descriptor, and the real path it was checked by."""
    fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}").removesuffix(" (deleted)")
    except OSError:  # no /proc: the name resolved now, if it still names what was opened
        real = os.path.realpath(path)
        try:
            real = real if os.path.samestat(os.fstat(fd), os.stat(real)) else ""
        except OSError:
            real = ""
    if not _inside(fence, real):
        os.close(fd)
        raise OSError(errno.EXDEV, "it leads out of its project (a symbolic link)", str(path))
    return fd, real


def stat_in(fence: str, path: Path | str, follow: bool = True) -> os.stat_result | None:
    """What `path` is (a link at its end followed unless not `follow`), if it lies inside
    `fence`; None if it is not there or leads out."""
    try:
        os.lstat(path)  # most often asked of what is not there (DONE, race.yaml): a call, not four
        fd = open_in(fence, path, os.O_PATH | (0 if follow else os.O_NOFOLLOW))
    except OSError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def is_file_in(fence: str, path: Path | str) -> bool:
    """Whether `path` is a regular file inside `fence`."""
    found = stat_in(fence, path)
    return found is not None and stat.S_ISREG(found.st_mode)


def read_text_in(fence: str, path: Path | str) -> str:
    """The text of the regular file `path`, if it lies inside `fence`; else an OSError
    (FileNotFoundError where there is none; UnicodeDecodeError if it is not UTF-8)."""
    fd = open_in(fence, path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        chunks = [os.read(fd, max(st.st_size, 4096) + 1)]  # whole, as it was when stat'd
        while chunks[-1]:
            chunks.append(os.read(fd, 65536))
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def confine(task: TaskPaths) -> TaskPaths:
    """`task`, if its project folder (those that exist) stays inside the runs root, and its task
    folder, TASK.md and runs folder inside that project's (`fence`: a link from one project into
    another would let what may reach one project reach the other); else OutsideRootError naming
    the link."""
    project = task.root / task.project_id
    bounds = task.fence
    for path in (project, task.folder, task.task_md, task.runs):
        if not os.path.lexists(path):
            continue
        if not within(task.root, path):
            raise leads_out(path, f"out of the runs root {task.root}")
        if not holds(bounds, path):
            raise leads_out(path, f"out of its project's folder {project}")
    return task


def leads_out(path: Path, where: str) -> OutsideRootError:
    """The refusal of a path that leads `where` (out of the root, out of its project)."""
    return OutsideRootError(
        f"{path} leads {where} (a symbolic link); run-agent never reads or writes through it: "
        "remove the link or use another id"
    )


def in_worktree(root: Path, path: Path) -> bool:
    """Whether `path` lies inside an issue run's worktree (or one kept aside) under `root`:
    a checkout's files, which are none of a run folder's."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        return False
    return len(parts) > 3 and parts[2].startswith(WORKTREE)


def schedule_state_path(root: Path) -> Path:
    return root / SCHEDULE_STATE


def schedule_lock_path(root: Path) -> Path:
    return root / SCHEDULE_LOCK


def schedule_log_path(root: Path) -> Path:
    return root / SCHEDULE_LOG


def removed_path(root: Path) -> Path:
    return root / REMOVED


def removed_lock_path(root: Path) -> Path:
    return root / REMOVED_LOCK


def supervisor_log_path(task: TaskPaths) -> Path:
    return task.folder / SUPERVISOR_LOG


_numbers = itertools.count(1)  # each temp file of this process's its own number (thread-safe)


def make_folder(path: Path) -> Path:
    """`path` made, with each missing folder above it, FOLDER_MODE (`mkdir -p` would give the
    ones above the umask's mode); folders that exist are left as they are."""
    missing = []
    at = path
    while not os.path.isdir(at) and at != at.parent:
        missing.append(at)
        at = at.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:  # made meanwhile by another process (or a file: said below)
            if not os.path.isdir(folder):
                raise
    return path


def make_task_folder(task: TaskPaths) -> TaskPaths:
    """The task's folder made (FOLDER_MODE, and its project's), once confined to the root."""
    make_folder(confine(task).folder)
    return task


def private(path: str | os.PathLike[str], flags: int) -> int:
    """An `opener` for `open()` that makes a new file FILE_MODE:
    `open(path, "ab", opener=private)`."""
    return os.open(path, flags | os.O_CLOEXEC, FILE_MODE)


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Hold the lock file `path` (made FILE_MODE if new) exclusively for the block, waiting for
    it: the one way a record's readers and writers take turns (closing lets it go)."""
    fd = private(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def is_held(path: Path) -> bool:
    """Whether a process holds the lock file `path` (exclusively: a keeper, a broker); False
    when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def touch(path: Path) -> None:
    """An empty file made FILE_MODE (one that exists is left as it is)."""
    os.close(private(path, os.O_WRONLY | os.O_CREAT))


def atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that readers see the old or the new content, never a mix.

    An OSError names `path`, not the temporary file it failed on.
    """
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """The one way a record is written: `data` in a temporary file of FILE_MODE beside `path`,
    flushed to disk (fsync), then renamed over it; `atomic_write` for bytes."""
    # A name of this process's own (pid and a count): no other writer can take it, and
    # O_EXCL refuses a leftover of a process of the same pid that died mid-write.
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{next(_numbers)}.tmp")
    try:
        try:
            fd = private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            tmp.unlink()
            fd = private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_line(path: Path, line: str) -> None:
    """Append one line to a journal (operations.jsonl, events.jsonl) in a single write, so lines
    of two writers never interleave."""
    fd = private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        data = memoryview((line.rstrip("\n") + "\n").encode("utf-8"))
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)


def write_run_info(run_folder: Path, info: RunInfo) -> None:
    """Write the run's record atomically; on a full disk, over the old record in place."""
    text = dump_yaml(info.to_dict(), sort_keys=False, allow_unicode=True)
    path = RunPaths(run_folder).info
    try:
        atomic_write(path, text)
    except OSError as exc:
        if exc.errno not in _NO_SPACE or not _overwrite(path, text.encode("utf-8")):
            raise
    if info.status is not RunStatus.RUNNING:
        # An ended record is final to the index of the root (runagent/store/index.py), which
        # looks at it again only when its task's runs/ folder changes: make it change.
        with contextlib.suppress(OSError):
            os.utime(run_folder.parent, follow_symlinks=False)


# A disk (or quota, or file size limit) with no room for one more block.
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def _overwrite(path: Path, data: bytes) -> bool:
    """Rewrite `path` in place, in the blocks it already has; False (nothing written) if `data`
    does not fit in them or under the file size limit.

    The last resort of a full disk, where a new file gets no block: the end of a run is worth
    a moment in which a reader may find the record half old and half new (read as `unreadable`
    until the write, one call, completes).
    """
    limit, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        room = os.fstat(fd).st_blocks * 512
        if len(data) > room or (limit != resource.RLIM_INFINITY and len(data) > limit):
            return False
        if os.pwrite(fd, data, 0) != len(data):
            return False
        os.ftruncate(fd, len(data))  # shrinking needs no block
        os.fsync(fd)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def timestamp(seconds: float | None = None) -> str:
    """A time as run-info.yaml writes it (UTC, ISO 8601, milliseconds): now, or `seconds` since
    the epoch."""
    moment = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec="milliseconds")


def seconds_between(start: object, end: object) -> float | None:
    """Seconds from one time of a record (ISO 8601) to another, never below 0 (the clocks of two
    hosts may disagree); None where either cannot be read, or one has a time zone and the other
    none (records on disk are anyone's to write)."""
    try:
        return max(0.0, (datetime.fromisoformat(str(end)) - datetime.fromisoformat(str(start)))
                   .total_seconds())  # fmt: skip
    except (ValueError, TypeError):
        return None


def mark_lost(run_folder: Path, info: RunInfo) -> RunInfo:
    """Record that a run's supervisor is gone: lost (it died while the run ran), or failed if it
    left word that it could not write the run's end. The last output time becomes the end."""
    paths = RunPaths(run_folder)
    mtimes = [p.stat().st_mtime for p in (paths.stdout, paths.stderr) if p.exists()]
    ended = unrecorded(run_folder, info) or info.replace(
        status=RunStatus.LOST,
        reason=Reason.SUPERVISOR_LOST,
        message=f"its supervisor (pid {info.supervisor_pid}) died while the run was running",
    )
    ended = ended.replace(end_time=timestamp(max(mtimes)) if mtimes else None)
    write_run_info(run_folder, ended)
    clear_unrecorded(run_folder)
    withdraw_approval(run_folder)
    return ended


def disarm(run_folder: Path) -> list[str]:
    """After its agent has ended: what the agent left in its run folder that is neither a
    regular file nor a folder (a link, a FIFO, a socket, a device) is removed, so that nothing
    that reads the run's files afterwards (its parsers, output.md, the server, `gc`) follows it
    out of the folder or waits on it; its stdout and stderr are there again, empty, if they
    were among them. The names removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(run_folder))
    except OSError:
        return removed
    for entry in entries:
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                continue
            os.unlink(entry.path)
        except OSError:
            continue
        removed.append(entry.name)
    for name in (STDOUT, STDERR):
        if name in removed:
            with contextlib.suppress(OSError):
                open(run_folder / name, "x", opener=private).close()
    return removed


def withdraw_approval(run_folder: Path) -> None:
    """A run that has ended waits for no approval: a pause it left is removed, so an answer
    given later (`run-agent ops approve`, the page) runs nothing in a run nobody reads."""
    RunPaths(run_folder).approval_pending.unlink(missing_ok=True)


def unrecorded_message(error: OSError) -> str:
    """What a run whose final run-info.yaml could not be written says about it."""
    return f"{error.strerror or error} writing {RUN_INFO}, so the end of this run is not recorded"


def mark_unrecorded(run_folder: Path, error: OSError) -> None:
    """Leave word that run-info.yaml could not be written, and why; best effort.

    The word is the name of an empty file: it needs no data block, so a disk too full for
    run-info.yaml (or a file size limit) usually still lets it be created.
    """
    name = errno.errorcode.get(error.errno or errno.EIO, "EIO")
    try:
        touch(run_folder / f"{UNRECORDED}.{name}")
    except OSError:
        pass


def unrecorded(run_folder: Path, info: RunInfo) -> RunInfo | None:
    """`info` ended as failed, if its supervisor left word it could not write it; else None."""
    try:
        names = [n for n in os.listdir(run_folder) if n.startswith(f"{UNRECORDED}.")]
    except OSError:
        return None
    if not names:
        return None
    code = getattr(errno, names[0].removeprefix(f"{UNRECORDED}."), None)
    if not isinstance(code, int):
        code = errno.EIO
    error = OSError(code, os.strerror(code))
    return info.replace(
        status=RunStatus.FAILED, reason=Reason.WRITE_ERROR, message=unrecorded_message(error)
    )


def clear_unrecorded(run_folder: Path) -> None:
    """Remove the word left by `mark_unrecorded`, once run-info.yaml says it."""
    try:
        for name in os.listdir(run_folder):
            if name.startswith(f"{UNRECORDED}."):
                (run_folder / name).unlink(missing_ok=True)
    except OSError:
        pass  # it only repeats what run-info.yaml now says


def read_run_info(run_folder: Path) -> RunInfo | None:
    """The run's metadata, or None if the folder has none (yet) or it cannot be read."""
    info = read_run_record(run_folder)
    return None if info is None or info.status is RunStatus.UNREADABLE else info


def read_run_record(run_folder: Path, fence: str | None = None) -> RunInfo | None:
    """The run's metadata as run-agent or conductor-loop wrote it; None if the folder has no
    run-info.yaml (yet); a record of status `unreadable` saying why if it cannot be read
    (leading out of its project among the reasons). `fence`: its project's, if known."""
    from runagent.store.jsonfile import Unreadable, read_capped

    paths = RunPaths(run_folder)
    bounds = paths.fence if fence is None else fence
    try:  # a link or a FIFO an agent left in its place is not followed, nor waited on
        text = read_capped(
            paths.info, RUN_INFO_LIMIT, follow=False, opener=functools.partial(open_in, bounds)
        ).decode()
    except FileNotFoundError:
        return None
    except Unreadable as exc:
        return unreadable_run(run_folder, str(exc))
    except UnicodeDecodeError:
        return unreadable_run(run_folder, "not UTF-8 text")
    try:
        data = load_yaml(text)
    except yamltext.YAMLSyntaxError as exc:
        where = f" at line {exc.line}" if exc.line is not None else ""
        return unreadable_run(run_folder, f"not YAML{where} ({exc.problem or exc})")
    if not isinstance(data, dict):
        return unreadable_run(run_folder, "not a mapping of fields")
    if "attempt" not in data:  # conductor-loop's
        data = _as_conductor_loop_reads(data, run_folder)
    try:
        return RunInfo.from_dict(data)
    except (TypeError, ValueError) as exc:
        return unreadable_run(run_folder, str(exc))


def unreadable_run(run_folder: Path, why: str) -> RunInfo:
    """A stand-in record for a run whose run-info.yaml cannot be read, saying why, so readers
    show the run instead of dropping it (and cleanup keeps it). Never written to disk."""
    task = run_folder.parent.parent
    try:
        started = timestamp(run_folder.stat().st_mtime)
    except OSError:
        started = ""
    return RunInfo(
        run_id=run_folder.name, project_id=task.parent.name, task_id=task.name, attempt=0,
        agent="", backend="", start_time=started, cwd="", status=RunStatus.UNREADABLE,
        message=f"{RUN_INFO} cannot be read: {why}",
    )  # fmt: skip


# What conductor-loop's struct always writes, at the zero value its reader gives a field a file
# lacks (the times are its zero time: none; an empty text field is one its omitempty leaves out).
_GO_ZERO: dict[str, Any] = {"agent": "", "exit_code": 0, "pid": 0, "pgid": 0, "start_time": ""}


def _as_conductor_loop_reads(data: dict[str, Any], run_folder: Path) -> dict[str, Any]:
    """A record conductor-loop wrote (or rewrote), as its own reader reads it: each field it
    lacks at its zero value, the run id, project and task from the path where it names none, no
    status as its `unknown`; numbered by its place among the task's runs."""
    data = _GO_ZERO | {k: v for k, v in data.items() if v != ""}
    task = run_folder.parent.parent
    for key, name in (("run_id", run_folder.name), ("project_id", task.parent.name),
                      ("task_id", task.name)):  # fmt: skip
        value = data.get(key)
        if not isinstance(value, str) or not value.strip():
            data[key] = name
    data.setdefault("status", "unknown")
    data["attempt"] = _position(run_folder)
    return data


def _position(run_folder: Path) -> int:
    """The run's number among its task's runs that hold a record, oldest first (ids sort in
    start order): a folder made and not written yet, or left without one, takes no number."""
    try:
        names = sorted(n for n in os.listdir(run_folder.parent) if not n.startswith("."))
        before = names[: names.index(run_folder.name)]
    except (OSError, ValueError):
        return 1
    runs = os.fspath(run_folder.parent)
    return 1 + sum(os.path.lexists(f"{runs}/{name}/{RUN_INFO}") for name in before)


def create_run_folder(task: TaskPaths, run_id: str) -> Path:
    """Create the run's folder with empty stdout and stderr files, so a tail can start at once."""
    paths = task.run(run_id)
    make_folder(paths.folder.parent)
    os.mkdir(paths.folder, FOLDER_MODE)  # FileExistsError: the id is taken
    for path in (paths.stdout, paths.stderr):
        touch(path)
    return paths.folder


def archive_done(task: TaskPaths, into_run: str | None) -> Path | None:
    """Move a DONE left by an earlier loop out of the way, keeping its content.

    It goes into the run folder of the run before (where it belongs), else beside itself with a
    suffix. Returns where it went, or None if there was no DONE.
    """
    if not task.done.exists():
        return None
    target = task.run(into_run).done if into_run else None
    if target is None or target.exists() or not target.parent.is_dir():
        target = task.folder / f"{DONE}.{os.getpid()}.old"
    os.replace(task.done, target)
    return target


def project_ids(root: Path) -> list[str]:
    """The projects: the root's folders, none that is a link (`fence`)."""
    try:
        with os.scandir(root) as entries:
            return sorted(
                e.name
                for e in entries
                if not e.name.startswith(".") and not e.is_symlink() and e.is_dir()
            )
    except (FileNotFoundError, NotADirectoryError):
        return []


def task_ids(root: Path, project_id: str) -> list[str]:
    """The project's tasks: none that leads out of it (a link to another project's task)."""
    return _subfolders(fence(root, project_id), root / project_id)


def _subfolders(
    fence: str, folder: Path, hidden: bool = False, keep: Callable[[str], bool] | None = None
) -> list[str]:
    """The folders in `folder` (itself inside `fence`), sorted; none that leads out of it;
    only those whose name `keep` keeps, if given (asked first, of the name alone)."""
    try:
        fd, real = _opened(fence, folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:  # not there, not a folder, or leading out
        return []
    try:
        with os.scandir(fd) as entries:
            return sorted(
                e.name
                for e in entries
                if (hidden or not e.name.startswith("."))
                and (keep is None or keep(e.name))
                and e.is_dir()
                and (not e.is_symlink() or holds(fence, os.path.join(real, e.name)))
            )
    finally:
        os.close(fd)


def open_regular(path: Path | str, fence: str | None = None) -> BinaryIO:
    """`path` open for reading, if it is a regular file (inside `fence` where one is given): a
    link at its end is not followed, as run-agent's own files are never links (one left in a
    file's place leads nowhere), nor is a FIFO waited on; else an OSError."""
    flags = os.O_RDONLY | os.O_NOFOLLOW
    if fence is not None:
        fd = open_in(fence, path, flags)
    else:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NONBLOCK)
    f = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        f.close()
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return f


# What `open_regular` says of a file a reader takes as not there: none, a link, not a regular
# file, or leading out of its project (any other error is a real one: a permission, a disk).
NOT_THERE = frozenset({errno.ENOENT, errno.ELOOP, errno.EINVAL, errno.EXDEV})


def tail(path: Path, max_bytes: int = 4096, fence: str | None = None) -> str:
    """The last `max_bytes` of a file as text, starting at a line boundary where possible; ""
    for what is no regular file (a link, a FIFO: never followed nor waited on) or is not there
    (or leads out of `fence`, where one is given)."""
    try:
        with open_regular(path, fence) as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return ""
    if size > max_bytes and b"\n" in data:
        data = data[data.index(b"\n") + 1 :]
    return data.decode("utf-8", errors="replace")
