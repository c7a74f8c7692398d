"""The agent's own process under bubblewrap (`sandbox: bwrap`, `--sandbox bwrap`).

What the agent sees: the whole file system read-only, with a private /tmp, its own /proc and
/dev, and the home folder and the runs root hidden (an empty folder in place of each). Writable,
at their own paths, and nothing else: its working folder (a worktree with it, and what git needs
to commit there: `git_arguments`), its current run's folder, and a private copy of the folders
and files its CLI keeps its login, settings and sessions in (the backend's `own_files`: claude's
~/.claude and ~/.claude.json, codex's $CODEX_HOME, gemini's ~/.gemini), the task's own (in its
`.cli` folder, never read by run-agent), at their real paths: what the agent writes there (hooks,
MCP servers, `notify`) is never what the CLI runs on the host. Through it, the CLI's login files
(`login_files`) are the real ones, so a refreshed token lands where the host reads it (a copy
taken back when the run ends, for a CLI that renames its login over: `take_back_login`), and its
settings files (`settings_files`) the real ones read-only. Read-only besides: the prefixes of
the PATH folders under the home (where agent CLIs and their runtimes are installed), the agent's
own program where the sandbox would hide it (its install prefix, the folder of the script its
command names; never the home or a folder that holds it), and the config file the loop was
started with wherever it lies (config.yaml in the folder the agent works in stays as it was).

Its task folder is a view: its own files (TASK.md, ISSUE.md, the task's record) and its earlier
runs read-only, its current run read-write, and anything else it writes there lands in a folder
of its own (`.sandbox` in the task folder) that run-agent never reads, but for the `DONE` it
writes, which `collect_done` takes into the task folder once the run has ended, as a file of at
most DONE_LIMIT bytes. So nothing the agent can write decides how the task is run next: not
task.yaml, not the config, not the queue or the tokens under the runs root, not another task.

Mounts are made shallowest first, so a folder hidden is never brought back by one that holds it;
at one path, a hidden folder is made last.

The task's check (runagent/loop/check.py) runs under the same wrap when its agent does, with no
run folder to write (every run read-only, its output a descriptor), no copy of the CLI's files
and no login: what it writes where the agent could is all it can write, and a DONE it leaves in
the view is dropped (`after_check`).

It runs in its own PID namespace: when its first process ends, or the reaper kills the tree,
the kernel ends every process left in it, setsid and double-forked ones included. Its network
is the host's unless `network: false`, which gives it its own empty one.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import field, replace
from pathlib import Path

from runagent.errors import UsageError
from runagent.ops.sandbox import PROGRAM, Bwrap, dot_git_of, git_arguments
from runagent.process import LaunchSpec, resolve_executable
from runagent.record import record
from runagent.store import runfolder
from runagent.store.runfolder import TaskPaths

DONE_LIMIT = 64 * 1024  # bytes of a DONE a sandboxed agent wrote that are kept
# Variables naming a socket of the host's session (an ssh agent, the session bus, docker).
_SOCKET_VARIABLES = ("SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "DOCKER_HOST")
# Sockets of the host's daemons that would run what they are asked on the host.
_DAEMON_SOCKETS = ("/run/docker.sock", "/var/run/docker.sock", "/run/containerd/containerd.sock",
                   "/run/podman/podman.sock", "/run/dbus/system_bus_socket")  # fmt: skip
# Files of its run the agent never replaces (runagent/store/runfolder.py names them).
# (Not run-info.yaml: the supervisor replaces it while the run goes on, which would take a
# mount off it; the readers of a run's record never follow a link nor wait on a FIFO, and
# the supervisor's next write puts its record back.)
_KEPT = (runfolder.PROMPT, runfolder.STDOUT, runfolder.STDERR)
LOGIN_LIMIT = 1024 * 1024  # bytes of a login file taken back from a sandboxed run, at most
SEED = ".given"  # beside a login's copy in the task's `.cli`: the login the run was given
# Files of the task folder the agent never sees in its view (the lock is the supervisor's).
_UNSHOWN = frozenset({runfolder.LOCK, runfolder.SANDBOX_VIEW, runfolder.DONE})


@record
class Reach:
    """What one sandboxed run may touch besides the system: its task (whose folder it sees as a
    view, `task.sandbox_view`), its run folder, its CLI's own files, and files that decide what
    runs on the host (`control`: the config file), read-only wherever they lie."""

    task: TaskPaths
    run_folder: Path | None  # None: no run folder to write (a check, whose output is a descriptor)
    own: tuple[Path, ...] = ()
    control: tuple[Path, ...] = ()
    network: bool = True
    login: tuple[Path, ...] = ()  # the files of `own` that hold the CLI's login
    settings: tuple[Path, ...] = ()  # the files of `own` that hold the user's settings
    login_renamed: bool = False  # the CLI renames a new login over the old (Backend)


@record
class _Mount:
    kind: str  # "--bind", "--ro-bind", "--ro-bind-try" or "--tmpfs"
    target: Path
    source: Path | None = None
    hides: bool = field(default=False)  # made last of the mounts at its path

    def args(self) -> list[str]:
        if self.source is None:
            return [self.kind, str(self.target)]
        return [self.kind, str(self.source), str(self.target)]


def wrap(spec: LaunchSpec, reach: Reach) -> LaunchSpec:
    """`spec` as it runs under bubblewrap (see the module); the argv names bwrap, and then the
    agent's executable by its full path. Makes the task's view folder."""
    exe = resolve_executable(spec.argv[0], spec.env, spec.cwd) or spec.argv[0]
    home = _home(spec.env)
    refuse_working_folder(spec.cwd, home)
    mounts = [_Mount("--tmpfs", Path("/tmp"), hides=True)]
    mounts += _sessions_hidden(spec.env)
    if home is not None:
        mounts.append(_Mount("--tmpfs", home, hides=True))
        mounts += [_ro(prefix) for prefix in _installed_under(home, spec.env.get("PATH", ""))]
    for folder in _program_folders(exe, spec.argv[1:], home):  # where they are hidden
        mounts.append(_ro(folder))
    root = reach.task.root.resolve()
    if root != Path("/"):
        mounts.append(_Mount("--tmpfs", root, hides=True))
    mounts += _task_view(reach)
    cwd = spec.cwd.resolve()
    mounts.append(_rw(_worktree_of(cwd, reach.task) or cwd))
    mounts += _own_copies(reach)
    mounts += _parsed(git_arguments(spec.cwd))
    visible = [m.target for m in mounts if m.kind == "--bind"]
    for path in reach.control:  # read-only wherever the agent could otherwise write it
        if path.is_file() and any(path.resolve().is_relative_to(w) for w in visible):
            mounts.append(_ro(path.resolve()))
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for mount in sorted(mounts, key=lambda m: (len(m.target.parts), m.hides)):
        args += mount.args()
    args += [
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--cap-drop",
        "ALL",
    ]  # fmt: skip (run by root: no caps)
    for name in _SOCKET_VARIABLES:  # what names a socket of the host's session
        args += ["--unsetenv", name]
    args += ["--chdir", str(spec.cwd), "--setenv", "TMPDIR", "/tmp"]
    from runagent.programs import trusted  # never a bwrap the agent left in its folder

    bwrap = trusted(PROGRAM, spec.env, (spec.cwd, reach.task.root)) or PROGRAM
    if reach.network:
        return replace(spec, argv=(bwrap, *args, "--", exe, *spec.argv[1:]))
    # No network: its own empty one, and no unix socket of the host's file system either (a
    # seccomp filter refuses socket(AF_UNIX)), handed to bwrap on descriptor 9 by a shell.
    rules = reach.task.folder / runfolder.SECCOMP
    with open(rules, "wb", opener=runfolder.private) as f:  # the agent's view hides it
        f.write(seccomp_no_sockets())
    args += ["--unshare-net", "--seccomp", "9"]
    shell = ("/bin/sh", "-c", 'exec 9<"$1" && shift && exec "$@"', "sh", str(rules))
    return replace(spec, argv=(*shell, bwrap, *args, "--", exe, *spec.argv[1:]))


# The system calls a seccomp filter names, by machine: its audit arch, socket, io_uring_setup.
_CALLS = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}


def seccomp_no_sockets() -> bytes:
    """A classic BPF program for bwrap's --seccomp: socket(AF_UNIX, ...) fails with EACCES, as
    does io_uring_setup (whose operations a filter cannot see), any call of another ABI (x32,
    a 32-bit program's socketcall); everything else is allowed. MissingDependencyError on a
    machine it is not written for."""
    import errno
    import platform
    import struct

    try:
        arch, socket_nr, io_uring_nr = _CALLS[platform.machine()]
    except KeyError:
        from runagent.errors import MissingDependencyError

        raise MissingDependencyError(
            f"network: false cannot shut out unix sockets on {platform.machine()}; "
            "set network: true or run on x86_64 or aarch64"
        ) from None
    ld, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, JGE|K, BPF_RET|K
    refuse, allow = 0x00050000 | errno.EACCES, 0x7FFF0000  # SECCOMP_RET_ERRNO, _ALLOW
    program = [
        (ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, refuse),  # another ABI: refused
        (ld, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, refuse),  # x32: refused
        (jeq, 0, 1, io_uring_nr), (ret, 0, 0, refuse),
        (jeq, 0, 3, socket_nr), (ld, 0, 0, 16), (jeq, 0, 1, 1), (ret, 0, 0, refuse),  # AF_UNIX
        (ret, 0, 0, allow),
    ]  # fmt: skip
    return b"".join(struct.pack("=HBBI", *step) for step in program)


def check(folder: Path) -> None:
    """Raise MissingDependencyError saying why, unless an agent can run under bwrap here."""
    Bwrap(folder).check()


def refuse_working_folder(folder: Path, home: Path | None) -> None:
    """A sandboxed agent does not work in the home folder itself: the sandbox hides the home,
    and making it writable would bring back all it hides (UsageError saying what to do)."""
    if home is not None and folder.resolve() == home:
        raise UsageError(
            f"a sandboxed agent cannot work in the home folder {str(home)!r} itself (it would "
            "see ~/.ssh and every credential there); give --cwd a folder under it"
        )


def collect_done(task: TaskPaths) -> bool:
    """Take the DONE a sandboxed agent wrote in its view of the task folder into the task
    folder, as a file of at most DONE_LIMIT bytes; a DONE that is not a regular file (a link,
    a folder) is not taken. Whether one was taken."""
    seen = task.sandbox_view / runfolder.DONE
    try:
        fd = os.open(seen, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            text = f.read(DONE_LIMIT)
    finally:
        os.close(fd)
    runfolder.atomic_write(task.done, text.decode("utf-8", errors="replace"))
    seen.unlink(missing_ok=True)
    return True


def after_run(reach: Reach, working_dir: Path, run_id: str) -> list[str]:
    """What is done once a sandboxed run's agent has ended, before anything reads what it left:
    its DONE taken in, its CLI's login taken back, a planted `commondir` moved aside, and what
    is no file or folder removed from its clone's git folder. Lines for the run's note."""
    collect_done(reach.task)
    take_back_login(reach)
    return _disarmed(reach, working_dir, run_id)


def after_check(reach: Reach, working_dir: Path, run_id: str) -> list[str]:
    """What is done once a sandboxed check (runagent/loop/check.py) has ended: a DONE it wrote in
    its view of the task folder is dropped, never taken (a check says pass or fail by its exit
    code alone), and the checkout's git disarmed as after a run. Lines for the run's note."""
    _remove(reach.task.sandbox_view / runfolder.DONE)
    return _disarmed(reach, working_dir, run_id)


def _disarmed(reach: Reach, working_dir: Path, run_id: str) -> list[str]:
    from runagent.store.cleanup import disarm_tree

    clone = reach.task.worktree_git
    why = "it would send git to a repository of the agent's making"
    notes = [f"moved aside {moved}, which the agent wrote: {why}"
             for moved in disarm_git(working_dir, run_id, clone)]  # fmt: skip
    if disarm_tree(clone):
        why = "git on the host would follow it or wait on it"
        notes.append(f"removed what was no file from its clone's git: {why}")
    return notes


def disarm_git(folder: Path, run_id: str, clone: Path | None = None) -> list[str]:
    """After a sandboxed run in a checkout whose `.git` is a folder (the agent's to commit in),
    and in its task's own clone's git folder (`clone`): a `commondir` there, which git writes
    only in a linked worktree's own folder and which would send the next git to a repository
    of the agent's making, is moved aside (to `commondir.from-<run id>`). What was moved."""
    folders = [clone, dot_git_of(folder)]
    return [moved for f in folders if f is not None for moved in _move_commondir(f, run_id)]


def _move_commondir(git_folder: Path, run_id: str) -> list[str]:
    planted = git_folder / "commondir"
    if git_folder.is_symlink() or not git_folder.is_dir() or not os.path.lexists(planted):
        return []
    try:
        planted.rename(git_folder / f"commondir.from-{run_id}")
    except OSError:
        return []
    return [str(planted)]


def _sessions_hidden(env: Mapping[str, str]) -> list[_Mount]:
    """The host session's sockets out of reach, whatever the network: the runtime folders
    (`/run/user`, `$XDG_RUNTIME_DIR`: the session bus, systemd's user manager, an ssh or
    keyring agent) are empty in the sandbox, and the daemons' sockets (docker, the system bus)
    are /dev/null."""
    hidden = [Path("/run/user"), Path(env.get("XDG_RUNTIME_DIR") or "/run/user")]
    mounts = [_Mount("--tmpfs", f.resolve(), hides=True) for f in dict.fromkeys(hidden)
              if f.is_absolute() and f.is_dir() and f.resolve() != Path("/")]  # fmt: skip
    for socket in _DAEMON_SOCKETS:
        if os.path.exists(socket):
            mounts.append(_Mount("--ro-bind", Path(socket).resolve(), Path("/dev/null")))
    return mounts


def _task_view(reach: Reach) -> list[_Mount]:
    """The task folder as the agent sees it: its own folder (`.sandbox`) with the task's files
    and earlier runs read-only, and the current run read-write (see the module)."""
    folder = reach.task.folder.resolve()
    view = folder / runfolder.SANDBOX_VIEW
    view.mkdir(mode=0o700, exist_ok=True)
    mounts = [_Mount("--bind", folder, view)]
    shown = [runfolder.RUNS, runfolder.WORKTREE, runfolder.WORKTREE_GIT]  # mounted by wrap()
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name not in _UNSHOWN and entry.is_file(follow_symlinks=False):
            mounts.append(_ro(folder / entry.name))
            shown.append(entry.name)
    runs = folder / runfolder.RUNS
    if runs.is_dir() and not runs.is_symlink():
        mounts.append(_ro(runs))
    if reach.run_folder is not None:  # (a check has none: every run read-only to it)
        run = reach.run_folder.resolve()
        mounts.append(_rw(run))
        for name in _KEPT:  # read-only over themselves: the agent writes its output through
            # the descriptors it was started with, and can neither replace them (a link to a
            # file of the home, a FIFO) nor rewrite its prompt
            mounts.append(_Mount("--ro-bind-try", run / name, run / name))
    for name in shown:  # what the agent left at a mount point's place: mounts land on no link
        _remove(view / name)
    return mounts


def _own_copies(reach: Reach) -> list[_Mount]:
    """The CLI's own files as the agent sees them (see the module): at each one's real path, the
    task's private copy (a folder kept from run to run; a file copied afresh from the real one),
    with the real login files (or, for a CLI that renames its login, a copy taken back by
    `take_back_login`) and the real settings files, read-only, in a folder."""
    mounts: list[_Mount] = []
    copies = reach.task.cli_copies
    copies.mkdir(mode=0o700, exist_ok=True)
    for path in map(_absolute, reach.own):
        if not path.exists():  # the CLI makes it where it can (in the hidden home), for this run
            continue
        private = copies / _flat(path)
        if path.is_file():
            _remove(private)
            _copy(path, private)
            mounts.append(_Mount("--bind", path, private))
            continue
        if private.is_symlink() or not private.is_dir():
            _remove(private)
            private.mkdir(mode=0o700)
        mounts.append(_Mount("--bind", path, private))
        for file in map(_absolute, reach.login + reach.settings):
            if file.parent != path or not file.is_file():
                continue  # only files right in the folder: no link of the agent's is followed
            _remove(private / file.name)  # what the agent left at a mount point's place
            if file in reach.settings:
                mounts.append(_ro(file))
            elif reach.login_renamed:  # a copy, taken back when the run ends
                _copy(file, private / file.name)
                _copy(file, copies / (_flat(file) + SEED))
            else:
                mounts.append(_rw(file))
    return mounts


def take_back_login(reach: Reach) -> None:
    """For a CLI that renames a new login over the old (codex's auth.json), the login its
    sandboxed run left in its private copy, into the real place: only a regular file of at most
    LOGIN_LIMIT bytes, and only if the real one is still the one the run was given (a login made
    on the host meanwhile is newer). Never raises: a login not taken back is the CLI's to redo."""
    if not reach.login_renamed:
        return
    copies = reach.task.cli_copies
    for file in map(_absolute, reach.login):
        seed = copies / (_flat(file) + SEED)
        given = _read(seed)
        if given is None or file.parent not in map(_absolute, reach.own):
            continue
        seed.unlink(missing_ok=True)
        left = _read(copies / _flat(file.parent) / file.name)
        if left is None or left == given or _read(file) != given:
            continue
        try:
            runfolder.atomic_write_bytes(file, left)
        except OSError:
            pass


def _flat(path: Path) -> str:
    """A private copy's name in the task's `.cli` folder: its real path as one name (so that no
    copy lies in another, where the agent could have left a link)."""
    return str(path).strip("/").replace("%", "%25").replace("/", "%2F")


def _absolute(path: Path) -> Path:
    return Path(os.path.abspath(path))


def _copy(source: Path, target: Path) -> None:
    """`source` (the user's) into `target` (a name the agent cannot have made a link: it is
    removed first by the caller), private to the user."""
    data = source.read_bytes()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _read(path: Path) -> bytes | None:
    """A regular file's bytes, at most LOGIN_LIMIT of them, never through a link; else None."""
    from runagent.store.jsonfile import Unreadable, read_capped

    try:
        return read_capped(path, LOGIN_LIMIT, follow=False)
    except (OSError, Unreadable):
        return None


def _worktree_of(cwd: Path, task: TaskPaths) -> Path | None:
    """The task's worktree, when the agent works in it (its whole checkout is writable)."""
    tree = task.worktree.resolve()
    return tree if cwd.is_relative_to(tree) else None


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        from runagent.store.cleanup import remove_tree

        remove_tree(path)
    else:
        path.unlink(missing_ok=True)


def _parsed(args: list[str]) -> list[_Mount]:
    """git_arguments' `--bind SRC DST`, `--ro-bind SRC DST` and `--tmpfs DST` as mounts."""
    mounts, rest = [], list(args)
    while rest:
        kind = rest.pop(0)
        if kind == "--tmpfs":
            mounts.append(_Mount(kind, Path(rest.pop(0)), hides=True))
        elif kind in ("--bind", "--ro-bind"):
            source, target = rest.pop(0), rest.pop(0)
            mounts.append(_Mount(kind, Path(target), Path(source)))
        else:  # a mount this module does not order: a bug, said at once
            raise ValueError(f"git_arguments gave {kind!r}, which wrap() cannot order")
    return mounts


def _ro(path: Path) -> _Mount:
    return _Mount("--ro-bind", path, path)


def _rw(path: Path) -> _Mount:
    return _Mount("--bind", path, path)


def _home(env: Mapping[str, str]) -> Path | None:
    home = env.get("HOME") or os.environ.get("HOME")
    if not home or not os.path.isdir(home):
        return None
    resolved = Path(home).resolve()
    return None if resolved == Path("/") else resolved


def _program_folders(exe: str, args: Iterable[str], home: Path | None) -> list[Path]:
    """What the agent's program needs to start, read-only, should it live where the sandbox
    hides (under /tmp or the home): its executable's install prefix, by the path it is called
    by and by its real path (a venv and the interpreter it links to; a node package's whole
    node_modules), and the folder of the first file its command line names by full path (the
    script an interpreter runs; files named after it are the agent's business, not shared).
    Never the home or a folder that holds it: then the narrowest folder that is not, or the
    file alone (~/bin for ~/bin/agent, ~/agent.py itself)."""
    paths = [Path(exe), Path(os.path.realpath(exe))]
    script = next((a for a in args if a.startswith("/") and os.path.isfile(a)), None)
    if script is not None:  # the first file it names: what an interpreter runs, not its data
        paths.append(Path(script))
    found: list[Path] = []
    for path in paths:
        parts = path.parts
        if "node_modules" in parts:
            folder = Path(*parts[: parts.index("node_modules") + 1])
        elif path.parent.name == "bin":
            folder = path.parent.parent
        else:
            folder = path.parent
        for narrower in (folder, path.parent, path):
            if home is None or not home.is_relative_to(narrower.resolve()):
                folder = narrower
                break
        folder = folder.resolve()  # a mount's path holds no link (bwrap cannot make one there)
        if folder != Path("/") and folder not in found and folder.exists():
            found.append(folder)
    return found


def _installed_under(home: Path, path: str) -> list[Path]:
    """The install prefixes of the PATH folders under `home` (~/.local for ~/.local/bin)."""
    found: list[Path] = []
    for entry in path.split(os.pathsep):
        folder = Path(entry)
        if not entry or not folder.is_absolute() or not folder.is_dir():
            continue
        if folder.resolve().is_relative_to(home) and folder.resolve() != home:
            prefix = folder.parent if folder.name == "bin" else folder
            if prefix.resolve() != home and prefix not in found:
                found.append(prefix)
    return found
