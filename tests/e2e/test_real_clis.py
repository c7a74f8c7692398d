"""The claude, codex and gemini backends end to end against the real CLIs and a fake provider.

The CLIs come from npm at the versions the backends are written for (`.ci/run` installs them
into .cache/agent-clis; RUN_AGENT_TEST_CLIS names another bin folder). Each run goes through
run-agent against tests/fake_models.py on 127.0.0.1, with HOME, TMPDIR and CODEX_HOME private
to the test, so no request leaves the machine and no user's login is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests.conftest import REPO, Workspace, wait_for
from tests.fake_models import FakeModelServer

BIN = Path(os.environ.get("RUN_AGENT_TEST_CLIS") or REPO / ".cache/agent-clis/node_modules/.bin")
CLIS = ["claude", "codex", "gemini"]
VERSIONS = {"claude": "2.1.330", "codex": "0.169.0", "gemini": "0.61.0"}
PROMPT = "Say hello, then write fake_tool_output.txt."
MODELS = {"claude": "claude-fake", "codex": "gpt-5.5", "gemini": "gemini-3.8-flash"}
# Per CLI, under the test's folder: its settings file on the host (the user's) and one it would
# read there that does not exist yet (each can make the CLI run a command on the host).
HOST_SETTINGS = {
    "claude": ("home/.claude/settings.json", "home/.claude.json"),
    "codex": ("codex-home/config.toml", "codex-home/hooks.json"),
    "gemini": ("home/.gemini/settings.json", "home/.gemini/.env"),
}
OWN_SETTINGS = {"claude": "{}\n", "codex": "# the user's\n", "gemini": "{}\n"}
EVIL = "notify = [1]"  # a line that would be a setting: never seen by the host's CLI

# Each test reports its own skip with the reason (never in CI, which installs the CLIs).
pytestmark = pytest.mark.skipif(
    not all((BIN / cli).exists() for cli in CLIS) and not os.environ.get("CI"),
    reason=f"agent CLIs not installed in {BIN}: npm install them as .ci/run does",
)


@pytest.fixture
def provider() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest.fixture
def private_cache() -> Iterator[Path]:
    """A cache folder whose parents are not world-writable: gemini refuses a system settings
    file under /tmp ("Parent directory '/tmp' is insecure"), so it cannot live in tmp_path."""
    folder = Path.home() / ".cache" / f"run-agent-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(parents=True, mode=0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def configure(ws: Workspace, cli: str, provider: FakeModelServer, **defaults: Any) -> Path:
    """Config for one CLI agent pointed at the fake provider; returns its working folder."""
    private = {name: ws.path / name for name in ("home", "tmp", "codex-home", "work")}
    for folder in private.values():
        folder.mkdir(exist_ok=True)
    base_url = provider.base_url + ("/v1" if cli == "codex" else "")
    args = {
        "codex": ["-c", "analytics.enabled=false", "-c", "features.plugins=false",
                  "-c", "model_providers.runagent.request_max_retries=0",
                  "-c", "model_providers.runagent.stream_max_retries=0"],
    }.get(cli, [])  # fmt: skip
    config = {
        "agents": {
            "agent": {
                "type": cli,
                "command": [str(BIN / cli)],
                "base_url": base_url,
                "token": "fake-key-for-tests",
                "model": MODELS[cli],
                "args": args,
                "env": {
                    "HOME": str(private["home"]),
                    "TMPDIR": str(private["tmp"]),
                    "CODEX_HOME": str(private["codex-home"]),
                    "CLAUDE_CODE_MAX_RETRIES": "0",  # run-agent, not claude, waits out a 429
                },
            }
        },
        "defaults": {
            "agent": "agent",
            "restart_delay": "100ms",
            "kill_grace": "2s",
            "rate_limit_wait": "1s",
            "idle_timeout": "60s",
            **defaults,
        },
        "storage": {"runs_dir": str(ws.root)},
    }
    ws.config.write_text(yaml.safe_dump(config))
    return private["work"]


def run(ws: Workspace, work: Path, cache: Path) -> Any:
    return ws.cli(
        "--project", "p", "--task", "t", "--cwd", str(work), PROMPT,
        env={"XDG_CACHE_HOME": str(cache)}, timeout=180,
    )  # fmt: skip


def output(ws: Workspace, index: int = -1) -> str:
    return ws.task().run(ws.runs()[index].run_id).output.read_text()


@pytest.mark.parametrize("cli", CLIS)
def test_a_text_answer_lands_in_output_md(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    work = configure(ws, cli, provider)
    proc = run(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    (info,) = ws.runs()
    assert output(ws) == "hello from fake model\n"
    assert VERSIONS[cli] in (info.agent_version or "")
    assert "fake-key-for-tests" not in ws.task().run(info.run_id).info.read_text()
    assert provider.model_requests >= 1
    # The CLI's own usage report lands in run-info (claude also gives its cost).
    assert info.tokens_in and info.tokens_out
    assert (info.cost_usd is not None) == (cli == "claude")


@pytest.mark.parametrize("cli", CLIS)
def test_a_tool_call_writes_a_file_in_the_working_folder(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    provider.scenario = "tool"
    work = configure(ws, cli, provider)
    proc = run(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    assert (work / "fake_tool_output.txt").read_text() == "hello from fake tool\n"
    assert output(ws) == "hello from fake model\n"


@pytest.mark.parametrize("cli", CLIS)
def test_an_api_error_fails_with_its_reason_and_the_loop_restarts(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    provider.scenario = "error"
    work = configure(ws, cli, provider, max_restarts=1)
    proc = run(ws, work, private_cache)
    assert proc.returncode == 1
    runs = ws.runs()
    assert len(runs) == 2
    assert all(r.reason == "api_error" and r.exit_code != 0 for r in runs)
    assert "injected error 400" in (runs[0].message or "")


@pytest.mark.parametrize("cli", CLIS)
def test_a_429_waits_then_succeeds_with_the_restart_budget_intact(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    provider.scenario = "rate_limit_once"
    work = configure(ws, cli, provider, max_restarts=0)
    proc = run(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr  # with max_restarts 0, any spent restart would fail
    runs = ws.runs()
    assert runs[-1].status == "completed" and output(ws) == "hello from fake model\n"
    assert provider.model_requests == 2
    if cli == "gemini":
        assert len(runs) == 1  # gemini waits out the 429 itself, inside the run
    else:
        assert [r.reason for r in runs] == ["rate_limit", "exited"]


@pytest.mark.parametrize("sandbox", ["none", "bwrap"])
@pytest.mark.parametrize("cli", CLIS)
def test_a_hang_is_stopped_by_the_idle_timeout_with_its_whole_tree(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str, sandbox: str
) -> None:
    """Inside the sandbox as outside it: nothing of the CLI's tree survives its stop."""
    from runagent.ops.sandbox import Bwrap

    if sandbox == "bwrap" and Bwrap(Path("/")).problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    provider.scenario = "hang"
    work = configure(ws, cli, provider, max_restarts=0, idle_timeout="5s", sandbox=sandbox)
    proc = run(ws, work, private_cache)
    assert proc.returncode == 124, proc.stderr
    (info,) = ws.runs()
    assert info.status == "timed_out" and info.reason == "idle_timeout"
    wait_for(lambda: not _processes_in(work), timeout=10, what="the CLI's tree to be gone")


