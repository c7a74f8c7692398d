"""The agent's own process under bubblewrap (`sandbox: bwrap`, `--sandbox bwrap`).

What the agent sees: the whole file system read-only, with a private /tmp, its own /proc and
/dev, and the home folder hidden (an empty one in its place). Writable, at their own paths: its
working folder (a worktree's git folders with it, so that it commits), its task folder (the run
folder, DONE), and the folders its CLI keeps its login and session state in (the backend's
`own_files`: claude's ~/.claude and ~/.claude.json, codex's $CODEX_HOME, gemini's ~/.gemini).
Read-only besides: the prefixes of the PATH folders under the home (where agent CLIs and their
runtimes are installed), and the agent's own program where the sandbox would hide it (its
install prefix, the script its command names). The rest of the home (~/.ssh, other
credentials, other projects) is not there. Its network is the host's unless `network: false`,
which gives it its own empty one.

It runs in its own PID namespace: when its first process ends, or the reaper kills the tree,
the kernel ends every process left in it, setsid and double-forked ones included.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from runagent.loop.process import LaunchSpec, resolve_executable
from runagent.ops.sandbox import PROGRAM, Bwrap, git_arguments


def wrap(
    spec: LaunchSpec, task_folder: Path, own: Iterable[Path], *, network: bool = True,
) -> LaunchSpec:  # fmt: skip
    """`spec` as it runs under bubblewrap (see the module); the argv names bwrap, and then the
    agent's executable by its full path."""
    exe = resolve_executable(spec.argv[0], spec.env, spec.cwd) or spec.argv[0]
    args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent"]  # fmt: skip
    if not network:
        args.append("--unshare-net")
    home = spec.env.get("HOME") or os.environ.get("HOME")
    if home and os.path.isdir(home) and Path(home).resolve() != Path("/"):
        args += ["--tmpfs", home]
        for prefix in _installed_under(Path(home), spec.env.get("PATH", "")):
            args += ["--ro-bind", str(prefix), str(prefix)]
    for folder in _program_folders(exe, spec.argv[1:]):  # where they are hidden (/tmp, home)
        args += ["--ro-bind", str(folder), str(folder)]
    writable = [spec.cwd, task_folder, *own]
    for path in writable:
        if os.path.exists(path):
            args += ["--bind", str(path), str(path)]
    args += git_arguments(spec.cwd)
    args += ["--chdir", str(spec.cwd), "--setenv", "TMPDIR", "/tmp"]
    bwrap = shutil.which(PROGRAM) or PROGRAM
    return replace(spec, argv=(bwrap, *args, "--", exe, *spec.argv[1:]))


def check(folder: Path) -> None:
    """Raise MissingDependencyError saying why, unless an agent can run under bwrap here."""
    Bwrap(folder).check()


def _program_folders(exe: str, args: Iterable[str]) -> list[Path]:
    """What the agent's program needs to start, read-only, should it live where the sandbox
    hides (under /tmp or the home): its executable's install prefix, by the path it is called
    by and by its real path (a venv and the interpreter it links to; a node package's whole
    node_modules), and the folder of the first file its command line names by full path (the
    script an interpreter runs; files named after it are the agent's business, not shared)."""
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
        if folder != Path("/") and folder not in found and folder.is_dir():
            found.append(folder)
    return found


def _installed_under(home: Path, path: str) -> list[Path]:
    """The install prefixes of the PATH folders under `home` (~/.local for ~/.local/bin)."""
    found: list[Path] = []
    for entry in path.split(os.pathsep):
        folder = Path(entry)
        if not entry or not folder.is_absolute() or not folder.is_dir():
            continue
        if folder.resolve().is_relative_to(home.resolve()) and folder.resolve() != home.resolve():
            prefix = folder.parent if folder.name == "bin" else folder
            if prefix.resolve() != home.resolve() and prefix not in found:
                found.append(prefix)
    return found
