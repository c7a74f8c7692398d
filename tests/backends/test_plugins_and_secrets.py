"""Third-party backends from entry points, and tokens that never reach disk or output."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import FAKE_AGENT, Workspace

PLUGIN = """
from runagent.loop.backend import Backend
from runagent.process import LaunchSpec


class Echo(Backend):
    name = "echo"

    def launch(self, ctx):
        return LaunchSpec(("echo", "plugin says hi"), dict(ctx.environment), ctx.working_dir)


def create(config):
    return Echo(config)
"""


def install_plugins(folder: Path) -> dict[str, str]:
    """A fake installed distribution declaring two backends: one good, one broken."""
    (folder / "echo_backend.py").write_text(PLUGIN)
    (folder / "broken_backend.py").write_text("raise ImportError('this plugin is broken')\n")
    info = folder / "runagent_plugins-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: runagent-plugins\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[runagent.backends]\necho = echo_backend\nbroken = broken_backend\n"
    )
    return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}


def test_entry_point_backends_load_and_a_broken_one_breaks_only_itself(ws: Workspace) -> None:
    plugins = ws.path / "plugins"
    plugins.mkdir()
    env = install_plugins(plugins)
    listed = ws.cli("backends", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    usable = {row["backend"]: row for row in json.loads(listed.stdout)}
    assert usable["echo"]["usable"]
    assert not usable["broken"]["usable"]
    assert "backend 'broken' failed to load" in usable["broken"]["checks"][0]["what"]
    assert usable["command"]["usable"]  # the others are untouched
    ran = ws.cli("--project", "p", "--task", "t", "--agent", "echo", "x", env=env)
    assert ran.returncode == 0, ran.stderr
    assert ws.runs()[0].backend == "echo"
    out = ws.task().run_folder(ws.runs()[0].run_id) / "output.md"
    assert out.read_text() == "plugin says hi\n"


def test_a_token_never_reaches_run_files_output_or_errors(ws: Workspace) -> None:
    secret = "sk-test-7f3a9c1e5b2d4068"
    token_file = ws.path / "token"
    token_file.write_text(secret + "\n")
    # The fake agent prints its argv and the token variable's *name*, never its value.
    config = {
        "agents": {
            "fake": {
                "type": "command",
                "command": [sys.executable, str(FAKE_AGENT), "--ignore-unknown", "--echo-argv",
                            "--key", secret, "--exit", "1"],
                "token": secret,
            },
        },
        "defaults": {"agent": "fake", "max_restarts": 1, "restart_delay": "10ms"},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli("--project", "p", "--task", "t", "x")
    outputs = [proc.stdout, proc.stderr]
    outputs += [ws.cli(*a).stdout for a in (["list", "--json"], ["status", "-p", "p", "-t", "t",
                "--json"], ["list", "-p", "p", "-t", "t", "--json"])]  # fmt: skip
    for run in ws.runs():
        folder = ws.task().run_folder(run.run_id)
        outputs += [(folder / n).read_text() for n in ("run-info.yaml", "prompt.md")]
        assert "--key [REDACTED]" in (run.commandline or "")
    assert all(secret not in text for text in outputs)


def test_agents_do_not_see_other_providers_keys(ws: Workspace) -> None:
    env = {"ANTHROPIC_API_KEY": "a-key", "OPENAI_API_KEY": "o-key", "MY_VAR": "kept"}
    ws.write_config(["--echo-env", "ANTHROPIC_API_KEY", "OPENAI_API_KEY", "MY_VAR"])
    assert ws.cli("--project", "p", "--task", "t", "x", env=env).returncode == 0
    out = (ws.task().run_folder(ws.runs()[0].run_id) / "agent-stdout.txt").read_text()
    assert out == "ANTHROPIC_API_KEY=\nOPENAI_API_KEY=\nMY_VAR=kept\n"


AIDER_PLUGIN = """
import sys

from runagent.loop.backend import Backend
from runagent.process import LaunchSpec


