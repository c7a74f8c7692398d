"""One owner per fact: the run id's format, the chunk run files are read in, and what each error
is to the command line and to an HTTP client are each written once, where the core keeps them."""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import json
import pkgutil
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

import runagent
import server
from runagent import errors
from runagent.errors import ExitCode, RunAgentError, UsageError
from runagent.loop.context import RunIdClock, is_run_id
from runagent.store import follow
from server import app, tail
from tests.conftest import REPO


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


# The fleet's limits: LimitsSettings (runagent/config/settings.py) is the one module that knows
# their names. It converts them to and from the queue's records, reads them from config.yaml's
# keys with the config reader, and says them in words; every other module hands it whole.

LIMITS_OWNER = REPO / "runagent" / "config" / "settings.py"


def limit_words() -> set[str]:
    """The names only LimitsSettings has: `projects` and `agents` are also the names of other
    settings (a budget's projects, the config's agents), so a copy is known by the others,
    which a copy of the list names all of."""
    from runagent.config import settings

    mine = {f.name for f in dataclasses.fields(settings.LimitsSettings)}
    others = {
        f.name
        for cls in vars(settings).values()
        if isinstance(cls, type) and dataclasses.is_dataclass(cls)
        if cls is not settings.LimitsSettings
        for f in dataclasses.fields(cls)
    }
    assert len(mine - others) >= 2, mine - others
    return mine - others


def python_spellings(path: Path, words: set[str]) -> tuple[set[str], set[str]]:
    """The `words` a module's code names (as a name, an attribute, a keyword or a string; its
    docstrings and comments aside), and those it holds as strings of their own: a dict's key,
    a config key, a record's field."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }  # fmt: skip
    named: set[str] = set()
    strings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docstrings and node.value in words:
                strings.add(node.value)
        elif isinstance(node, ast.Attribute):
            named.add(node.attr)
        elif isinstance(node, ast.Name):
            named.add(node.id)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            named.add(node.arg)
    return (named & words) | strings, strings


def script_spellings(path: Path, words: set[str]) -> tuple[set[str], set[str]]:
    """The same for one of the page's scripts, its comments aside."""
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", path.read_text(encoding="utf-8"), flags=re.S)
    named = {word for word in words if re.search(rf"\b{word}\b", code)}
    strings = {word for word in words if re.search(rf"""["'`]{word}["'`]""", code)}
    return named, strings


def test_no_module_but_the_settings_spells_the_fleet_limits() -> None:
    """A module that names two of the limits (a copy of their list: a record's keys, a config's,
    a page's lines), or holds one as a string, is a second owner: a limit added to the settings
    would be missed there, silently. Reading one limit by its attribute is using it."""
    words = limit_words()
    modules = [*sorted((REPO / "runagent").rglob("*.py")), *sorted((REPO / "server").rglob("*.py")),
               *sorted((REPO / "backends").rglob("*.py"))]  # fmt: skip
    scripts = sorted((REPO / "server" / "static").glob("*.js"))
    assert LIMITS_OWNER in modules and scripts
    copies = {}
    for path in [*modules, *scripts]:
        if path == LIMITS_OWNER:
            continue
        spell = python_spellings if path.suffix == ".py" else script_spellings
        named, strings = spell(path, words)
        if len(named) >= 2 or strings:
            copies[str(path.relative_to(REPO))] = sorted(named | strings)
    assert not copies, f"only {LIMITS_OWNER.relative_to(REPO)} names the limits: {copies}"


# Renames that are not a record written whole, by file: how many, and why they are not.
NOT_A_RECORD = {
    "runagent/ops/workspace.py": 1,  # the agent's own files, written through its folder's fd
    "runagent/ops/approval.py": 1,  # a pending approval taken by renaming it (one taker wins)
    "runagent/paste/inbox.py": 1,  # a handled reply moved aside, never over another
    "runagent/loop/sandbox.py": 1,  # a commondir planted in a checkout's .git moved aside
    "runagent/issues/worktree.py": 1,  # a stale worktree's folder moved aside
    "runagent/issues/pruning.py": 1,  # likewise, when pruned
}


def renames(path: Path) -> list[int]:
    """The lines of `path` that rename a file into place: os.replace or os.rename, or a path's
    .replace(X) or .rename(X) with one argument that is not a string literal."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, owner = node.func.attr, node.func.value
        if name not in ("replace", "rename"):
            continue
        if isinstance(owner, ast.Name) and owner.id == "os":
            found.append(node.lineno)
        elif isinstance(owner, ast.Name) and owner.id == "dataclasses":
            continue  # a record's copy, not a file
        elif len(node.args) == 1 and not isinstance(node.args[0], ast.Constant):
            found.append(node.lineno)
    return found


def test_records_are_written_by_one_writer_with_fsync() -> None:
    """runfolder.atomic_write_bytes (a temporary file, fsync, rename) writes every record; no
    other module renames a file into place."""
    others = {}
    for path in sorted([*(REPO / "runagent").rglob("*.py"), *(REPO / "server").rglob("*.py")]):
        where = str(path.relative_to(REPO))
        if where == "runagent/store/runfolder.py":
            continue
        lines = renames(path)
        if len(lines) != NOT_A_RECORD.get(where, 0):
            others[where] = lines
    assert not others, f"files renamed into place outside runfolder.atomic_write_bytes: {others}"
    assert renames(REPO / "runagent" / "store" / "runfolder.py")  # the check sees the one there
