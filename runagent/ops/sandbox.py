"""The OS sandbox of shell operations: bubblewrap, with no network and only the workspace writable.

It is on by default where bwrap works (`auto`); `bwrap` insists on it, `none` turns it off. Under
bwrap a command sees the system folders (/usr and the /bin, /lib links, a few
files of /etc a program needs to start: the loader cache, certificates, passwd) read-only, its
workspace read-write at the same path, an empty /tmp (also its HOME), its own /proc and /dev, and
nothing else of the host: no home folder, no runs root, no other project. It has its own network
namespace with only a loopback of its own, so nothing outside is reachable, 127.0.0.1 of the host
included. Where bwrap is missing or cannot make its namespaces (user namespaces disallowed), the
command is not run under `bwrap`: one line says why, never an unconfined run; under `auto` it
runs unconfined, and the line saying why is in every shell event and in `doctor`.
"""

from __future__ import annotations

import enum
import functools
import os
import subprocess
import tempfile
from pathlib import Path

from runagent.errors import MissingDependencyError
from runagent.record import record

PROGRAM = "bwrap"
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs read from /etc to start and to name users; not the rest (keys, shadow, configs).
ETC = (
    "alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates",
    "passwd", "group", "nsswitch.conf", "localtime", "mime.types", "bash.bashrc", "profile",
)  # fmt: skip
PROBE_TIMEOUT = 20.0  # seconds bwrap may take to show it can build a sandbox here


class Sandbox(enum.StrEnum):
    """Where a shell operation runs: as the runtime's user (`none`), under bubblewrap (`bwrap`),
    or under bubblewrap where it works here and as the user elsewhere (`auto`, the default)."""

    AUTO = "auto"
    NONE = "none"
    BWRAP = "bwrap"


SANDBOXED = "sandboxed (bubblewrap)"


@record
class InForce:
    """The sandbox a choice comes to on this machine, and the line that says so."""

    sandbox: Sandbox  # NONE or BWRAP, never AUTO
    line: str  # "sandboxed (bubblewrap)" or "not sandboxed: <why>"

    @classmethod
    def of(cls, choice: Sandbox, workspace: Path) -> InForce:
        """What `choice` comes to here: `auto` probes bwrap once (the answer is cached)."""
        if choice is Sandbox.BWRAP:
            return cls(Sandbox.BWRAP, SANDBOXED)
        if choice is Sandbox.NONE:
            return cls(Sandbox.NONE, "not sandboxed: the sandbox is set to none")
        problem = Bwrap(workspace).problem()
        if problem is None:
            return cls(Sandbox.BWRAP, SANDBOXED)
        return cls(Sandbox.NONE, f"not sandboxed: {problem}")


@record
class Bwrap:
    """bubblewrap around commands acting in `workspace`; `program` is the bwrap to run."""

    workspace: Path
    program: str = PROGRAM

    def argv(self, inner: tuple[str, ...], cwd: Path) -> tuple[str, ...]:
        """`inner`, run in `cwd` (inside the workspace) under bwrap."""
        from runagent.programs import trusted  # never one the commands left in the workspace

        exe = trusted(self.program, not_under=(self.workspace,)) or self.program
        return (exe, *_arguments(self.workspace, cwd), "--", *inner)

    def problem(self) -> str | None:
        """Why commands cannot run under this bwrap here (one line), or None when they can."""
        from runagent.programs import trusted

        exe = trusted(self.program, not_under=(self.workspace,))
        if exe is None:
            return (
                f"sandbox bwrap: {self.program!r} not found on PATH; install bubblewrap "
                "(apt-get install bubblewrap) or leave out the sandbox"
            )
        return _probe(exe)

    def check(self) -> None:
        """Raise MissingDependencyError, saying why, unless commands can run under bwrap."""
        problem = self.problem()
        if problem is not None:
            raise MissingDependencyError(problem)


