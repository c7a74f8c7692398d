"""What run-agent does on the host beside and after a sandboxed agent: the programs it runs
itself (bwrap, git) never come from a folder the agent writes, and what reads a run's files
(the server, the loop's parsers, `output`) does so in bounded memory, however large the agent
made them. Real bubblewrap, `type: command` agents running `python -c` (one `type: claude`), a
runs root outside /tmp and the home."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import psutil

from runagent.errors import ExitCode
from tests.conftest import Workspace, serving
from tests.gitrepo import make_repo
from tests.loop.sandboxing import agent, needs_bwrap

pytestmark = needs_bwrap

MiB = 1 << 20
SPARSE = 512 * MiB  # a run file's size on paper: its blocks are a hole (ftruncate), none on disk
BOUND = 256 * MiB  # what reading such a file may cost a process of the host, at the most


def _sparse_output(size: int) -> str:
    """An agent whose stdout and stderr grow to `size` bytes without a block written: one line,
    then ftruncate on the descriptors it was given (which its read-only files do not stop)."""
    return (
        "import os, sys\n"
        "print('hello', flush=True)\n"
        f"os.ftruncate(1, {size}); os.ftruncate(2, {size})\n"
        "sys.exit(1)\n"
    )


def _peak_of_children(argv: list[str], cwd: Path) -> tuple[int, int]:
    """Run `argv` under a Python of its own and say (its exit code, the peak resident memory in
    bytes of any process it waited on): what that command cost the host at its worst."""
    code = (
        "import resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL,"
        " stderr=subprocess.DEVNULL)\n"
        "print(done.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    said = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    returncode, kib = said.stdout.split()
    return int(returncode), int(kib) * 1024


def test_a_relative_folder_on_path_never_picks_the_sandbox_from_the_agents_folder(
    ws_outside: Workspace,
) -> None:
    """bwrap is looked up on PATH, relative entries too (`./node_modules/.bin`, an idiom; `.`),
    from the folder the loop runs in, which is the agent's working folder in the README's
    layout. The agent plants `node_modules/.bin/bwrap` there; the loop's next attempt runs it
    on the host, as the user, with no sandbox at all."""
    ws = ws_outside
    escaped = ws.root / "escaped"  # the runs root: hidden in the sandbox, real on the host
    planted = f"#!/bin/sh\necho ran on the host > {escaped}\nexit 0\n"
    agent(
        ws,
        "import os, sys\n"
        "os.makedirs('node_modules/.bin', exist_ok=True)\n"
        f"open('node_modules/.bin/bwrap', 'w').write({planted!r})\n"
        "os.chmod('node_modules/.bin/bwrap', 0o755)\n"
        "sys.exit(1)\n",
        max_restarts=1,
        restart_delay="50ms",
    )
    path = os.pathsep.join(["./node_modules/.bin", os.environ.get("PATH", os.defpath)])
    ws.cli("-p", "p", "-t", "t", "go", env={"PATH": path})
    assert (ws.path / "node_modules" / ".bin" / "bwrap").exists()  # the agent did plant it
    assert not escaped.exists(), "the agent's own bwrap ran on the host as the sandbox"


def test_a_relative_folder_on_path_never_picks_the_git_run_beside_the_agent(
    ws_outside: Workspace,
) -> None:
    """The same for git: run-agent's own git (here the ready marker's check after each run, in
    a plain checkout) is looked up on PATH from the loop's folder and run in the agent's, so a
    `node_modules/.bin/git` the agent wrote runs on the host (three times after one run,
    measured), whatever hooks and config git itself is told to ignore."""
    ws = ws_outside
    make_repo(ws.path)
    escaped = ws.root / "escaped"
    real = shutil.which("git")
    planted = f'#!/bin/sh\necho ran on the host >> {escaped}\nexec {real} "$@"\n'
    agent(
        ws,
        "import os\n"
        "os.makedirs('node_modules/.bin', exist_ok=True)\n"
        f"open('node_modules/.bin/git', 'w').write({planted!r})\n"
        "os.chmod('node_modules/.bin/git', 0o755)\n",
        until="ready-marker",
    )
    path = os.pathsep.join(["./node_modules/.bin", os.environ.get("PATH", os.defpath)])
    ws.cli("-p", "p", "-t", "t", "go", env={"PATH": path})
    assert (ws.path / "node_modules" / ".bin" / "git").exists()  # the agent did plant it
    assert not escaped.exists(), "the agent's own git ran on the host"


def test_the_servers_download_of_a_sparse_stdout_does_not_swell_its_memory(
    ws_outside: Workspace,
) -> None:
    """The page's `?download=1` (and any read of a run file without ?length=) reads the whole
    file with one pread, on the event loop: a 2 GiB stdout the agent made with ftruncate (no
    block on disk) took the server to 6.3 GB resident and held every other request 12 s; at
    100 GiB it is a 500 with a MemoryError traceback, and a size the host can just allocate
    takes its memory. The server must send a run file in bounded memory, whatever its size."""
    ws = ws_outside
    agent(ws, _sparse_output(SPARSE))
    ws.cli("-p", "p", "-t", "t", "go")
    run = ws.runs()[0].run_id
    assert ws.task().run(run).stdout.stat().st_size == SPARSE
    with serving(ws) as url:
        server = next(
            p for p in psutil.process_iter(["cmdline"])
            if "serve" in (p.info["cmdline"] or []) and str(ws.config) in p.info["cmdline"]
        )  # fmt: skip
        address = f"{url}/api/projects/p/tasks/t/runs/{run}/files/stdout?download=1"
        with httpx.Client(timeout=120) as client, client.stream("GET", address) as answer:
            assert answer.status_code in (200, 206, 413), answer.read()[:200]
            next(answer.iter_bytes(), b"")  # a first piece is enough: then the client goes
        peak = int(Path(f"/proc/{server.pid}/status").read_text().split("VmHWM:")[1].split()[0])
        assert peak * 1024 < BOUND, f"the server reached {peak // 1024} MiB for one download"


def test_the_supervisor_reads_a_sparse_stdout_in_bounded_memory(ws_outside: Workspace) -> None:
    """A claude-type agent's stdout is parsed on the host after each run (usage, the answer,
    why it failed), line by line: a stdout the agent grew with ftruncate is one line of NULs,
    read whole into the supervisor (2 GiB resident for 1 GiB; 100 GiB takes the host's memory
    and the OOM killer picks among everyone's processes). A model's shell can do it to its
    CLI's stdout through /proc/PPID/fd/1; here the agent does it to its own."""
    ws = ws_outside
    agent(ws, _sparse_output(SPARSE), agent_type="claude")
    code, peak = _peak_of_children(ws.cli_argv("-p", "p", "-t", "t", "go"), ws.path)
    assert code == ExitCode.FAILED  # the run failed as its agent said, and was recorded
    assert ws.task().run(ws.runs()[0].run_id).stdout.stat().st_size >= SPARSE
    assert peak < BOUND, f"the loop reached {peak // MiB} MiB reading one sparse stdout"


def test_output_json_of_a_sparse_stdout_is_bounded_and_says_so(ws_outside: Workspace) -> None:
    """`run-agent output --json` reads the whole file into memory and JSON-encodes it (a NUL is
    six characters): a 512 MiB sparse stdout took it to 9.7 GB resident, and a 100 GiB one ends
    it in a MemoryError traceback (measured), where it should give what it can in bounded
    memory, or one line. 64 MiB here (about 1.2 GB today), to spare the machine."""
    ws = ws_outside
    agent(ws, _sparse_output(SPARSE // 8))
    ws.cli("-p", "p", "-t", "t", "go")
    argv = ws.cli_argv("output", "-p", "p", "-t", "t", "--file", "stdout", "--json")
    code, peak = _peak_of_children(argv, ws.path)
    assert peak < BOUND, f"`output --json` reached {peak // MiB} MiB (exit {code})"
