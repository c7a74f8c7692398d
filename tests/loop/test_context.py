"""Run/project/task id rules, RunContext and the agent environment contract."""

from __future__ import annotations

import dataclasses
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runagent.errors import UsageError
from runagent.loop.context import (
    RunContext,
    RunIdClock,
    agent_environment,
    new_task_id,
    validate_id,
)
from runagent.store.runfolder import RunPaths, TaskPaths

RUN_ID = re.compile(r"\d{8}-\d{9}-\d+")


@pytest.mark.parametrize("good", ["p", "my-project", "task_001", "v1.2", "A" * 128, "a.b-c_d"])
def test_valid_ids_pass(good: str) -> None:
    assert validate_id("task", good) == good


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("", "empty"),
        ("a/b", "not allowed"),
        ("a b", "not allowed"),
        ("ü", "not allowed"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        (".hidden", "start with '.'"),
        ("-q", "'-q' may not start with '-'"),  # an option where the id's value should be
        ("x" * 129, "129 characters"),
    ],
)
def test_invalid_ids_are_refused_naming_the_value(bad: str, fragment: str) -> None:
    with pytest.raises(UsageError) as info:
        validate_id("project", bad)
    assert fragment in str(info.value)
    assert str(info.value).startswith("project id")


def test_run_ids_in_the_same_millisecond_never_collide_and_sort_in_order() -> None:
    clock = RunIdClock()
    moment = datetime(2026, 2, 5, 15, 4, 5, 123000, tzinfo=UTC)
    ids = [clock.next_id(moment) for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    assert all(RUN_ID.fullmatch(i) for i in ids)
    assert ids[0].startswith("20260205-150405123-")
    assert ids[1].startswith("20260205-150405124-")


def test_a_clock_going_backwards_still_gives_increasing_ids() -> None:
    clock = RunIdClock()
    later = clock.next_id(datetime(2026, 2, 5, 15, 4, 6, tzinfo=UTC))
    earlier = clock.next_id(datetime(2026, 2, 5, 15, 4, 5, tzinfo=UTC))
    assert earlier > later


def test_generated_task_ids_are_valid_and_distinct() -> None:
    ids = {new_task_id() for _ in range(50)}
    assert len(ids) == 50
    for task_id in ids:
        assert validate_id("task", task_id) == task_id


def test_run_context_is_frozen_and_answers_every_protocol_field_once() -> None:
    names = [f.name for f in dataclasses.fields(RunContext)]
    assert names == ["run_id", "task", "prompt", "working_dir", "paths", "environment", "session"]
    task = TaskPaths(Path("/runs"), "p", "t")
    ctx = RunContext("r", task, "x", Path("/w"), task.run("r"), {"A": "1"})
    protocol = {
        "run_id": "r",
        "project_id": "p",
        "task_id": "t",
        "prompt": "x",
        "working_dir": Path("/w"),
        "stdout_path": Path("/runs/p/t/runs/r/agent-stdout.txt"),
        "stderr_path": Path("/runs/p/t/runs/r/agent-stderr.txt"),
        "environment": {"A": "1"},
    }
    assert {name: getattr(ctx, name) for name in protocol} == protocol
    assert ctx.run_folder == Path("/runs/p/t/runs/r") and ctx.task_folder == Path("/runs/p/t")
    assert ctx.prompt_file == Path("/runs/p/t/runs/r/prompt.md")
    assert ctx.paths == RunPaths(Path("/runs/p/t/runs/r"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.run_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.environment["A"] = "2"  # type: ignore[index]


def test_agent_environment_contract_wins_over_inherited_values(tmp_path: Path) -> None:
    task = TaskPaths(tmp_path, "p", "t")
    env = agent_environment(
        base={"PATH": "/usr/bin:/bin", "JRUN_ID": "stale", "JRUN_PARENT_ID": "stale", "HOME": "/h"},
        agent_env={"TOKEN_NAME": "x", "JRUN_TASK_ID": "agent-may-not-override"},
        task=task,
        paths=task.run("r1"),
        run_id="r1",
        parent_run_id=None,
        executable_dir=Path("/opt/run-agent/bin"),
    )
    assert env["JRUN_ID"] == "r1" and env["JRUN_TASK_ID"] == "t"
    assert "JRUN_PARENT_ID" not in env  # no stale parent from the caller's environment
    assert env["PATH"] == "/opt/run-agent/bin:/usr/bin:/bin"
    assert env["HOME"] == "/h" and env["TOKEN_NAME"] == "x"
    assert env["JRUN_RUNS_DIR"] == str(tmp_path)
    assert env["TASK_FOLDER"] == str(tmp_path / "p" / "t")
    assert env["RUN_FOLDER"] == str(tmp_path / "p" / "t" / "runs" / "r1")
    assert env["JRUN_PROJECT_ID"] == "p"
