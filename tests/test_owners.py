"""One owner per fact: the run id's format, the chunk run files are read in, and what each error
is to the command line and to an HTTP client are each written once, where the core keeps them."""

from __future__ import annotations

import asyncio
import importlib
import json
import pkgutil
from datetime import UTC, datetime, timedelta

import pytest

import runagent
import server
from runagent import errors
from runagent.errors import ExitCode, RunAgentError, UsageError
from runagent.loop.context import RunIdClock, is_run_id
from runagent.store import follow
from server import app, tail


def test_every_id_the_clock_issues_is_a_run_id_and_nothing_else_is() -> None:
    clock = RunIdClock()
    moment = datetime(2031, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    issued = [clock.next_id(moment + timedelta(milliseconds=n)) for n in range(3)]
    issued.append(clock.next_id(moment))  # the same millisecond again: the next one is taken
    assert all(is_run_id(run_id) for run_id in issued), issued
    others = ["", "..", "20311231-235959999", "20311231-235959999-", "x20311231-235959999-1"]
    others += ["20311231-235959999-1/..", "20311231-2359599-1", "task-20311231-235959-ab"]
    for other in others:
        assert not is_run_id(other), other


def test_the_server_streams_run_files_in_the_cores_chunk() -> None:
    # The same object, not an equal number: the server names the core's constant.
    assert tail.CHUNK is follow.CHUNK


def error_classes() -> list[type[RunAgentError]]:
    """Every RunAgentError subclass of the core and the server, their modules all imported."""
    for package in (runagent, server):
        for found in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if found.name.endswith(".__main__"):
                continue  # importing it runs the command line
            try:
                importlib.import_module(found.name)
            except ModuleNotFoundError as exc:  # an optional extra (ray) is not installed
                assert exc.name and exc.name.split(".")[0] == "ray", exc
    seen: list[type[RunAgentError]] = []
    todo: list[type[RunAgentError]] = [RunAgentError]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(cls.__subclasses__())
    return seen


def test_every_error_class_has_an_exit_code_and_an_http_status() -> None:
    classes = error_classes()
    assert len(classes) > 10
    for cls in classes:
        assert isinstance(cls.exit_code, ExitCode), cls
        assert isinstance(cls.http_status, int) and 400 <= cls.http_status < 600, cls


def test_each_error_is_answered_with_the_status_it_carries() -> None:
    expected = {
        errors.PromptConflictError: 409,
        errors.DuplicateReplyError: 409,
        errors.AlreadyCompletedError: 409,
        errors.NotFoundError: 404,
        errors.OutsideRootError: 404,
        errors.UsageError: 400,
        errors.ConfigError: 400,
        errors.AlreadyRunningError: 409,
        errors.MissingDependencyError: 424,
        errors.RunAgentError: 500,
    }
    for cls, status in expected.items():
        assert cls.http_status == status, cls

    class Gone(UsageError):  # a subclass the server has never heard of keeps its own status
        http_status = 410

    for exc, status in [(Gone("gone"), 410), (errors.OutsideRootError("out"), 404)]:
        answer = asyncio.run(app._run_agent_error(None, exc))  # type: ignore[arg-type]
        assert answer.status_code == status
        assert json.loads(bytes(answer.body)) == {"error": str(exc)}


@pytest.mark.parametrize("name", ["RUN_ID", "ERROR_STATUS"])
def test_the_server_keeps_no_copy_of_a_core_fact(name: str) -> None:
    assert not hasattr(app, name)
