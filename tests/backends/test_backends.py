"""The backend registry and the `command` backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import backends
from backends.command import CommandBackend
from runagent.config.settings import AgentConfig
from runagent.errors import ConfigError, RunAgentError
from runagent.loop.context import RunContext
from runagent.loop.redaction import Redactor
from runagent.store.runfolder import TaskPaths


def context(tmp_path: Path) -> RunContext:
    task = TaskPaths(tmp_path, "p", "t")
    return RunContext(
        run_id="r1",
        task=task,
        prompt="the prompt",
        working_dir=tmp_path / "work",
        paths=task.run("r1"),
        environment={"TASK_FOLDER": str(tmp_path / "p" / "t"), "PATH": "/bin"},
    )


def test_prompt_goes_to_stdin_when_no_placeholder_takes_it(tmp_path: Path) -> None:
    backend = CommandBackend(AgentConfig("a", "command", command=("agent", "--x"), args=("-v",)))
    ctx = context(tmp_path)
    spec = backend.launch(ctx)
    assert spec.argv == ("agent", "--x", "-v")
    assert spec.stdin == ctx.run_folder / "prompt.md"
    assert spec.cwd == tmp_path / "work"
    assert spec.env["TASK_FOLDER"] == str(tmp_path / "p" / "t")


def test_placeholders_are_filled_and_a_taken_prompt_leaves_stdin_empty(tmp_path: Path) -> None:
    config = AgentConfig(
        "a",
        "command",
        command=("agent", "--file={prompt_file}", "{run_folder}", "{task_folder}", "{model}"),
        args=("--text", "{prompt}", '{"json": "braces stay"}'),
        model="m1",
    )
    ctx = context(tmp_path)
    spec = CommandBackend(config).launch(ctx)
    assert spec.argv == (
        "agent",
        f"--file={ctx.run_folder / 'prompt.md'}",
        str(ctx.run_folder),
        str(tmp_path / "p" / "t"),
        "m1",
        "--text",
        "the prompt",
        '{"json": "braces stay"}',
    )
    assert spec.stdin is None  # /dev/null
    assert spec.env["RUN_AGENT_MODEL"] == "m1"


def test_a_command_agent_without_a_command_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"agents\.mine\.command is not set"):
        CommandBackend(AgentConfig("mine", "command"))


def test_the_redactor_knows_the_token_and_the_key_variables_the_agent_is_given(
    tmp_path: Path,
) -> None:
    config = AgentConfig(
        "a", "command", command=("agent", "--key", "sk-secret"), token="sk-secret",
        pass_env=("OPENAI_API_KEY",), env={"MY_TOKEN": "env-token-1"},
    )  # fmt: skip
    backend = backends.create(config)
    redact = backend.redactor(
        {"OPENAI_API_KEY": "o-key-123", "GEMINI_API_KEY": "not-given-1", "MAX_TOKENS": "900000"}
    )
    assert redact(backend.commandline(backend.launch(context(tmp_path)))) == (
        "agent --key [REDACTED]"
    )
    text = "sk-secret o-key-123 env-token-1 not-given-1 900000 sk-secret"
    assert redact(text) == "[REDACTED] [REDACTED] [REDACTED] not-given-1 900000 [REDACTED]"


def test_a_redactor_blanks_the_longest_secret_first_and_ignores_short_values() -> None:
    redact = Redactor.of(["abcdef", "abcdefgh-long", "1", "", None, "  padded-key \n"])
    assert redact("abcdefgh-long abcdef padded-key 1") == "[REDACTED] [REDACTED] [REDACTED] 1"
    assert redact.data({"a": ["abcdef", 3], "b": None}) == {"a": ["[REDACTED]", 3], "b": None}


def test_registry_names_and_creation() -> None:
    assert "command" in backends.names()
    backend = backends.create(AgentConfig("x", "command", command=("true",)))
    assert backend.name == "command"
    with pytest.raises(RunAgentError, match="unknown backend 'nope'"):
        backends.create(AgentConfig("x", "nope"))


def test_a_broken_backend_module_breaks_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    broken = backends.Registered("tests.no_such_module_here:BrokenBackend")
    monkeypatch.setitem(backends.BUILTIN, "broken", broken)
    with pytest.raises(RunAgentError, match="backend 'broken' failed to load"):
        backends.create(AgentConfig("x", "broken"))
    assert backends.create(AgentConfig("x", "command", command=("true",))).name == "command"


def test_distributions_are_read_only_when_one_may_declare_a_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "path", [str(tmp_path / "missing"), str(tmp_path)])
    (tmp_path / "other-1.0.dist-info").mkdir()
    (tmp_path / "other-1.0.dist-info" / "entry_points.txt").write_text("[console_scripts]\n")
    assert not backends._declared()
    (tmp_path / "plugin-1.0.dist-info").mkdir()
    (tmp_path / "plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[runagent.backends]\nmine = plugin:MineBackend\n"
    )
    assert backends._declared()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "archive.zip")])
    (tmp_path / "archive.zip").write_bytes(b"PK")
    assert backends._declared()  # an archive cannot be glanced at: importlib.metadata reads it


def test_a_run_of_a_built_in_backend_does_not_import_importlib_metadata(tmp_path: Path) -> None:
    # It costs every run ~12 ms, and is needed only when a distribution declares a backend.
    code = (
        "import sys, backends\n"
        "from runagent.config.settings import AgentConfig\n"
        "backends.create(AgentConfig('x', 'command', command=('true',)))\n"
        "print('importlib.metadata' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert done.stdout == "False\n"


def test_agent_versions_are_cached_per_executable(tmp_path: Path) -> None:
    from runagent.loop.backend import cached_version

    calls = tmp_path / "calls"
    exe = tmp_path / "agent"
    exe.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'agent 1.2.3'\n")
    exe.chmod(0o755)
    cache = tmp_path / "cache.json"
    assert cached_version(exe, cache) == "agent 1.2.3"
    assert cached_version(exe, cache) == "agent 1.2.3"
    assert calls.read_text().count("x") == 1  # asked once, then remembered
    exe.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'agent 2.0.0'\n")  # upgraded
    assert cached_version(exe, cache) == "agent 2.0.0"
    assert calls.read_text().count("x") == 2
