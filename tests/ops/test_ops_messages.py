"""The operations protocol's messages: the validator against the spec's JSON Schema on a corpus,
the spec's own examples as test vectors, and properties that hold for any JSON a model sends."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runagent.ops.operation import BadMessage, Batch, Invalid, read_message
from runagent.ops.policy import Decision, Verdict
from runagent.ops.protocol import MAX_FILE_BYTES
from runagent.ops.runtime import Runtime
from runagent.ops.sandbox import Sandbox

SCHEMA = json.loads(resources.files("runagent.ops").joinpath("schema.json").read_text())
SPEC = Path("/work/shared/spec/operations-protocol.md")


def ops(*operations: Any) -> dict[str, Any]:
    return {"protocolVersion": "1.0", "operations": list(operations)}


def shell(**fields: Any) -> dict[str, Any]:
    return {"type": "shell", "command": "true", **fields}


def create(**fields: Any) -> dict[str, Any]:
    return {"type": "createFile", "path": "a.txt", "content": "x", **fields}


LONG = "a" * 255
# The spec's examples (operations-protocol.md, -reference.md), copied as they are written there.
EXAMPLE_1 = ops(
    {"type": "message", "content": "I'll create a simple script to print the current date."},
    {"type": "createFile", "path": "date-script.ts",
     "content": "console.log(new Date().toISOString());"},
    {"type": "shell", "command": "bun run date-script.ts"},
)  # fmt: skip
REMINDER = (
    "import { getTrainSchedule, createNote } from '@company/sdk';\n\nconst trips = await "
    "getTrainSchedule();\nconst trip = trips.find(t => t.hour === 8);\nif (trip) {\n  await "
    "createNote(`Train at ${trip.hour}:00 - ${trip.destination}`);\n  console.log('Reminder "
    "created');\n} else {\n  console.log('No 8am trip found');\n}"
)
EXAMPLE_2 = ops(
    {"type": "message",
     "content": "I'm going to create a train schedule reminder for the 8am trip."},
    {"type": "createFile", "path": "reminder.ts", "content": REMINDER},
    {"type": "shell", "command": "bun run reminder.ts"},
)  # fmt: skip
EXAMPLE_3 = ops(
    {"type": "message", "content": "I need to clean up the temp directory."},
    {"type": "shell", "id": "cleanup-1", "command": "rm -rf temp/*"},
)
REFERENCE_OPS = [
    {"type": "message", "id": "msg-1", "content": "Processing data..."},
    {"type": "createFile", "id": "file-1", "path": "src/utils.ts",
     "content": "export const helper = () => {};", "encoding": "utf-8", "overwrite": False},
    {"type": "readFile", "id": "read-1", "path": "config.json", "encoding": "utf-8"},
    {"type": "editFile", "id": "edit-1", "path": "src/app.ts",
     "edits": [{"oldContent": "const x = 1;", "newContent": "const x = 42;"}]},
    {"type": "deleteFile", "id": "del-1", "path": "temp.txt"},
    {"type": "shell", "id": "shell-1", "command": "bun run test.ts", "cwd": "src",
     "timeout": 30000, "env": {"DEBUG": "true"}},
]  # fmt: skip

VALID: list[tuple[str, Any]] = [
    ("example 1", EXAMPLE_1),
    ("example 2", EXAMPLE_2),
    ("example 2, final", ops({"type": "message", "content": "Done!"})),
    ("example 3", EXAMPLE_3),
    *[(f"reference {op['type']}", ops(op)) for op in REFERENCE_OPS],
    ("reference, all six", ops(*REFERENCE_OPS)),
    ("no operations", ops()),
    ("base64 content", ops(create(content="aGVsbG8=", encoding="base64"))),
    ("overwrite", ops(create(overwrite=True))),
    ("readFile base64", ops({"type": "readFile", "path": "a.bin", "encoding": "base64"})),
    ("no edits", ops({"type": "editFile", "path": "a", "edits": []})),
    ("two edits", ops({"type": "editFile", "path": "a", "edits": [
        {"oldContent": "a", "newContent": "b"}, {"oldContent": "b", "newContent": ""}]})),
    ("timeout at its least", ops(shell(timeout=1000))),
    ("timeout at its most", ops(shell(timeout=3_600_000))),
    ("timeout written 5000.0", ops(shell(timeout=5000.0))),
    ("an unknown field", ops({"type": "message", "content": "x", "mood": "fine"})),
    ("path of 255 characters", ops(create(path=LONG))),
    ("command of 4096 characters", ops(shell(command="e" * 4096))),
    ("message of 100000 characters", ops({"type": "message", "content": "m" * 100_000})),
    ("a Unicode path", ops(create(path="données/é.txt"))),
    ("a ./ path", ops(create(path="./a.txt"))),
    ("an extra top-level key", {**ops(), "note": 1}),
    ("empty env", ops(shell(env={}))),
    ("cwd", ops(shell(cwd="sub/dir"))),
    ("empty content", ops(create(content=""))),
]  # fmt: skip

# Both the schema and the validator refuse these.
INVALID: list[tuple[str, Any]] = [
    ("a list", []), ("a string", "hello"), ("a number", 1), ("null", None), ("true", True),
    ("no protocolVersion", {"operations": []}),
    ("protocolVersion 2.0", {"protocolVersion": "2.0", "operations": []}),
    ("protocolVersion a number", {"protocolVersion": 1.0, "operations": []}),
    ("no operations", {"protocolVersion": "1.0"}),
    ("operations an object", {"protocolVersion": "1.0", "operations": {}}),
    ("operations a string", {"protocolVersion": "1.0", "operations": "[]"}),
    ("an operation that is a string", ops("message")),
    ("an operation that is a number", ops(3)),
    ("an unknown type", ops({"type": "writeFile", "path": "a", "content": ""})),
    ("no type", ops({"content": "x"})),
    ("type a number", ops({"type": 5})),
    ("message without content", ops({"type": "message"})),
    ("message content a number", ops({"type": "message", "content": 5})),
    ("message of 100001 characters", ops({"type": "message", "content": "m" * 100_001})),
    ("id a number", ops({"type": "message", "id": 7, "content": "x"})),
    ("id null", ops({"type": "message", "id": None, "content": "x"})),
    ("createFile without path", ops({"type": "createFile", "content": "x"})),
    ("createFile without content", ops({"type": "createFile", "path": "a"})),
    ("path a number", ops(create(path=7))),
    ("encoding latin1", ops(create(encoding="latin1"))),
    ("overwrite 'yes'", ops(create(overwrite="yes"))),
    ("path of 256 characters", ops(create(path="a" * 256))),
    ("readFile without path", ops({"type": "readFile"})),
    ("editFile without edits", ops({"type": "editFile", "path": "a"})),
    ("edits an object", ops({"type": "editFile", "path": "a", "edits": {}})),
    ("an edit without newContent", ops({"type": "editFile", "path": "a",
                                        "edits": [{"oldContent": "a"}]})),
    ("oldContent a number", ops({"type": "editFile", "path": "a",
                                 "edits": [{"oldContent": 1, "newContent": "b"}]})),
    ("an edit that is a string", ops({"type": "editFile", "path": "a", "edits": ["a->b"]})),
    ("deleteFile without path", ops({"type": "deleteFile"})),
    ("shell without command", ops({"type": "shell"})),
    ("command of 4097 characters", ops(shell(command="e" * 4097))),
    ("timeout 999", ops(shell(timeout=999))),
    ("timeout 3600001", ops(shell(timeout=3_600_001))),
    ("timeout a string", ops(shell(timeout="30000"))),
    ("timeout 1500.5", ops(shell(timeout=1500.5))),
    ("timeout true", ops(shell(timeout=True))),
    ("env value a number", ops(shell(env={"A": 1}))),
    ("env a list", ops(shell(env=["A=1"]))),
    ("cwd a number", ops(shell(cwd=1))),
    ("cwd of 256 characters", ops(shell(cwd="c" * 256))),
]  # fmt: skip

# The schema accepts these; the spec's prose refuses them, and so does the validator.
PROSE: list[tuple[str, Any]] = [
    ("an absolute path", ops(create(path="/etc/passwd"))),
    ("../", ops(create(path="../x"))),
    ("a deeper ../", ops({"type": "readFile", "path": "a/../../b"})),
    ("NUL in a path", ops({"type": "deleteFile", "path": "a\0b"})),
    ("'..' inside a name, as isValidPath refuses it", ops(create(path="foo..bar"))),
    ("an absolute cwd", ops(shell(cwd="/tmp"))),
    ("cwd ..", ops(shell(cwd=".."))),
    ("base64 that is not", ops(create(content="!!!", encoding="base64"))),
    ("content over 10 MB", ops(create(content="a" * (MAX_FILE_BYTES + 1)))),
    ("an env name with '='", ops(shell(env={"A=B": "1"}))),
    ("an env value with NUL", ops(shell(env={"A": "1\0"}))),
    ("a lone surrogate in content", ops(create(content="\ud800"))),
    ("NUL in a command", ops(shell(command="echo a\0b"))),
]


def accepted(message: Any) -> bool:
    batch = read_message(message)
    return isinstance(batch, Batch) and not any(isinstance(e, Invalid) for e in batch.entries)


def test_the_schema_is_the_specs() -> None:
    text = SPEC.read_text() if SPEC.exists() else None
    if text is None:
        pytest.skip(f"{SPEC} is not on this machine")
    block = text.split("## JSON Schema", 1)[1].split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(block) == SCHEMA


def test_the_schema_is_a_draft_7_schema_of_the_six_operations() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    kinds = {d["properties"]["type"]["const"] for d in SCHEMA["definitions"].values() if
             "properties" in d}  # fmt: skip
    assert kinds == {"message", "createFile", "readFile", "editFile", "deleteFile", "shell"}


def test_the_corpus_is_large_and_mixed() -> None:
    assert len(VALID) + len(INVALID) + len(PROSE) >= 60
    assert len(VALID) >= 20 and len(INVALID) >= 20 and len(PROSE) >= 10


@pytest.mark.parametrize(("name", "message"), VALID + INVALID, ids=lambda v: str(v)[:40])
def test_the_validator_and_the_schema_agree(name: str, message: Any) -> None:
    by_schema = jsonschema.Draft7Validator(SCHEMA).is_valid(message)
    assert accepted(message) == by_schema
    assert by_schema == ((name, message) in VALID)


@pytest.mark.parametrize(("name", "message"), PROSE, ids=[n for n, _ in PROSE])
def test_the_prose_rules_go_beyond_the_schema(name: str, message: Any) -> None:
    assert jsonschema.Draft7Validator(SCHEMA).is_valid(message)
    assert not accepted(message)


def test_a_bad_operation_names_its_field_and_the_rule() -> None:
    batch = read_message(ops({"type": "message", "content": "ok"}, create(path="../etc/x"),
                             shell(timeout=5)))  # fmt: skip
    assert isinstance(batch, Batch)
    first, bad_path, bad_timeout = batch.entries
    assert not isinstance(first, Invalid)
    assert isinstance(bad_path, Invalid) and bad_path.field == "operations[1].path"
    assert "'..'" in bad_path.reason
    assert isinstance(bad_timeout, Invalid) and bad_timeout.field == "operations[2].timeout"
    assert "1000..3600000" in bad_timeout.reason


def test_a_message_that_is_not_operations_says_why() -> None:
    assert isinstance(read_message([1]), BadMessage)
    found = read_message({"protocolVersion": "9.9", "operations": []})
    assert isinstance(found, BadMessage) and "'9.9'" in found.reason


# ---- the runtime: the spec's examples, and properties for any input -------------------------


class Permit:
    """Everything is allowed: the commands below come from a fixed, harmless list, and the point
    is one event per operation, not the policy (tests/ops/test_policy.py judges that)."""

    def check_path(self, operation: str, path: str) -> Decision:
        return Decision(Verdict.ALLOW, "test.files", "files are fine")

    def check_command(self, command: str, env: object = None) -> Decision:
        return Decision(Verdict.ALLOW, "test.fixed", "a fixed, harmless command")


class NoShell:
    """Every command is denied: the fuzzing below must never run what it generates."""

    def check_path(self, operation: str, path: str) -> Decision:
        return Decision(Verdict.ALLOW, "test.files", "files are fine")

    def check_command(self, command: str, env: object = None) -> Decision:
        return Decision(Verdict.DENY, "test.noShell", "no commands in this test", "do not")


FIXED = datetime(2025, 1, 15, 10, 30, tzinfo=UTC)


@pytest.fixture
def bun(tmp_path: Path) -> dict[str, str]:
    """A stand-in for `bun run`, printing what the spec's examples show."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "bun"
    script.write_text(
        '#!/bin/sh\ncase "$2" in\n  date-script.ts) echo 2025-01-15T10:30:02.123Z ;;\n'
        "  reminder.ts) echo Reminder created ;;\nesac\n"
    )
    script.chmod(0o755)
    import os

    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def runtime(root: Path, preset: str = "permissive", **kw: Any) -> Runtime:
    (root / "ws").mkdir(exist_ok=True)
    # Unconfined: the examples' `bun` is a script of the test's, outside the workspace.
    return Runtime.create(root / "runs" / "run_abc123", root / "ws", preset, Sandbox.NONE, **kw)


