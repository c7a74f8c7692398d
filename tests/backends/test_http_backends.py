"""perplexity and xai end to end: run-agent, the chat-completions child, a fake provider."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.conftest import Workspace
from tests.fake_models import FakeModelServer

TOKEN = "sk-fake-provider-key-0001"


@pytest.fixture
def provider() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def configure(ws: Workspace, backend: str, provider: FakeModelServer, **defaults: Any) -> None:
    config = {
        "agents": {
            "api": {
                "type": backend,
                "base_url": f"{provider.base_url}/v1",
                "token": TOKEN,
                "model": "fake-model",
                "env": {"RUN_AGENT_CHAT_RETRIES": "0", "RUN_AGENT_STREAM_TIMEOUT": "60"},
            }
        },
        "defaults": {"agent": "api", "restart_delay": "50ms", "kill_grace": "1s",
                     "rate_limit_wait": "1s", **defaults},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))


def output(ws: Workspace, index: int = -1) -> str:
    run = ws.runs()[index]
    return ws.task().run(run.run_id).output.read_text()


@pytest.mark.parametrize("backend", ["perplexity", "xai"])
def test_a_text_answer_streams_to_stdout_and_lands_in_output_md(
    ws: Workspace, provider: FakeModelServer, backend: str
) -> None:
    provider.citations = ["https://example.org/a", "https://example.org/b"]
    configure(ws, backend, provider)
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 0, proc.stderr
    (request,) = [r for r in provider.requests if r.method == "POST"]
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.body["model"] == "fake-model" and request.body["stream"] is True
    assert request.body["messages"][0]["content"].endswith("## Task\n\nask\n")
    text = output(ws)
    if backend == "perplexity":
        assert text == (
            "hello from fake model\n\nSources:\n1. https://example.org/a\n2. https://example.org/b\n"
        )
    else:
        assert text == "hello from fake model\n"
    stdout = ws.task().run(ws.runs()[0].run_id).stdout.read_text()
    assert stdout.startswith("hello from fake model")
    for name in ("run-info.yaml", "prompt.md", "agent-stderr.txt", "agent-stdout.txt"):
        assert TOKEN not in (ws.task().run_folder(ws.runs()[0].run_id) / name).read_text()


def test_an_api_error_restarts_with_the_reason_recorded(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.scenario = "error"
    configure(ws, "xai", provider, max_restarts=1)
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 1
    runs = ws.runs()
    assert len(runs) == 2  # the loop restarted
    assert {r.reason for r in runs} == {"api_error"}
    assert "HTTP 400" in (runs[0].message or "")


def test_a_rate_limit_waits_and_does_not_spend_the_restart_budget(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.scenario = "rate_limit_once"
    configure(ws, "perplexity", provider, max_restarts=0)
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 0, proc.stderr
    first, second = ws.runs()
    assert first.reason == "rate_limit" and "HTTP 429" in (first.message or "")
    assert second.status == "completed"  # with max_restarts 0: the rate limit cost nothing
    assert "rate limited" in proc.stderr and "no restart spent" in proc.stderr
    # Its Retry-After paused the agent across the fleet, until then.
    assert "rate limited: api paused until " in proc.stderr, proc.stderr


def test_the_client_itself_retries_a_429_honouring_retry_after(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.scenario = "rate_limit_once"
    configure(ws, "xai", provider, max_restarts=0)
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["api"]["env"]["RUN_AGENT_CHAT_RETRIES"] = "2"
    ws.config.write_text(yaml.safe_dump(config))
    assert ws.cli("--project", "p", "--task", "t", "ask").returncode == 0
    (run,) = ws.runs()  # one run: the retry happened inside it
    stderr = ws.task().run(run.run_id).stderr.read_text()
    assert "retrying in 1s: HTTP 429" in stderr
    assert provider.model_requests == 2


def test_authentication_failure_does_not_restart(ws: Workspace, provider: FakeModelServer) -> None:
    provider.scenario = "auth"
    configure(ws, "xai", provider, max_restarts=3)
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 3
    (run,) = ws.runs()
    assert run.reason == "auth" and "HTTP 401" in (run.message or "")


def test_a_silent_stream_is_stopped_by_the_idle_timeout(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.scenario = "hang"
    configure(ws, "xai", provider, max_restarts=0, idle_timeout="1s")
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 124
    (run,) = ws.runs()
    assert run.reason == "idle_timeout"


def test_a_missing_key_is_refused_before_any_request(
    ws: Workspace, provider: FakeModelServer
) -> None:
    configure(ws, "xai", provider)
    config = yaml.safe_load(ws.config.read_text())
    del config["agents"]["api"]["token"]
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli("--project", "p", "--task", "t", "ask", env={"XAI_API_KEY": ""})
    assert proc.returncode == 3
    assert "XAI_API_KEY" in proc.stderr.strip().splitlines()[-1]
    assert not ws.runs()  # refused before the loop: no run folder, no request
    assert not [r for r in provider.requests if r.method == "POST"]


def test_the_client_gives_up_on_a_stream_that_goes_silent(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.scenario = "hang"
    configure(ws, "perplexity", provider, max_restarts=0, idle_timeout=0)
    config = yaml.safe_load(ws.config.read_text())
    config["agents"]["api"]["env"]["RUN_AGENT_STREAM_TIMEOUT"] = "1"
    ws.config.write_text(yaml.safe_dump(config))
    proc = ws.cli("--project", "p", "--task", "t", "ask")
    assert proc.returncode == 1
    (run,) = ws.runs()
    assert run.reason == "api_error" and "went silent for 1s" in (run.message or "")
