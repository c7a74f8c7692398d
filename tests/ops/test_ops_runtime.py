"""The operations runtime: file and shell operations, the policy gate, pauses for approval that
another process answers, and the journals kept in the run folder."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from runagent.ops import approval as approvals
from runagent.ops.policy import Decision, Verdict
from runagent.ops.runtime import Runtime
from runagent.ops.sandbox import Sandbox
from runagent.ops.shell import OUTPUT_CAP
from runagent.store.runfolder import RunPaths
from tests.conftest import alive, wait_for


def ops(*operations: Any) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


def sh(command: str, **fields: Any) -> dict[str, Any]:
    return {"type": "shell", "command": command, **fields}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "ws").mkdir()
    return tmp_path / "ws"


def new(tmp_path: Path, preset: str = "permissive", **kw: Any) -> Runtime:
    """A runtime without the OS sandbox: these tests look at processes and files of the host
    (tests/ops/test_ops_sandbox.py is where the sandbox is)."""
    return Runtime.create(tmp_path / "run", tmp_path / "ws", preset, Sandbox.NONE, **kw)


def test_files_round_trip(tmp_path: Path, root: Path) -> None:
    (root / "bin.dat").write_bytes(b"\xff\x00")
    reply = new(tmp_path).receive(ops(
        {"type": "createFile", "path": "b.bin", "content": "AAEC", "encoding": "base64"},
        {"type": "readFile", "path": "b.bin", "encoding": "base64"},
        {"type": "readFile", "path": "bin.dat"},
        {"type": "deleteFile", "path": "b.bin"},
        {"type": "deleteFile", "path": "b.bin"},
    ))  # fmt: skip
    made, read, not_text, deleted, again = reply.events
    assert made["bytesWritten"] == 3 and (read["content"], read["size"]) == ("AAEC", 3)
    assert not_text["success"] is False and "base64" in not_text["error"]
    assert deleted["success"] is True
    assert again == {**again, "success": False, "error": "File not found"}


def test_edits_apply_in_order_to_the_first_occurrence_or_not_at_all(
    tmp_path: Path, root: Path
) -> None:
    (root / "f.txt").write_text("a a a\n")
    rt = new(tmp_path)
    ok = rt.receive(
        ops(
            {
                "type": "editFile",
                "path": "f.txt",
                "edits": [
                    {"oldContent": "a", "newContent": "b"},
                    {"oldContent": "b a", "newContent": "c"},
                ],
            }
        )
    )
    assert ok.events[0]["editsApplied"] == 2
    assert (root / "f.txt").read_text() == "c a\n"
    failed = rt.receive(
        ops(
            {
                "type": "editFile",
                "path": "f.txt",
                "edits": [
                    {"oldContent": "c", "newContent": "X"},
                    {"oldContent": "zzz", "newContent": "Y"},
                ],
            }
        )
    )
    assert failed.events[0]["success"] is False and "edit 2 of 2" in failed.events[0]["error"]
    assert (root / "f.txt").read_text() == "c a\n"  # the first edit was not kept either


def test_shell_runs_in_its_cwd_with_exactly_its_environment(tmp_path: Path, root: Path) -> None:
    (root / "sub").mkdir()
    rt = new(tmp_path, environment={"PATH": os.environ["PATH"]})
    event = rt.receive(ops(sh("pwd; env", cwd="sub", env={"GREETING": "hi"}))).events[0]
    assert event["success"] is True and event["exitCode"] == 0
    lines = event["stdout"].splitlines()
    assert lines[0] == str(root.resolve() / "sub")
    names = {line.split("=", 1)[0] for line in lines[1:]}
    # bash adds PWD, SHLVL and _; Python's locale coercion (PEP 538) may add LC_CTYPE.
    shell_own = {"PWD", "SHLVL", "_", "OLDPWD", "LC_CTYPE"}
    assert "GREETING=hi" in lines and names <= {"PATH", "GREETING", *shell_own}


def test_shell_reports_failures_as_data(tmp_path: Path, root: Path) -> None:
    (root / "out").symlink_to(tmp_path)
    events = new(tmp_path).receive(ops(
        sh("echo oops >&2; exit 3"), sh("no-such-command-here"), sh("pwd", cwd="out"),
    )).events  # fmt: skip
    assert (events[0]["exitCode"], events[0]["stderr"], events[0]["success"]) == (
        3,
        "oops\n",
        False,
    )
    assert events[1]["exitCode"] == 127 and events[1]["success"] is False
    assert events[2]["success"] is False and "leads out of the workspace" in events[2]["error"]


def test_a_timeout_kills_the_whole_tree_and_exits_124(tmp_path: Path, root: Path) -> None:
    command = "sleep 60 & echo $! > bg.pid; (setsid sleep 60 & echo $! > daemon.pid); sleep 60"
    # 5 s: time for the shell to write both pids on a loaded machine before it is killed.
    event = new(tmp_path).receive(ops(sh(command, timeout=5000))).events[0]
    assert event["timedOut"] is True and event["exitCode"] == 124 and event["success"] is False
    assert event["durationMs"] >= 5000
    for name in ("bg.pid", "daemon.pid"):
        pid = int((root / name).read_text())
        wait_for(lambda pid=pid: not alive(pid), what=f"{name} ({pid}) to be gone")


def test_long_output_is_cut_and_marked(tmp_path: Path, root: Path) -> None:
    event = new(tmp_path).receive(ops(sh("head -c 3000000 /dev/zero | tr '\\0' a"))).events[0]
    assert event["stdout"].startswith("a" * OUTPUT_CAP)
    assert f"[output cut: 3000000 bytes, the first {OUTPUT_CAP} shown]" in event["stdout"]


class Gate:
    """A policy that denies `curl`, holds `rm` for approval and allows the rest."""

    def check_command(self, command: str, env: object = None) -> Decision:
        if command.startswith("curl"):
            return Decision(Verdict.DENY, "net", "no network", "download it beforehand")
        if command.startswith("rm"):
            return Decision(Verdict.APPROVE, "destructive", "rm needs approval", "use mv")
        return Decision(Verdict.ALLOW, "ok", "fine")

    def check_path(self, operation: str, path: str) -> Decision:
        if path.startswith("private/"):
            return Decision(Verdict.DENY, "private", "private files", None)
        return Decision(Verdict.ALLOW, "ok", "fine")


def test_a_denied_operation_is_reported_and_the_batch_goes_on(tmp_path: Path, root: Path) -> None:
    events = new(tmp_path, policy=Gate()).receive(ops(
        sh("curl http://example.invalid", id="c1"),
        {"type": "readFile", "path": "private/key"},
        sh("echo after"),
    )).events  # fmt: skip
    assert events[0] == {**events[0], "type": "policyDenied", "operationId": "c1",
                         "operationType": "shell", "reason": "no network",
                         "suggestion": "download it beforehand"}  # fmt: skip
    assert events[1]["type"] == "policyDenied" and "suggestion" not in events[1]
    assert events[2]["stdout"] == "after\n"


def batch_with_a_pause() -> dict[str, Any]:
    return ops(
        sh("echo one >> log"),
        sh("rm -f victim && echo ran >> log", id="rm-1"),
        sh("echo three >> log"),
    )


def test_a_pause_persists_and_a_new_runtime_resumes_it_once(tmp_path: Path, root: Path) -> None:
    (root / "victim").write_text("x")
    first = new(tmp_path, policy=Gate()).receive(batch_with_a_pause())
    assert first.status.value == "awaiting_approval"
    assert [e["type"] for e in first.events] == ["shell", "approvalRequired"]
    assert (root / "log").read_text() == "one\n" and (root / "victim").exists()
    pending = approvals.peek(RunPaths(tmp_path / "run").approval_pending)
    assert pending is not None and (pending.operation_id, pending.position) == ("rm-1", 1)
    assert pending.digest == approvals.digest(batch_with_a_pause()["operations"][1])

    # More operations while paused are refused, and nothing runs.
    later = Runtime.open(tmp_path / "run", policy=Gate())
    busy = later.receive(ops(sh("echo no >> log")))
    assert busy.status.value == "awaiting_approval" and busy.events[0]["type"] == "error"

    resumed = later.receive({"type": "userMessage", "content": "Approved"})
    assert resumed.status.value == "completed"
    assert [e.get("operationId") for e in resumed.events] == ["rm-1", None]
    assert (root / "log").read_text() == "one\nran\nthree\n" and not (root / "victim").exists()
    again = later.receive({"approval": {"operationId": "rm-1", "decision": "approved"}})
    assert again.status.value == "error" and (root / "log").read_text().count("ran") == 1


def test_a_denial_reports_policy_denied_and_the_rest_continues(tmp_path: Path, root: Path) -> None:
    new(tmp_path, policy=Gate()).receive(batch_with_a_pause())
    reply = Runtime.open(tmp_path / "run", policy=Gate()).receive(
        {"approval": {"operationId": "rm-1", "decision": "denied", "reason": "keep it"}}
    )
    denied, after = reply.events
    assert denied["type"] == "policyDenied" and denied["operationId"] == "rm-1"
    assert "keep it" in denied["reason"] and denied["suggestion"] == "use mv"
    assert after["type"] == "shell" and reply.status.value == "completed"
    assert (root / "log").read_text() == "one\nthree\n"


def test_an_answer_for_another_operation_or_hash_is_refused(tmp_path: Path, root: Path) -> None:
    new(tmp_path, policy=Gate()).receive(batch_with_a_pause())
    rt = Runtime.open(tmp_path / "run", policy=Gate())
    for answer in ({"operationId": "other", "decision": "approved"},
                   {"decision": "approved", "operationHash": "sha256:0"},
                   {"decision": "maybe"}):  # fmt: skip
        reply = rt.receive({"approval": answer})
        assert reply.status.value == "awaiting_approval" and reply.events[0]["type"] == "error"
    assert rt.pending is not None and "ran" not in (root / "log").read_text()


def test_an_operation_changed_while_paused_is_not_run(tmp_path: Path, root: Path) -> None:
    new(tmp_path, policy=Gate()).receive(batch_with_a_pause())
    path = RunPaths(tmp_path / "run").approval_pending
    data = json.loads(path.read_text())
    data["operations"][1]["command"] = "rm -rf / --no-preserve-root"
    path.write_text(json.dumps(data))
    reply = Runtime.open(tmp_path / "run", policy=Gate()).receive(
        {"type": "userMessage", "content": "approved"}
    )
    assert reply.status.value == "error" and "changed" in reply.events[0]["message"]


def test_only_one_taker_gets_a_pause(tmp_path: Path, root: Path) -> None:
    new(tmp_path, policy=Gate()).receive(batch_with_a_pause())
    path = RunPaths(tmp_path / "run").approval_pending
    assert approvals.take(path) is not None
    assert approvals.take(path) is None


def test_an_operation_without_an_id_gets_one_for_its_pause(tmp_path: Path, root: Path) -> None:
    rt = new(tmp_path, policy=Gate())
    reply = rt.receive(ops(sh("true"), sh("rm -f x")))
    assert reply.events[1]["operationId"] == "operation-2"
    resumed = rt.receive({"approval": {"operationId": "operation-2", "decision": "approved"}})
    assert resumed.events[0]["operationId"] == "operation-2"


def test_every_message_and_answer_is_journaled(tmp_path: Path, root: Path) -> None:
    rt = new(tmp_path, policy=Gate())
    rt.receive(batch_with_a_pause())
    rt.receive({"type": "userMessage", "content": "denied"})
    rt.receive_text("this is not JSON")
    paths = RunPaths(tmp_path / "run")
    received = [json.loads(line) for line in paths.operations.read_text().splitlines()]
    answered = [json.loads(line) for line in paths.events.read_text().splitlines()]
    assert [r["message"] for r in received] == [
        batch_with_a_pause(), {"type": "userMessage", "content": "denied"}, "this is not JSON",
    ]  # fmt: skip
    assert [a["status"] for a in answered] == ["awaiting_approval", "completed", "error"]
    assert answered[2]["events"][0]["category"] == "validation"


def test_a_workspace_that_holds_the_run_folder_is_refused(tmp_path: Path, root: Path) -> None:
    from runagent.errors import UsageError

    with pytest.raises(UsageError, match="inside the workspace"):
        Runtime.create(root / "runs" / "r1", root, "permissive")
    with pytest.raises(UsageError, match="inside the workspace"):
        Runtime.create(tmp_path / "run", tmp_path, "permissive")


def test_an_approval_is_used_once_and_the_next_operation_asks_again(
    tmp_path: Path, root: Path
) -> None:
    rt = new(tmp_path, policy=Gate())
    rt.receive(ops(sh("rm -f a", id="one"), sh("rm -f b", id="two"), sh("echo done")))
    resumed = rt.receive({"approval": {"operationId": "one", "decision": "approved"}})
    assert resumed.status.value == "awaiting_approval"
    assert [(e["type"], e["operationId"]) for e in resumed.events] == [
        ("shell", "one"), ("approvalRequired", "two"),
    ]  # fmt: skip
    last = rt.receive({"approval": {"operationId": "two", "decision": "approved"}})
    assert [e["type"] for e in last.events] == ["shell", "shell"]
    assert last.status.value == "completed"


def test_a_command_that_floods_its_output_is_stopped(tmp_path: Path, root: Path) -> None:
    event = new(tmp_path).receive(ops(sh("yes"))).events[0]
    assert event["success"] is False and "was stopped" in event["error"]
    assert event["durationMs"] < 20000 and "[output cut:" in event["stdout"]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BASH_ENV", "evil.sh"),
        ("PATH", "bin:/usr/bin:/bin"),
        ("BASH_FUNC_true%%", "() { ./bin/ls; }"),
    ],
)
def test_an_operations_env_passes_the_same_gate_as_an_assignment(
    tmp_path: Path, root: Path, variable: str, value: str
) -> None:
    """`env` is judged as `NAME=value command` would be: what changes what runs is held, so
    neither the workspace's own `ls` nor a BASH_ENV file runs before a person says so."""
    (root / "bin").mkdir()
    for script in (root / "evil.sh", root / "bin" / "ls"):
        script.write_text("#!/bin/sh\necho ran > ran.txt\n")
        script.chmod(0o755)
    rt = new(tmp_path, "standard", environment={"PATH": "/usr/bin:/bin"})
    held = rt.receive(ops(sh("true; ls", id="s1", env={variable: value})))
    assert held.status.value == "awaiting_approval"
    assert held.events[0]["details"]["policy"] == f"shell.sensitiveVariable: {variable}"
    assert variable in held.events[0]["reason"] and not (root / "ran.txt").exists()
    assert rt.receive({"approval": {"decision": "denied"}}).status.value == "completed"
    assert not (root / "ran.txt").exists()
    # The same assignment written in the command is held by the same rule.
    written = rt.receive(ops(sh("BASH_ENV=evil.sh true", id="s2")))
    assert written.events[0]["details"]["policy"] == "shell.sensitiveVariable: BASH_ENV"
    rt.receive({"approval": {"decision": "denied"}})
    # A variable that changes nothing of what runs passes.
    plain = rt.receive(ops(sh("echo $GREETING", env={"GREETING": "hi", "LANG": "C.UTF-8"})))
    assert plain.status.value == "completed" and plain.events[0]["stdout"] == "hi\n"