def _processes_in(folder: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and Path(proc.cwd()).is_relative_to(folder):
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def test_an_issue_run_with_claude_completes_on_its_marker_commit(
    ws: Workspace, provider: FakeModelServer, private_cache: Path
) -> None:
    from tests.gitrepo import GIT_ENV, git, make_repo

    repo = make_repo(ws.path / "repo")
    provider.scenario = "tool"
    provider.tool_command = (
        "echo fixed > fix.txt && git add -A && "
        "git commit -q -m 'fix: issue 1' -m \"$COCODE_READY_MARKER\""
    )
    configure(ws, "claude", provider, max_restarts=0)
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["agent"]["env"].update(GIT_ENV)  # the commit's identity, not the user's
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli(
        "-p", "p", "--issue", "1", "--repo", str(repo), "Fix the bug",
        env={"XDG_CACHE_HOME": str(private_cache)}, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (info,) = ws.runs("p", "issue-1")
    assert info.reason == "ready_marker" and info.branch == "run-agent/p/issue-1"
    tree = ws.task("p", "issue-1").worktree
    assert git(tree, "log", "-1", "--format=%B").endswith("cocode ready for check")
    assert (tree / "fix.txt").read_text() == "fixed\n"
    assert git(repo, "log", "--format=%s", "main") == "initial commit"  # main untouched


@pytest.mark.parametrize("cli", CLIS)
def test_a_sandboxed_cli_completes_its_turn_and_its_commands_stay_inside(
    ws_outside: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    """`sandbox: bwrap`: the real CLI logs in (its own folders are there), completes its turn,
    and the shell command the model asks it to run can neither read the home nor write outside
    the working folder (another project's folder, read-only): not its task's
    record, not the config, not the runs root (all outside /tmp and the home, as a person's)."""
    from runagent.ops.sandbox import Bwrap

    if Bwrap(Path("/")).problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    ws = ws_outside
    outside = ws.path / "elsewhere"
    outside.mkdir()
    (outside / "secret.txt").write_text("a secret of another project\n")
    (ws.path / "home" / ".ssh").mkdir(parents=True)
    (ws.path / "home" / ".ssh" / "id_ed25519").write_text("a private key\n")
    provider.scenario = "tool"
    task = ws.task("p", "t")
    settings, tokens = task.folder / "task.yaml", ws.root / ".tokens"
    tokens.mkdir(parents=True)
    # The CLI's settings on the host, which the user's next run of it reads: the model's shell
    # tries to add a command there, and to plant a settings file where there is none yet.
    own, planted = HOST_SETTINGS[cli]
    own = ws.path / own
    own.parent.mkdir(parents=True, exist_ok=True)
    own.write_text(OWN_SETTINGS[cli])
    planted = ws.path / planted
    provider.tool_command = (
        f"{{ echo '{EVIL}' >> {own}; echo '{EVIL}' > {planted}; }} 2> own.txt; "
        f"cat {outside / 'secret.txt'} {ws.path / 'home' / '.ssh' / 'id_ed25519'}"
        f" > read.txt 2>&1; {{ echo leaked > {outside / 'written.txt'}; }} 2> write.txt;"
        f" {{ echo 'sandbox: none' >> {settings}; echo 'x: 1' >> {ws.config};"
        f" echo '{{}}' > {tokens / 'tokens.json'}; }} 2> control.txt;"
        " echo 'hello from fake tool' > fake_tool_output.txt"
    )
    work = configure(ws, cli, provider, sandbox="bwrap")
    config = ws.config.read_text()
    proc = run(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    assert "sandbox: none" not in settings.read_text() and ws.config.read_text() == config
    assert not (tokens / "tokens.json").exists()
    assert (work / "control.txt").read_text().count("Read-only file system") >= 1
    assert own.read_text() == OWN_SETTINGS[cli] and not planted.exists()
    assert "Read-only file system" in (work / "own.txt").read_text()  # the user's, seen
    assert output(ws) == "hello from fake model\n"
    assert (work / "fake_tool_output.txt").read_text() == "hello from fake tool\n"
    read = (work / "read.txt").read_text()
    # Outside the home and /tmp, the file system is there read-only (docs/guides/containment.md).
    assert "a secret of another project" in read and "a private key" not in read
    assert read.count("No such file or directory") == 1, read
    assert not (outside / "written.txt").exists()
    assert (work / "write.txt").read_text().strip(), "the write outside was refused, loudly"
    wait_for(lambda: not _processes_in(work), timeout=10, what="the CLI's tree to be gone")


def test_claude_starts_a_task_and_reads_its_status_through_run_agent_mcp(
    ws: Workspace, private_cache: Path
) -> None:
    """The real claude CLI, configured with `--mcp-config` to use `run-agent mcp`: the model's
    tool calls (from the fake provider) start a task and read its status, through MCP."""
    calls = [
        ("mcp__run-agent__start_task",
         {"project": "inner", "task": "child", "prompt": "go", "agent": "fake"}),
        ("mcp__run-agent__task_status", {"project": "inner", "task": "child"}),
    ]  # fmt: skip
    with FakeModelServer(scenario="calls", calls=calls) as provider:
        work = configure(ws, "claude", provider)
        mcp = ws.path / "mcp.json"
        command = [sys.executable, "-m", "runagent", "mcp", "--config", str(ws.config)]
        mcp.write_text(
            json.dumps({"mcpServers": {"run-agent": {"command": command[0], "args": command[1:]}}})
        )
        config = yaml.safe_load(ws.config.read_text())
        config["agents"]["agent"]["args"] = [
            "--mcp-config",
            str(mcp),
            "--allowedTools",
            "mcp__run-agent",
        ]
        config["agents"]["fake"] = {"type": "command", "command": ws.agent_argv(["--lines", "1"])}
        ws.config.write_text(yaml.safe_dump(config))
        proc = run(ws, work, private_cache)
        assert proc.returncode == 0, proc.stderr
        results = [
            block for request in provider.requests if isinstance(request.body, dict)
            for message in request.body.get("messages", []) if isinstance(message, dict)
            for block in message.get("content", []) if isinstance(block, dict)
            and block.get("type") == "tool_result"
        ]  # fmt: skip
    assert output(ws) == "hello from fake model\n"
    said = [json.loads(_text_of(r["content"])) for r in results]
    started = next(s for s in said if "supervisor_pid" in s)
    assert (started["project_id"], started["task_id"]) == ("inner", "child")
    status = next(s for s in said if "runs_list" in s)
    assert status["task_id"] == "child" and status["status"] in ("running", "completed")
    child = ws.task("inner", "child")
    # A wait that ends at its event: the child's loop, a process of its own, took more than
    # 60 s to complete on a loaded CI machine.
    wait_for(lambda: child.run_ids() and ws.runs("inner", "child")[0].status.value == "completed",
             120, "the task the model started")  # fmt: skip


def _text_of(content: Any) -> str:
    """A tool result's text: a string, or the text of its first block."""
    if isinstance(content, str):
        return content
    return str(content[0]["text"])


@pytest.mark.parametrize("cli", CLIS)
def test_a_persons_message_reaches_the_model_in_the_next_attempt(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    """`resume --message`: the words a person gave are in what the CLI sends the provider."""
    provider.scenario = "error"
    work = configure(ws, cli, provider, max_restarts=0)
    assert run(ws, work, private_cache).returncode == 1
    provider.scenario = "text"
    seen = len(provider.requests)
    words = "Steer-7f3a: answer in one line."
    resumed = ws.cli("resume", "-p", "p", "-t", "t", "--message", words,
                     env={"XDG_CACHE_HOME": str(private_cache)}, timeout=180)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    sent = [json.dumps(r.body) for r in provider.requests[seen:]]
    assert any(words in body for body in sent), "the message never reached the model"
    assert not any(words in json.dumps(r.body) for r in provider.requests[:seen])


# What each CLI says of the provider's usage limit (tests/fake_models.py usage_limit_error).
LIMIT_WORDS = {
    "codex": "hit your usage limit",
    "gemini": "exhausted your daily quota",
    "claude": "exceed your organization's rate limit",
}


@pytest.mark.parametrize("cli", ["codex", "gemini", "claude"])
def test_a_usage_limit_pauses_the_agent_until_the_reset_the_cli_reports(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    """The real CLI hits the provider's usage limit (the 429 with the body and headers the
    provider sends): its run pauses the agent across the fleet until the reset the CLI
    reports (codex: its message's "try again at 5:46 AM", in the agent's TZ and to the
    minute), or for rate_limit_wait where the CLI reports none (gemini: its TerminalQuotaError
    drops the quota's RetryInfo; claude: its events carry the 429, not the API's retry-after
    or reset headers); lifted, the loop's next attempt completes, no restart spent."""
    from runagent.fleet.queue import Fleet

    provider.scenario, provider.limit_seconds = "usage_limit_once", 3 * 3600
    work = configure(ws, cli, provider, max_restarts=0, rate_limit_wait="7m")
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["agent"]["env"]["TZ"] = "Asia/Kolkata"  # codex speaks its local time
    ws.config.write_text(yaml.safe_dump(config))
    hit = time.time()
    loop = ws.start_cli("--project", "p", "--task", "t", "--cwd", str(work), PROMPT,
                        env={"XDG_CACHE_HOME": str(private_cache)})  # fmt: skip
    try:
        pause = wait_for(lambda: Fleet(ws.root).pauses(clean=False).get("agent"), 60,
                         "the agent paused by its limited run")  # fmt: skip
        if cli == "codex":  # the reset, to the end of the minute codex shows, plus a second
            reset = hit + provider.limit_seconds
            assert reset - 2 <= pause.until <= time.time() + provider.limit_seconds + 62, pause
        else:
            assert hit + 7 * 60 <= pause.until <= time.time() + 7 * 60 + 2, pause
        assert LIMIT_WORDS[cli] in pause.why, pause
        (limited,) = ws.runs()
        assert limited.reason == "rate_limit"
        assert limited.exit_code == (429 & 0xFF if cli == "gemini" else 1)
        assert ws.cli("fleet", "unpause", "agent").returncode == 0
        assert loop.wait(120) == 0, loop.stderr.read() if loop.stderr else ""
    finally:
        if loop.poll() is None:
            loop.kill()
            loop.wait()
    first, second = ws.runs()
    assert (first.attempt, second.attempt) == (1, 2) and second.status == "completed"
    assert output(ws) == "hello from fake model\n"
    assert provider.model_requests == 2  # the CLI did not retry the limit itself


def test_gemini_s_own_retries_of_a_429_are_bounded_by_its_max_attempts(
    ws: Workspace, provider: FakeModelServer, private_cache: Path
) -> None:
    """gemini waits out a retryable 429 itself (a retryDelay of up to 300 s), up to 10 times in
    one run; its settings' general.maxAttempts bounds that, after which the run ends as rate
    limited (exit 173) and the fleet's pause takes over (the fleet guide says so)."""
    provider.scenario = "rate_limit"
    work = configure(ws, "gemini", provider, max_restarts=0, max_rate_limit_waits=0)
    settings = ws.path / "home" / ".gemini" / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text('{"general": {"maxAttempts": 2}}\n')
    proc = run(ws, work, private_cache)
    assert proc.returncode == 1, proc.stderr  # max_rate_limit_waits 0: the loop gives up
    (limited,) = ws.runs()
    assert limited.reason == "rate_limit" and limited.exit_code == 429 & 0xFF
    assert provider.model_requests == 2