class AiderBackend(Backend):
    name = "aider"
    env_prefixes = ("AIDER_",)

    def launch(self, ctx):
        argv = (sys.executable, FAKE_AGENT, "--echo-env", "AIDER_API_KEY", "OPENAI_API_KEY")
        return LaunchSpec(argv, self.environment(ctx), ctx.working_dir)
"""


def test_a_new_providers_key_reaches_only_its_own_backend(ws: Workspace) -> None:
    # A backend from another package, for a provider the core has never heard of.
    plugins = ws.path / "plugins"
    plugins.mkdir()
    (plugins / "aider_backend.py").write_text(f"FAKE_AGENT = {str(FAKE_AGENT)!r}\n{AIDER_PLUGIN}")
    info = plugins / "aider_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: aider-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[runagent.backends]\naider = aider_backend:AiderBackend\n"
    )
    echo = ["--echo-env", "AIDER_API_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "MY_VAR"]
    config = yaml.safe_load(ws.write_config(echo).read_text())
    config["agents"]["claudish"] = {
        "type": "claude",
        "command": ws.agent_argv(["--ignore-unknown", *echo]),
    }
    ws.config.write_text(yaml.safe_dump(config))
    env = {
        "PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")]),
        "XDG_CACHE_HOME": str(ws.path / "cache"),
        "AIDER_API_KEY": "aider-key", "OPENAI_API_KEY": "o-key", "ANTHROPIC_API_KEY": "a-key",
        "MY_VAR": "kept",
    }  # fmt: skip
    seen = {}
    for agent in ("fake", "claudish", "aider"):
        proc = ws.cli("--project", "p", "--task", agent, "--agent", agent, "x", env=env)
        assert proc.returncode == 0, proc.stderr
        (run,) = ws.runs(task=agent)
        stdout = ws.task(task=agent).run_folder(run.run_id) / "agent-stdout.txt"
        seen[agent] = stdout.read_text()
    assert seen["fake"] == "AIDER_API_KEY=\nOPENAI_API_KEY=\nANTHROPIC_API_KEY=\nMY_VAR=kept\n"
    assert (
        seen["claudish"]
        == "AIDER_API_KEY=\nOPENAI_API_KEY=\nANTHROPIC_API_KEY=a-key\nMY_VAR=kept\n"
    )
    assert seen["aider"] == "AIDER_API_KEY=aider-key\nOPENAI_API_KEY=\n"


def test_pass_env_hands_a_named_key_to_a_command_agent(ws: Workspace) -> None:
    config = yaml.safe_load(ws.write_config(["--echo-env", "ANTHROPIC_API_KEY"]).read_text())
    config["agents"]["fake"]["pass_env"] = ["ANTHROPIC_API_KEY"]
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli("--project", "p", "--task", "t", "x", env={"ANTHROPIC_API_KEY": "a-key"})
    assert proc.returncode == 0, proc.stderr
    out = (ws.task().run_folder(ws.runs()[0].run_id) / "agent-stdout.txt").read_text()
    assert out == "ANTHROPIC_API_KEY=a-key\n"


def test_doctor_reports_without_showing_keys(ws: Workspace) -> None:
    secret = "xai-secret-value-123"
    ws.config.write_text(
        yaml.safe_dump(
            {
                "agents": {"grok": {"type": "xai", "token": secret}, "ghost": {
                    "type": "command", "command": ["no-such-agent-xyz"]}},
                "storage": {"runs_dir": str(ws.root)},
            }
        )
    )  # fmt: skip
    proc = ws.cli("doctor", "--port", "0")
    assert proc.returncode == 3
    assert secret not in proc.stdout + proc.stderr
    assert "credentials configured for agents.grok" in proc.stdout
    assert "'no-such-agent-xyz' not found on PATH" in proc.stdout
    assert "FAIL  agent ghost (command)" in proc.stdout


KEY = "sk-live-5d1e9a7c3b2f4860"
# A notification hook that appends each JSON body it is given to a file, one per line.
RECORD_HOOK = "import sys; open(sys.argv[1], 'ab').write(sys.stdin.buffer.read() + b'\\n')"


def leaking_config(ws: Workspace, agent: dict[str, object], **defaults: object) -> Path:
    """A config whose agent `leaky` prints KEY and fails; every notification is recorded."""
    config = {
        "agents": {"leaky": agent},
        "defaults": {"agent": "leaky", "max_restarts": 1, "restart_delay": "10ms",
                     "crash_loop_runs": 0, "idle_timeout": 0, **defaults},
        "storage": {"runs_dir": str(ws.root)},
        "notify": {"command": [sys.executable, "-c", RECORD_HOOK, str(ws.path / "notes.jsonl")]},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    return ws.path / "notes.jsonl"


def assert_key_not_copied(ws: Workspace, notes: Path, proc_output: str) -> list[str]:
    """KEY is in the agent's own files, but in nothing run-agent wrote; returns the prompts."""
    runs = ws.runs()
    assert len(runs) == 2, proc_output
    folders = [ws.task().run_folder(r.run_id) for r in runs]
    assert KEY in (folders[0] / "agent-stderr.txt").read_text()  # the agent did print it
    prompts = [(f / "prompt.md").read_text() for f in folders]
    copied = [*prompts, *((f / "run-info.yaml").read_text() for f in folders)]
    copied += [notes.read_text(), proc_output]
    copied += [ws.cli(*a).stdout for a in (["status", "-p", "p", "-t", "t", "--json"],
               ["output", "-p", "p", "-t", "t", "--file", "prompt"])]  # fmt: skip
    assert [KEY in text for text in copied] == [False] * len(copied)
    assert "[REDACTED]" in prompts[1]
    return prompts


