"""The agent's own process under bubblewrap (`sandbox: bwrap`, `--sandbox bwrap`).

What the agent sees: the whole file system read-only, with a private /tmp, its own /proc and
/dev, and the home folder hidden (an empty one in its place). Writable, at their own paths: its
working folder (a worktree's git folders with it, so that it commits), its task folder (the run
folder, DONE), and the folders its CLI keeps its login and session state in (the backend's
`own_files`: claude's ~/.claude and ~/.claude.json, codex's $CODEX_HOME, gemini's ~/.gemini).
Read-only besides: the prefixes of the PATH folders under the home (where agent CLIs and their
runtimes are installed). The rest of the home (~/.ssh, other credentials, other projects) is
not there. Its network is the host's unless `network: false`, which gives it its own empty one.

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