def _arguments(workspace: Path, cwd: Path) -> list[str]:
    args = ["--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]
    for top in SYSTEM:
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    for name in ETC:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    args += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    # After /tmp, so a workspace under /tmp is mounted into the empty one, not hidden by it.
    args += ["--bind", str(workspace), str(workspace)]
    args += git_arguments(workspace)
    args += ["--chdir", str(cwd), "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    return args


def dot_git_of(folder: Path) -> Path | None:
    """The `.git` (a folder, or a linked worktree's file) of the checkout `folder` is in: in it
    or in the nearest folder above that has one; None outside any checkout."""
    return next((f / ".git" for f in (folder, *folder.parents) if os.path.lexists(f / ".git")),
                None)  # fmt: skip


def git_arguments(workspace: Path) -> list[str]:
    """A workspace that is a git checkout keeps git working, and git's own code out of reach.

    A linked worktree keeps its repository in a `.git` file's `gitdir:`, outside the workspace:
    its folder and the repository's common folder are bound read-write, so `git commit` works
    there as in any checkout. Bound read-only over themselves, because git on the host would
    follow or run them the next time anyone uses it there: in every git folder `hooks/` (made,
    empty, where there is none, so that none can be planted) and `config`; a linked worktree's
    `.git` file and its folder's `commondir` and `gitdir` (which say where the repository is).
    A `.git` folder is bound over itself, so that it cannot be moved aside for one of the
    command's making.
    """
    dot_git = dot_git_of(workspace) or workspace / ".git"
    top = dot_git.parent
    pins: list[Path] = []
    borrowed: list[Path] = []
    try:
        if dot_git.is_dir() and not dot_git.is_symlink():
            folders = [dot_git]
        elif dot_git.is_file() and not dot_git.is_symlink():
            text = dot_git.read_text(encoding="utf-8", errors="replace")[:4096]
            line = next((s for s in text.splitlines() if s.startswith("gitdir:")), None)
            if line is None:
                return []
            own = (top / line.removeprefix("gitdir:").strip()).resolve()
            common_file = own / "commondir"
            common = (
                (own / common_file.read_text(encoding="utf-8").strip()).resolve()
                if common_file.is_file()
                else own
            )
            folders = [common, own] if common != own else [own]
            pins = [dot_git, own / "commondir", own / "gitdir"]
        else:
            return []
        for folder in folders:
            if folder.is_dir() and not (folder / "hooks").exists():
                (folder / "hooks").mkdir()
            alternates = folder / "objects" / "info" / "alternates"
            if alternates.is_file():  # a task's clone: the repository's objects, to read only
                pins.append(alternates)
                lines = alternates.read_text(encoding="utf-8").splitlines()[:8]
                borrowed += [Path(x) for x in lines if x.startswith("/") and x.endswith("objects")]
    except OSError:
        return []
    args: list[str] = []
    for folder in folders:
        if folder.is_dir() and not folder.is_relative_to(top):
            args += ["--bind", str(folder), str(folder)]
    for objects in borrowed:
        if objects.is_dir():
            args += ["--ro-bind", str(objects), str(objects)]
    if dot_git.is_dir():
        args += ["--bind", str(dot_git), str(dot_git)]
    for folder in dict.fromkeys(folders):
        pins += [folder / "hooks", folder / "config"]
    for path in pins:
        if path.exists() and not path.is_symlink():
            args += ["--ro-bind", str(path), str(path)]
    return args


@functools.cache
def _probe(exe: str) -> str | None:
    """Run `true` under the sandbox once: bwrap installed is not bwrap usable (a container
    without user namespaces refuses to make them)."""
    with tempfile.TemporaryDirectory(prefix="run-agent-bwrap-") as scratch:
        folder = Path(scratch).resolve()
        argv = [exe, *_arguments(folder, folder), "--", "/bin/sh", "-c", "true"]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, check=False,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"sandbox bwrap: {exe} could not be run ({exc}); leave out the sandbox"
    if done.returncode == 0:
        return None
    said = " ".join(done.stderr.split())[:300] or f"exit code {done.returncode}"
    return (
        f"sandbox bwrap: {exe} cannot build a sandbox here ({said}); user namespaces may be "
        "disallowed (a container without them, or kernel.unprivileged_userns_clone=0): allow "
        "them, or leave out the sandbox"
    )
