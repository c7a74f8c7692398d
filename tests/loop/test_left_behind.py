"""What a sandboxed agent leaves in its worktree, its clone and its folders never stalls or breaks
what run-agent runs afterwards on the host: a chain of folders deeper than Python recurses,
a FIFO as its clone's index. Real bubblewrap, `type: command` agents running `python -c`, a runs
root outside /tmp and the home."""

from __future__ import annotations

import contextlib
import os
import subprocess

import psutil

from runagent.errors import ExitCode
from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, make_repo
from tests.loop.sandboxing import agent, needs_bwrap

pytestmark = needs_bwrap


def said(ws: Workspace) -> str:
    return "".join(ws.task().run(r.run_id).stdout.read_text() for r in ws.runs())


DEEP = 3000  # folders in a chain: deeper than Python's recursion limit


def test_a_deep_tree_the_agent_leaves_does_not_break_gc_or_delete(ws_outside: Workspace) -> None:
    """An agent leaves a chain of folders 3,000 deep in its run folder and in its view of the
    task folder (`.sandbox/`). `gc` (for the whole root: every project's cleanup) and `delete`
    walk them recursively (folder_size's rglob, rmtree) and end in a RecursionError traceback;
    nothing is removed, so one agent stops the cleanup of every project."""
    ws = ws_outside
    code = (
        "import os\n"
        "for place in (os.environ['RUN_FOLDER'], os.environ['TASK_FOLDER']):\n"
        "    os.chdir(place)\n"
        f"    for _ in range({DEEP}):\n"
        "        os.mkdir('d'); os.chdir('d')\n"
        "    open('f', 'w').write('x')\n"
    )
    agent(ws, code, network=True)
    try:
        done = ws.cli("-p", "p", "-t", "t", "go")
        assert done.returncode == ExitCode.COMPLETED, done.stderr
        (run,) = ws.runs()
        folder = ws.task().run_folder(run.run_id)
        gc = ws.cli("gc", "--older-than", "0s", "--keep-last", "0")
        assert "Traceback" not in gc.stderr, gc.stderr[-400:]
        assert gc.returncode == ExitCode.COMPLETED, gc.stderr[-400:]
        assert not folder.exists()
        deleted = ws.cli("delete", "-p", "p", "-t", "t", "--yes")
        assert "Traceback" not in deleted.stderr, deleted.stderr[-400:]
        assert deleted.returncode == ExitCode.COMPLETED, deleted.stderr[-400:]
        assert not ws.task().folder.exists()
    finally:  # shutil.rmtree of the fixture recurses too
        subprocess.run(["rm", "-rf", str(ws.root)], check=False)


def test_a_fifo_the_agent_leaves_as_its_clones_index_stalls_nothing(
    ws_outside: Workspace,
) -> None:
    """A worktree agent replaces its clone's `index` (in worktree.git, which it writes to
    commit) by a FIFO. Every git run-agent runs there afterwards opens it and waits for ever:
    `worktrees`, `merge` and `worktrees prune --force` never answer (and the git they started
    is left behind). The first round closed FIFOs in the run folder, not in the clone."""
    ws = ws_outside
    repo = make_repo(ws.path / "repo")
    code = (
        "import os, subprocess\n"
        "gd = subprocess.run(['git', 'rev-parse', '--absolute-git-dir'], capture_output=True,"
        " text=True).stdout.strip()\n"
        "open('untracked.txt', 'w').write('work')\n"
        "os.unlink(gd + '/index'); os.mkfifo(gd + '/index'); print('fifo:', gd)\n"
    )
    agent(ws, code, env=GIT_ENV, network=True)
    base = ws.cli_argv("--config", str(ws.config), "--root", str(ws.root))
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run([*base, "-p", "p", "-t", "t", "--worktree", "go"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    assert "fifo: " in said(ws)
    stalled = []
    for args in (["worktrees"], ["merge", "-p", "p", "-t", "t"],
                 ["worktrees", "prune", "--force"]):  # fmt: skip
        try:
            answer = subprocess.run([*base, *args], cwd=repo, env=env, capture_output=True,
                                    text=True, timeout=30)  # fmt: skip
            assert "Traceback" not in answer.stderr, (args, answer.stderr[-400:])
        except subprocess.TimeoutExpired:
            stalled.append(" ".join(args))
        for proc in psutil.process_iter(["cmdline"]):  # the git a stalled command left
            if ws.marker in " ".join(proc.info["cmdline"] or ()):
                with contextlib.suppress(psutil.Error):
                    proc.kill()
    assert not stalled, f"stalled on a FIFO the agent planted: {stalled}"
