"""Each backend's command line and environment for sample configs."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest

import backends
from backends.chat_completions import endpoint
from runagent.config.settings import AgentConfig, Permissions
from runagent.loop.backend import Backend
from runagent.loop.context import RunContext
from runagent.store.runfolder import RunPaths, TaskPaths

CALLER_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "ANTHROPIC_API_KEY": "anthropic-from-env",
    "OPENAI_API_KEY": "openai-from-env",
    "CODEX_API_KEY": "codex-from-env",
    "GEMINI_API_KEY": "gemini-from-env",
    "GOOGLE_CLOUD_PROJECT": "proj",
    "XAI_API_KEY": "xai-from-env",
    "PERPLEXITY_API_KEY": "pplx-from-env",
    "TASK_FOLDER": "/runs/p/t",
}


def ctx(tmp_path: Path) -> RunContext:
    task = TaskPaths(tmp_path / "runs", "p", "t")
    return RunContext("r1", task, "the prompt", tmp_path / "work", task.run("r1"), CALLER_ENV)


def make(name: str, **config: object) -> Backend:
    return backends.create(AgentConfig(name=name, type=name, **config))  # type: ignore[arg-type]


def test_claude_headless_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    c = ctx(tmp_path)
    spec = make("claude", model="opus", args=("--max-budget-usd", "5")).launch(c)
    assert spec.argv == (
        "claude", "-p", "--output-format", "stream-json", "--verbose",
        "--dangerously-skip-permissions", "--model", "opus", "--max-budget-usd", "5",
    )  # fmt: skip
    assert spec.stdin == c.prompt_file  # the prompt as a file on stdin, never a pipe
    assert spec.cwd == tmp_path / "work"
    assert spec.env["ANTHROPIC_API_KEY"] == "anthropic-from-env"  # its own provider's
    for other in ("OPENAI_API_KEY", "CODEX_API_KEY", "GEMINI_API_KEY", "XAI_API_KEY"):
        assert other not in spec.env
    assert spec.env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert spec.env["HOME"] == "/home/u"  # the user's own login keeps working


def test_claude_as_root_allows_tools_by_name_unless_is_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    argv = make("claude").launch(ctx(tmp_path)).argv
    assert "--dangerously-skip-permissions" not in argv
    assert argv[5:8] == ("--permission-mode", "acceptEdits", "--allowedTools")
    assert "Bash" in argv and "Write" in argv
    sandboxed = make("claude", env={"IS_SANDBOX": "1"})
    c = ctx(tmp_path)
    c = dataclasses.replace(c, environment={**c.environment, "IS_SANDBOX": "1"})
    assert "--dangerously-skip-permissions" in sandboxed.launch(c).argv


def test_claude_token_base_url_and_permissions_none(tmp_path: Path) -> None:
    spec = make(
        "claude", token="sk-conf", base_url="http://127.0.0.1:9/", permissions=Permissions.NONE,
        command=("/opt/claude/bin/claude",),
    ).launch(ctx(tmp_path))  # fmt: skip
    assert spec.argv == ("/opt/claude/bin/claude", "-p", "--output-format", "stream-json",
                         "--verbose")  # fmt: skip
    assert spec.env["ANTHROPIC_API_KEY"] == "sk-conf"
    assert spec.env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9/"


def test_codex_exec_reads_the_prompt_file_on_stdin(tmp_path: Path) -> None:
    c = ctx(tmp_path)
    spec = make("codex", model="gpt-5.5").launch(c)
    assert spec.argv == (
        "codex", "exec", "--json", "--skip-git-repo-check",
        "--dangerously-bypass-approvals-and-sandbox", "-m", "gpt-5.5", "-",
    )  # fmt: skip
    assert spec.stdin == c.prompt_file
    assert spec.env["OPENAI_API_KEY"] == "openai-from-env"
    assert "ANTHROPIC_API_KEY" not in spec.env and "GEMINI_API_KEY" not in spec.env


def test_codex_base_url_is_a_custom_provider(tmp_path: Path) -> None:
    spec = make("codex", base_url="http://127.0.0.1:9/v1", token_env="MY_KEY").launch(
        RunContext("r", TaskPaths(tmp_path, "p", "t"), "x", tmp_path, RunPaths(tmp_path),
                   {"MY_KEY": "sk-mine", "PATH": "/bin"})
    )  # fmt: skip
    argv = list(spec.argv)
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]
    assert "model_provider=runagent" in overrides
    assert 'model_providers.runagent.base_url="http://127.0.0.1:9/v1"' in overrides
    assert "model_providers.runagent.env_key=CODEX_API_KEY" in overrides
    assert "model_providers.runagent.wire_api=responses" in overrides
    assert spec.env["CODEX_API_KEY"] == "sk-mine"
    assert argv[-1] == "-"


def test_gemini_headless_and_gateway_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    c = ctx(tmp_path)
    plain = make("gemini", model="gemini-3.8-flash").launch(c)
    assert plain.argv == ("gemini", "--output-format", "stream-json", "--yolo", "--skip-trust",
                          "-m", "gemini-3.8-flash")  # fmt: skip
    assert plain.stdin == c.prompt_file and not plain.files
    assert plain.env["GOOGLE_CLOUD_PROJECT"] == "proj" and "XAI_API_KEY" not in plain.env
    gateway = make("gemini", base_url="http://127.0.0.1:9", token="g-key").launch(c)
    assert gateway.env["GOOGLE_GEMINI_BASE_URL"] == "http://127.0.0.1:9"
    assert gateway.env["GEMINI_API_KEY"] == "g-key"
    ((path, content),) = gateway.files.items()
    assert gateway.env["GEMINI_CLI_SYSTEM_SETTINGS_PATH"] == str(path)
    assert json.loads(content)["security"]["auth"]["selectedType"] == "gemini-api-key"


@pytest.mark.parametrize(
    "name, variable, url",
    [("perplexity", "PERPLEXITY_API_KEY", "https://api.perplexity.ai/chat/completions"),
     ("xai", "XAI_API_KEY", "https://api.x.ai/v1/chat/completions")],
)  # fmt: skip
def test_http_backends_run_as_child_processes(
    tmp_path: Path, name: str, variable: str, url: str
) -> None:
    c = ctx(tmp_path)
    spec = make(name, model="m1").launch(c)
    # -P: the folder the agent works in is kept off the child's import path
    assert spec.argv == (sys.executable, "-P", "-m", f"backends.{name}", str(c.run_folder))
    assert spec.env["RUN_AGENT_CHAT_URL"] == url
    assert spec.env["RUN_AGENT_CHAT_MODEL"] == "m1"
    assert spec.env[variable].endswith("-from-env")
    assert "ANTHROPIC_API_KEY" not in spec.env and spec.stdin is None


def test_chat_endpoint_accepts_base_urls_with_or_without_the_path() -> None:
    assert endpoint("http://127.0.0.1:9/v1") == "http://127.0.0.1:9/v1/chat/completions"
    assert endpoint("http://h/v1/chat/completions/") == "http://h/v1/chat/completions"


def test_token_file_and_missing_token_env(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("sk-from-file\n")
    spec = make("xai", token_file=key).launch(ctx(tmp_path))
    assert spec.env["XAI_API_KEY"] == "sk-from-file"
    from runagent.errors import MissingDependencyError

    with pytest.raises(MissingDependencyError, match="token_env names 'NOPE_KEY'"):
        make("xai", token_env="NOPE_KEY").launch(ctx(tmp_path))
    with pytest.raises(MissingDependencyError, match="token_file"):
        make("xai", token_file=tmp_path / "missing").launch(ctx(tmp_path))
