"""What a task's own clone costs against a linked worktree, measured side by side in one run.

A worktree task's git folder is a clone of the repository that borrows its objects
(`git clone --shared`, the objects read-only to a sandboxed agent), its branch brought back
into the repository after each run (objects packed from the clone, `update-ref`), instead of
`git worktree add` (which shares the repository's refs and objects with the agent, writable).
For a repository of --files files (default 2,000, a few KiB each, one commit) and a small one,
taking turns: making each (branch, checkout), and bringing one new commit back, median and max
of --repeat (default 10). Nothing asserts on speed; its temp folder goes at the end.

    python bench/git_clone.py [--repeat 10] [--files 2000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ENV = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@example.invalid",
       "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@example.invalid",
       "GIT_CONFIG_NOSYSTEM": "1"}  # fmt: skip


def git(folder: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(folder), *args], env=ENV, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return done.stdout.strip()


def repository(folder: Path, files: int) -> Path:
    folder.mkdir(parents=True)
    git(folder, "init", "-q", "-b", "main")
    for n in range(files):
        sub = folder / f"d{n % 50}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{n}.txt").write_text(f"file {n}\n" * 200)
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "initial")
    return folder


def linked(repo: Path, task: Path, n: int) -> float:
    began = time.perf_counter()
    git(repo, "worktree", "add", "--quiet", "-b", f"w/{n}", str(task / "worktree"), "main")
    return time.perf_counter() - began


def cloned(repo: Path, task: Path, n: int) -> float:
    from runagent.issues.repository import GitDirs
    from runagent.issues.repository import git as host_git
    from runagent.issues.worktree import _local_branches

    began = time.perf_counter()
    host_git(repo, "branch", "--no-track", f"c/{n}", "main")
    host_git(task, "clone", "--quiet", "--shared", "--template=", "--branch", f"c/{n}",
             "--separate-git-dir", str(task / "worktree.git"), str(repo),
             str(task / "worktree"))  # fmt: skip
    dirs = GitDirs(task / "worktree.git", task / "worktree.git", task / "worktree")
    _local_branches(task, f"c/{n}", ENV, dirs)  # the repository's branches, local in the clone
    return time.perf_counter() - began


def bring_back(repo: Path, task: Path, n: int) -> float:
    """One commit in the clone, then the supervisor's sync of its branch."""
    from runagent.issues import worktree
    from runagent.store import taskfolder
    from runagent.store.runfolder import TaskPaths

    paths = TaskPaths(task.parent.parent, task.parent.name, task.name)
    (task / "worktree" / "new.txt").write_text("work\n")
    git(task / "worktree", "add", "-A")
    git(task / "worktree", "commit", "-q", "-m", "work")
    taskfolder.write_worktree_record(paths, {
        "repo": str(repo), "branch": f"c/{n}", "fork": git(repo, "rev-parse", "main"),
        "clone": True, "git_dir": str(task / "worktree.git"),
        "common_dir": str(task / "worktree.git")})  # fmt: skip
    began = time.perf_counter()
    worktree.sync_branch(paths, ENV)
    return time.perf_counter() - began


def figures(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:7.1f} ms  max {max(times) * 1000:7.1f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 50 files (for CI)")
    args = parser.parse_args()
    repeat, files = (2, 50) if args.quick else (args.repeat, args.files)
    scratch = Path(tempfile.mkdtemp(prefix="run-agent-bench-git-"))
    try:
        for label, size in (("small (1 file)", 1), (f"{files} files", files)):
            repo = repository(scratch / f"repo-{size}", size)
            made: dict[str, list[float]] = {"worktree add": [], "clone --shared": []}
            back: list[float] = []
            for n in range(repeat):  # taking turns
                for kind, how in (("worktree add", linked), ("clone --shared", cloned)):
                    task = scratch / "runs" / f"p{size}" / f"{kind[0]}{n}"
                    task.mkdir(parents=True)
                    made[kind].append(how(repo, task, n))
                    if kind == "clone --shared":
                        back.append(bring_back(repo, task, n))
            print(f"{label}:")
            for kind, times in made.items():
                print(f"  make ({kind:14}) {figures(times)}")
            ratio = statistics.median(made["clone --shared"]) / statistics.median(
                made["worktree add"]
            )
            print(f"  clone / worktree add: x{ratio:.2f}")
            print(f"  bring a commit back    {figures(back)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
