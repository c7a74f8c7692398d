"""`run-agent ops`: apply a message from a file or stdin; answer a pause from another process."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runagent.ops.protocol import MAX_MESSAGE_BYTES
from tests.conftest import Workspace


def batch(*operations: Any) -> str:
    return json.dumps({"protocolVersion": "1.0", "operations": list(operations)})


def events(out: str) -> dict[str, Any]:
    reply = json.loads(out)
    assert isinstance(reply, dict)
    return reply


def test_apply_pause_then_approve_from_a_new_process(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    (ws.path / "project" / "victim").mkdir()  # `rm -r` of it needs approval under `standard`
    ops_file = ws.path / "ops.json"
    ops_file.write_text(batch(
        {"type": "shell", "command": "echo one >> log"},
        {"type": "shell", "id": "rm-1", "command": "rm -r victim && echo ran >> log"},
        {"type": "shell", "command": "echo three >> log"},
    ))  # fmt: skip
    first = ws.cli("ops", "apply", str(ops_file), "--workspace", "project", "--policy", "standard")
    assert first.returncode == 0, first.stderr
    paused = events(first.stdout)
    assert paused["status"] == "awaiting_approval"
    assert paused["events"][-1]["operationId"] == "rm-1"
    run = paused["runId"]
    folder = ws.root / "ops" / "ops" / "runs" / run
    assert (folder / "approval-pending.json").is_file()

    wrong = ws.cli("ops", "approve", run, "other")
    assert wrong.returncode == 2 and "awaits approval of 'rm-1'" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1

    approved = ws.cli("ops", "approve", run, "rm-1")
    assert approved.returncode == 0, approved.stderr
    assert events(approved.stdout)["status"] == "completed"
    assert (ws.path / "project" / "log").read_text() == "one\nran\nthree\n"
    assert not (folder / "approval-pending.json").exists()

    again = ws.cli("ops", "approve", run, "rm-1")
    assert again.returncode == 2 and f"run {run} awaits no approval" in again.stderr
    assert (ws.path / "project" / "log").read_text().count("ran") == 1
    assert len((folder / "events.jsonl").read_text().splitlines()) == 2


def test_deny_from_a_new_process_lets_the_rest_run(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    message = batch(
        {"type": "shell", "id": "rm-1", "command": "rm -rf ."},
        {"type": "createFile", "path": "after.txt", "content": "still here"},
    )
    first = ws.cli("ops", "apply", "-", "-w", "project", input=message)
    run = events(first.stdout)["runId"]
    denied = ws.cli("ops", "deny", run, "rm-1", "--reason", "not now")
    assert denied.returncode == 0, denied.stderr
    reply = events(denied.stdout)
    assert [e["type"] for e in reply["events"]] == ["policyDenied", "createFile"]
    assert "not now" in reply["events"][0]["reason"] and reply["events"][0]["suggestion"]
    assert (ws.path / "project" / "after.txt").read_text() == "still here"


def test_a_run_continues_with_its_own_workspace(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    create = batch({"type": "createFile", "path": "a.txt", "content": "1"})
    first = ws.cli("ops", "apply", "-", "-w", "project", "--policy", "permissive", input=create)
    run = events(first.stdout)["runId"]
    second = ws.cli("ops", "apply", "-", "--run", run,
                    input=batch({"type": "readFile", "path": "a.txt"}))  # fmt: skip
    assert events(second.stdout)["events"][0]["content"] == "1"


def test_what_is_not_an_operations_message_is_an_error_event_and_exit_1(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    for text in ("not json at all", "[1, 2]", '{"protocolVersion": "1.0"}'):
        result = ws.cli("ops", "apply", "-", "-w", "project", input=text)
        assert result.returncode == 1
        reply = events(result.stdout)
        assert reply["status"] == "error" and len(reply["events"]) == 1
        assert reply["events"][0]["category"] == "validation"


def test_usage_errors_are_one_line_with_exit_2(ws: Workspace, tmp_path: Path) -> None:
    (ws.path / "m.json").write_text(batch())
    cases = [
        ("ops", "apply", "m.json"),  # no workspace
        ("ops", "apply", "m.json", "-w", "missing-folder"),
        ("ops", "apply", "m.json", "-w", ".", "--policy", "lax"),
        ("ops", "apply", "m.json", "--run", "20260101-000000000-1"),
        ("ops", "approve", "20260101-000000000-1", "op"),
        ("ops", "apply", "m.json", "-w", ".", "-p", "../x"),
    ]
    for args in cases:
        result = ws.invoke(*args)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "name, fragment",
    [("/dev/zero", "is a device"), ("fifo", "is a FIFO"), ("folder", "is a folder")],
)
def test_a_message_file_that_is_no_regular_file_is_refused_at_once(
    ws: Workspace, name: str, fragment: str
) -> None:
    (ws.path / "project").mkdir()
    (ws.path / "folder").mkdir()
    os.mkfifo(ws.path / "fifo")  # nobody writes to it: reading it would wait forever
    result = ws.cli("ops", "apply", name, "-w", "project", timeout=30)
    assert result.returncode == 2, result.stderr
    assert one_line(result.stderr).endswith(
        f"message file {name!r} {fragment}, not a regular file; give a file"
    )
    assert not ws.root.exists() or not list(ws.root.glob("*/*/runs/*"))  # no run was made


def test_a_message_over_the_api_limit_is_refused_whole_and_not_recorded(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    first = ws.cli("ops", "apply", "-", "-w", "project", input=batch())
    run = events(first.stdout)["runId"]
    folder = ws.root / "ops" / "ops" / "runs" / run
    recorded = (folder / "operations.jsonl").read_bytes()
    huge = ws.path / "huge.json"
    with huge.open("wb") as f:  # a sparse file: its size is what is refused, before any read
        f.truncate(MAX_MESSAGE_BYTES + 1)
    from_file = ws.cli("ops", "apply", str(huge), "--run", run)
    assert from_file.returncode == 2
    assert one_line(from_file.stderr).endswith(
        f"message file {str(huge)!r} is larger than 64 MiB; is it the right file?"
    )
    content = "x" * MAX_MESSAGE_BYTES  # with the JSON around it, just over the limit
    piped = ws.cli("ops", "apply", "-", "--run", run, input=batch(message(content)))
    assert piped.returncode == 2
    assert "the message on stdin is larger than 64 MiB" in one_line(piped.stderr)
    assert (folder / "operations.jsonl").read_bytes() == recorded  # neither was kept


def test_a_message_nested_too_deep_says_so(ws: Workspace) -> None:
    (ws.path / "project").mkdir()
    deep = '{"protocolVersion": "1.0", "operations": [' + "[" * 200_000 + "]" * 200_000 + "]}"
    result = ws.cli("ops", "apply", "-", "-w", "project", input=deep)
    assert result.returncode == 1, result.stderr
    reply = events(result.stdout)
    assert reply["status"] == "error"
    assert reply["events"][0]["message"].startswith("the message is nested too deep to read")


def message(content: str) -> dict[str, str]:
    return {"type": "message", "content": content}


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]