@pytest.mark.parametrize("source", ["token", "token_file", "token_env", "pass_env"])
def test_a_key_the_agent_prints_is_redacted_from_what_run_agent_copies(
    ws: Workspace, source: str
) -> None:
    agent: dict[str, object] = {
        "type": "command",
        "command": [*ws.agent_argv(["--line-text", f"using {KEY}", "--lines", "1", "--stderr",
                    f"error: key {KEY} refused ({KEY})", "--exit", "1"])],
    }  # fmt: skip
    env = {}
    if source == "token":
        agent["token"] = KEY
    elif source == "token_file":
        (ws.path / "key.txt").write_text(KEY + "\n")
        agent["token_file"] = str(ws.path / "key.txt")
    elif source == "token_env":
        agent["token_env"] = "LEAKY_KEY"
        env["LEAKY_KEY"] = KEY
    else:  # a provider key the agent is given from run-agent's environment
        agent["pass_env"] = ["ANTHROPIC_API_KEY"]
        env["ANTHROPIC_API_KEY"] = KEY
    notes = leaking_config(ws, agent)
    proc = ws.cli("-p", "p", "-t", "t", "x", env=env)
    assert proc.returncode == 1, proc.stderr
    prompt = assert_key_not_copied(ws, notes, proc.stdout + proc.stderr)[1]
    assert "error: key [REDACTED] refused ([REDACTED])" in prompt
    assert "using [REDACTED] 1" in prompt


def test_a_claude_agent_key_is_redacted_from_its_failure_reason(ws: Workspace) -> None:
    # The reason of a rate-limited claude run quotes its stderr; the key comes from the
    # environment (no token configured), as with a user's own ANTHROPIC_API_KEY.
    agent = {
        "type": "claude",
        "command": ws.agent_argv(["--ignore-unknown", "--stderr",
                                  f"rate limit exceeded for key {KEY}", "--exit", "1"]),
    }  # fmt: skip
    notes = leaking_config(ws, agent, rate_limit_wait="10ms", max_rate_limit_waits=1)
    env = {"ANTHROPIC_API_KEY": KEY, "XDG_CACHE_HOME": str(ws.path / "cache")}
    proc = ws.cli("-p", "p", "-t", "t", "x", env=env)
    assert proc.returncode == 1, proc.stderr
    assert_key_not_copied(ws, notes, proc.stdout + proc.stderr)
    assert ws.runs()[0].message == (
        "rate limited: rate limit exceeded for key [REDACTED] (exit code 1)"
    )
    # The pause it put the agent in said why, redacted (the console's note quotes it).
    assert "rate limited: leaky paused until " in proc.stderr, proc.stderr
