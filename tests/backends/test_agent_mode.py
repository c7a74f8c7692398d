"""Agent mode end to end: run-agent, the chat-completions child, the operations runtime in the
working folder, and a fake provider on 127.0.0.1 whose replies are operations messages."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Workspace, wait_for
from tests.fake_models import FakeModelServer

TOKEN = "sk-fake-provider-key-0002"


def ops(*operations: dict[str, Any]) -> str:
    return json.dumps({"protocolVersion": "1.0", "operations": list(operations)})


def done(text: str = "Done: hello.txt holds the greeting.") -> str:
    return ops({"type": "message", "content": text})


@pytest.fixture
def provider() -> Iterator[FakeModelServer]:
    with FakeModelServer(scenario="script") as server:
        yield server


@pytest.fixture
def work(ws: Workspace) -> Path:
    folder = ws.path / "work"  # the working folder: not the one that holds the runs root
    folder.mkdir()
    return folder


def configure(
    ws: Workspace, provider: FakeModelServer, backend: str = "xai",
    ops_section: dict[str, Any] | None = None, max_turns: int = 10, **defaults: Any,
) -> None:  # fmt: skip
    config: dict[str, Any] = {
        "agents": {
            "api": {
                "type": backend,
                "mode": "agent",
                "max_turns": max_turns,
                "base_url": f"{provider.base_url}/v1",
                "token": TOKEN,
                "model": "fake-model",
                "env": {"RUN_AGENT_CHAT_RETRIES": "0", "RUN_AGENT_STREAM_TIMEOUT": "60"},
            }
        },
        "defaults": {"agent": "api", "max_restarts": 0, "restart_delay": "50ms",
                     "kill_grace": "1s", **defaults},
        "storage": {"runs_dir": str(ws.root)},
    }  # fmt: skip
    if ops_section is not None:
        config["ops"] = ops_section
    ws.config.write_text(yaml.safe_dump(config))


def run(ws: Workspace, work: Path) -> Any:
    return ws.cli("--project", "p", "--task", "t", "--cwd", str(work), "make hello.txt")


def events_sent(provider: FakeModelServer, request: int) -> dict[str, Any]:
    """The events message run-agent sent as the last user turn of chat request `request`."""
    last = provider.chat_bodies()[request]["messages"][-1]
    assert last["role"] == "user"
    return json.loads(last["content"])  # type: ignore[no-any-return]


@pytest.mark.parametrize("backend", ["xai", "perplexity", "chat_completions"])
def test_files_appear_a_command_runs_and_the_final_message_is_output_md(
    ws: Workspace, provider: FakeModelServer, work: Path, backend: str
) -> None:
    first = ops(
        {"type": "message", "content": "Writing the file."},
        {"type": "createFile", "id": "f1", "path": "sub/hello.txt", "content": "hello\n"},
        {"type": "shell", "id": "s1", "command": "cat sub/hello.txt && echo ran > ran.txt"},
    )
    provider.replies = [f"Here you go:\n```json\n{first}\n```\n", done()]
    configure(ws, provider, backend)
    proc = run(ws, work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "sub/hello.txt").read_text() == "hello\n"
    assert (work / "ran.txt").read_text() == "ran\n"
    (info,) = ws.runs()
    paths = ws.task().run(info.run_id)
    assert paths.output.read_text() == "Done: hello.txt holds the greeting.\n"
    assert info.status == "completed"
    bodies = provider.chat_bodies()
    assert len(bodies) == 2  # the loop ended on the message-only reply
    system, task = bodies[0]["messages"][:2]
    assert system["role"] == "system" and '"protocolVersion": "1.0"' in system["content"]
    assert task["role"] == "user" and task["content"].endswith("make hello.txt\n")
    sent = events_sent(provider, 1)
    assert sent["status"] == "completed"
    assert [e["type"] for e in sent["events"]] == ["message", "createFile", "shell"]
    shell = sent["events"][2]
    assert shell["operationId"] == "s1" and shell["success"] and shell["stdout"] == "hello\n"
    # The run folder keeps the conversation's record; stdout shows the model's replies.
    assert len(paths.operations.read_text().splitlines()) == 2
    assert "Writing the file." in paths.stdout.read_text()
    assert "turn 1: createFile sub/hello.txt ok" in paths.stderr.read_text()


def test_a_reply_that_is_not_operations_gets_an_error_event_and_the_next_one_works(
    ws: Workspace, provider: FakeModelServer, work: Path
) -> None:
    fixed = ops({"type": "createFile", "path": "hello.txt", "content": "hi"})
    provider.replies = ["Sure! I will create the file now.", "{not json", fixed, done()]
    configure(ws, provider)
    proc = run(ws, work)
    assert proc.returncode == 0, proc.stderr
    for request in (1, 2):
        sent = events_sent(provider, request)
        (error,) = sent["events"]
        assert sent["status"] == "error"
        assert error["type"] == "error" and error["category"] == "validation"
        assert "not JSON" in error["message"]
    assert (work / "hello.txt").read_text() == "hi"
    assert events_sent(provider, 3)["events"][0]["success"] is True


def test_max_turns_ends_the_run_with_a_clear_reason(
    ws: Workspace, provider: FakeModelServer, work: Path
) -> None:
    provider.replies = [ops({"type": "shell", "command": "echo again"})]
    configure(ws, provider, max_turns=3)
    proc = run(ws, work)
    assert proc.returncode == 1
    (info,) = ws.runs()
    assert info.status == "failed"
    assert "max_turns 3 reached" in (info.message or "")
    assert len(provider.chat_bodies()) == 3


def test_approvals_deny_tells_the_model_policy_denied(
    ws: Workspace, provider: FakeModelServer, work: Path
) -> None:
    (work / "build").mkdir()
    provider.replies = [ops({"type": "shell", "id": "clean", "command": "rm -r build"}), done()]
    configure(ws, provider, ops_section={"policy": "standard", "approvals": "deny"})
    proc = run(ws, work)
    assert proc.returncode == 0, proc.stderr
    assert (work / "build").is_dir()  # not run
    (denied,) = events_sent(provider, 1)["events"]
    assert denied["type"] == "policyDenied" and denied["operationId"] == "clean"
    assert "ops.approvals: deny" in denied["reason"] and "rm -r" in denied["reason"]
    assert denied["suggestion"]
    (info,) = ws.runs()
    assert not ws.task().run(info.run_id).approval_pending.exists()


def test_approvals_wait_pauses_until_a_person_approves_from_another_process(
    ws: Workspace, provider: FakeModelServer, work: Path
) -> None:
    (work / "build").mkdir()
    provider.replies = [
        ops(
            {"type": "createFile", "path": "before.txt", "content": "1"},
            {"type": "shell", "id": "clean", "command": "rm -r build"},
            {"type": "shell", "id": "after", "command": "echo after"},
        ),
        done(),
    ]
    # idle_timeout counts from the agent's start: it must outlast the start of a Python process
    # and its first request on a loaded machine, which took more than 1 s in CI (killed as idle
    # before it could pause).
    configure(
        ws, provider, ops_section={"approvals": "wait", "rules": {"deny": ["terraform"]}},
        idle_timeout="5s",
    )  # fmt: skip
    proc = ws.start_cli("--project", "p", "--task", "t", "--cwd", str(work), "make hello.txt")
    try:
        info = wait_for(lambda: ws.runs()[0] if ws.runs() else None, what="the run")
        paths = ws.task().run(info.run_id)
        wait_for(paths.approval_pending.exists, 60, "the pause")  # a loaded CI machine
        paused = time.monotonic()
        wait_for(lambda: "waiting for approval of operation 'clean'" in paths.stderr.read_text())
        # Waiting for a person is not idle: well past idle_timeout, the run is still there.
        wait_for(lambda: time.monotonic() - paused > 11, what="two idle timeouts")
        assert proc.poll() is None and (work / "build").is_dir()
        assert "still waiting for approval" in paths.stderr.read_text()
        answer = ws.cli("ops", "approve", info.run_id, "clean")
        assert answer.returncode == 0, answer.stderr
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (work / "build").exists()  # run once, by the approving process
    sent = events_sent(provider, 1)
    assert sent["status"] == "completed"
    types = [(e["type"], e.get("operationId")) for e in sent["events"]]
    assert types == [("createFile", None), ("shell", "clean"), ("shell", "after")]
    assert sent["events"][2]["stdout"] == "after\n"
    assert ws.task().run(info.run_id).output.read_text().startswith("Done")


def test_a_working_folder_that_holds_the_run_folder_is_refused_in_one_line(
    ws: Workspace, provider: FakeModelServer
) -> None:
    provider.replies = [done()]
    configure(ws, provider)
    proc = run(ws, ws.path)  # the runs root is inside: the model could rewrite its own policy
    assert proc.returncode == 1  # the child exits 2, which no restart can fix
    assert "not restarting" in proc.stderr
    (info,) = ws.runs()
    assert "agent mode cannot start" in (info.message or "")
    assert "inside the workspace" in (info.message or "")
    assert not provider.chat_bodies()