def untimed(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events without what the spec's examples leave to the clock."""
    drop = {"timestamp", "durationMs", "sandbox"}
    return [{k: v for k, v in e.items() if k not in drop and v is not None} for e in events]


def test_example_1_gives_the_specs_events(tmp_path: Path, bun: dict[str, str]) -> None:
    reply = runtime(tmp_path, environment=bun).receive(EXAMPLE_1).to_dict()
    assert list(reply) == ["protocolVersion", "runId", "status", "events"]
    assert reply["status"] == "completed" and reply["runId"] == "run_abc123"
    # The spec prints bytesWritten 42 for a 38-byte content: the real count is kept.
    assert untimed(reply["events"]) == [
        {"type": "message", "success": True},
        {"type": "createFile", "path": "date-script.ts", "success": True, "bytesWritten": 38},
        {"type": "shell", "command": "bun run date-script.ts", "success": True, "exitCode": 0,
         "stdout": "2025-01-15T10:30:02.123Z\n", "stderr": ""},
    ]  # fmt: skip
    for event in reply["events"]:
        assert datetime.fromisoformat(event["timestamp"]).tzinfo is not None
    assert isinstance(reply["events"][2]["durationMs"], int)


def test_example_2_gives_the_specs_events(tmp_path: Path, bun: dict[str, str]) -> None:
    reply = runtime(tmp_path, environment=bun).receive(EXAMPLE_2).to_dict()
    assert untimed(reply["events"]) == [
        {"type": "message", "success": True},
        {"type": "createFile", "path": "reminder.ts", "success": True, "bytesWritten": 309},
        {"type": "shell", "command": "bun run reminder.ts", "success": True, "exitCode": 0,
         "stdout": "Reminder created\n", "stderr": ""},
    ]  # fmt: skip
    assert (tmp_path / "ws" / "reminder.ts").read_text() == REMINDER


def test_example_3_pauses_then_resumes_as_the_spec_shows(tmp_path: Path) -> None:
    (tmp_path / "ws" / "temp").mkdir(parents=True)
    (tmp_path / "ws" / "temp" / "junk").write_text("x")
    first = runtime(tmp_path, "standard").receive(EXAMPLE_3).to_dict()
    assert first["status"] == "awaiting_approval"
    message, asked = untimed(first["events"])
    assert message == {"type": "message", "success": True}
    assert asked["type"] == "approvalRequired" and asked["operationId"] == "cleanup-1"
    assert asked["operationType"] == "shell" and asked["details"]["command"] == "rm -rf temp/*"
    assert asked["details"]["policy"] and asked["reason"]
    again = Runtime.open(tmp_path / "runs" / "run_abc123")
    resumed = again.receive({"approval": {"operationId": "cleanup-1", "decision": "approved"}})
    assert resumed.to_dict()["status"] == "completed"
    assert untimed(list(resumed.events)) == [
        {"type": "shell", "operationId": "cleanup-1", "command": "rm -rf temp/*",
         "success": True, "exitCode": 0, "stdout": "", "stderr": ""},
    ]  # fmt: skip
    assert not (tmp_path / "ws" / "temp" / "junk").exists()


def test_partial_failure_goes_on_as_the_spec_shows(tmp_path: Path) -> None:
    reply = runtime(tmp_path).receive(ops(
        {"type": "createFile", "path": "a.ts", "content": "..."},
        {"type": "readFile", "path": "nonexistent.txt"},
        {"type": "shell", "command": "echo hello"},
    ))  # fmt: skip
    shown = [  # the spec's events, which leave some fields out
        {"type": "createFile", "path": "a.ts", "success": True},
        {
            "type": "readFile",
            "path": "nonexistent.txt",
            "success": False,
            "error": "File not found",
        },
        {"type": "shell", "command": "echo hello", "success": True, "stdout": "hello\n"},
    ]
    for want, got in zip(shown, reply.events, strict=True):
        assert got == {**got, **want}


def test_the_reference_events_come_back_as_shown(tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "config.json").write_text('{"key": "value"}')
    clock = iter([FIXED] * 10)
    reply = runtime(tmp_path, clock=lambda: next(clock)).receive(
        ops(REFERENCE_OPS[1], REFERENCE_OPS[2])
    )
    assert list(reply.events) == [
        {"type": "createFile", "operationId": "file-1", "timestamp": "2025-01-15T10:30:00.000Z",
         "path": "src/utils.ts", "success": True, "bytesWritten": 31},
        {"type": "readFile", "operationId": "read-1", "timestamp": "2025-01-15T10:30:00.000Z",
         "path": "config.json", "success": True, "content": '{"key": "value"}',
         "encoding": "utf-8", "size": 16},
    ]  # fmt: skip


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
FIELDS = ["type", "id", "path", "content", "encoding", "overwrite", "edits", "command", "cwd",
          "timeout", "env"]  # fmt: skip
TYPES = ["message", "createFile", "readFile", "editFile", "deleteFile", "shell", "userMessage"]
loose_operation = (
    st.dictionaries(st.sampled_from(FIELDS), st.sampled_from(TYPES) | json_values, max_size=6)
    | json_values
)
anything = (
    json_values
    | st.builds(lambda o: ops(*o), st.lists(loose_operation, max_size=5))
    | st.builds(lambda a: {"approval": a}, json_values)
)


# No example database: a test leaves no folder behind (.hypothesis/ in the checkout).
FUZZ = settings(
    database=None, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@settings(FUZZ, max_examples=150)
@given(value=anything)
def test_any_json_value_gets_an_events_message(scratch: Path, value: Any) -> None:
    rt = runtime(scratch, policy=NoShell())
    reply = rt.receive(value).to_dict()
    assert reply["status"] in ("completed", "awaiting_approval", "error")
    json.dumps(reply)  # what goes back is JSON
    text = rt.receive_text(json.dumps(value)[:-1] or "{").to_dict()  # and what is not JSON
    assert text["status"] in ("completed", "awaiting_approval", "error")


safe_path = st.text(alphabet="abc/._", min_size=1, max_size=12)
valid_operation = st.one_of(
    st.builds(lambda c: {"type": "message", "content": c}, st.text(max_size=20)),
    st.builds(lambda p, c, o: {"type": "createFile", "path": p, "content": c, "overwrite": o},
              safe_path, st.text(max_size=20), st.booleans()),
    st.builds(lambda p: {"type": "readFile", "path": p}, safe_path),
    st.builds(lambda p, a, b: {"type": "editFile", "path": p,
                               "edits": [{"oldContent": a, "newContent": b}]},
              safe_path, st.text(max_size=5), st.text(max_size=5)),
    st.builds(lambda p: {"type": "deleteFile", "path": p}, safe_path),
    st.builds(lambda c: {"type": "shell", "command": c}, st.sampled_from(["true", "exit 3"])),
)  # fmt: skip
identified = st.builds(lambda op, i: {**op, "id": f"op-{i}"} if isinstance(op, dict) else op,
                       valid_operation | loose_operation, st.integers(0, 9))  # fmt: skip


@settings(FUZZ, max_examples=60)
@given(operations=st.lists(identified, max_size=6))
def test_every_operation_yields_exactly_one_event_in_order(
    scratch: Path, operations: list[Any]
) -> None:
    reply = runtime(scratch, policy=Permit()).receive(ops(*operations))
    assert reply.status.value == "completed"
    assert len(reply.events) == len(operations)
    for op, event in zip(operations, reply.events, strict=True):
        assert event["type"] in (op.get("type") if isinstance(op, dict) else None, "error")
        if isinstance(op, dict) and isinstance(op.get("id"), str):
            assert event["operationId"] == op["id"]
