"""What a program sends to start or resume a task (an API body, an MCP tool call's arguments),
read into the one door's `StartRequest` with the same one-line errors for both, and the JSON
Schema of those arguments, built from the loop's typed options (runagent.config.overrides)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runagent.config.overrides import OPTIONS, LoopOverrides, body_schema
from runagent.errors import ForbiddenError, UsageError, shown
from runagent.executors.local import Started
from runagent.loop.context import validate_prompt
from runagent.service import Command, IssueStart, StartRequest
from runagent.store.race import RaceSpec
from runagent.store.runfolder import TaskPaths, within
from runagent.store.steering import Message
from runagent.store.tokens import Grant, Scope

PLACE: dict[str, dict[str, Any]] = {
    "after": {
        "type": ["array", "string"], "items": {"type": "string"},
        "description": "Start only once these tasks (PROJECT/TASK) have completed; until then "
        "it is blocked.",
    },
    "priority": {"type": "integer", "description": "Its place in the queue under limits: "
                 "higher goes first (default 0)."},
    "again": {"type": "boolean", "description": "Run a completed task again."},
}  # fmt: skip
ISSUE: dict[str, Any] = {
    "type": "object",
    "description": "An issue run: the issue's number and its repository's folder on this "
    "machine; the prompt is the issue's text unless body is given.",
    "properties": {"number": {"type": "integer", "minimum": 1}, "repo": {"type": "string"},
                   "url": {"type": "string"}, "body": {"type": "string"}},
    "required": ["number", "repo"],
    "additionalProperties": False,
}  # fmt: skip
RACE: dict[str, dict[str, Any]] = {
    "race": {
        "type": ["integer", "string"], "examples": [3],
        "description": "Race this many loops of the agent on the task (2 or more), each in a git "
        "worktree of its own: the first whose check passes wins, the others are stopped.",
    },
    "agents": {
        "type": ["array", "string"], "items": {"type": "string"}, "examples": [["claude", "codex"]],
        "description": "Race one loop of each of these agents on the task (as race).",
    },
}  # fmt: skip
START: dict[str, Any] = {
    "task_id": {"type": "string", "description": "The task's id (default: a new one)."},
    "prompt": {"type": "string", "description": "What the agent should do."},
}


def start_schema() -> dict[str, dict[str, Any]]:
    """The properties a start takes: the task, the prompt, the loop options, its place."""
    return {**START, **body_schema(), **PLACE, **RACE, "issue": ISSUE}


STEER: dict[str, dict[str, Any]] = {
    "message": {
        "type": "string", "description": "A person's words for the task's next attempt: a "
        "running task's next attempt gets them (it is not restarted), a stopped one starts with "
        "them.",
    },
    "now": {"type": "boolean", "description": "With message, on a running task: end its current "
            "attempt and start the next with the message (no failure counted)."},
}  # fmt: skip


def resume_schema() -> dict[str, dict[str, Any]]:
    return {**body_schema(), **PLACE, **RACE, **STEER}


def start_request(
    body: dict[str, Any], task: TaskPaths, workdir: Path, grant: Grant,
    workspaces: tuple[Path, ...] = (),
) -> StartRequest:  # fmt: skip
    """A start from `body` (its keys: `start_schema()`'s); unknown keys are refused, so a typo
    never starts a run without what it meant to say. A grant below admin (an operate token)
    starts tasks only in `workspaces`: its `cwd` and an issue's repository lie in one; and
    never with less sandbox than the config sets (the door's `owner` is admin alone)."""
    refuse_unknown(body, start_schema())
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise UsageError("prompt is required: say what the agent should do")
    validate_prompt(prompt, "the prompt")
    confined = workspaces if grant.scope < Scope.ADMIN else None
    found = issue(body.get("issue"))
    if found is not None and confined is not None:
        inside(folder_of(workdir, found.repo, "issue.repo"), confined, "issue.repo")
    return StartRequest(
        task, prompt, overrides=overrides(body, workdir, confined),
        again=body.get("again") is True, issue=found, owner=grant.scope >= Scope.ADMIN,
        race=race(body), **place(body, grant),
    )  # fmt: skip


def resume_request(
    body: dict[str, Any], task: TaskPaths, workdir: Path, grant: Grant,
    workspaces: tuple[Path, ...] = (), sender: str = "API",
) -> StartRequest:  # fmt: skip
    """A resume from `body` (its keys: `resume_schema()`'s), with a person's `message` for the
    next attempt when it has one (`sender` names the face it came through)."""
    refuse_unknown(body, resume_schema())
    confined = workspaces if grant.scope < Scope.ADMIN else None
    message, now = body.get("message"), body.get("now", False)
    if message is not None and not isinstance(message, str):
        raise UsageError(f"message {shown(message)} is not text; say what the next attempt "
                         "should know")  # fmt: skip
    if not isinstance(now, bool):
        raise UsageError(f"now {shown(now)} is not true or false")
    return StartRequest(
        task, command=Command.RESUME, overrides=overrides(body, workdir, confined),
        again=body.get("again") is True, owner=grant.scope >= Scope.ADMIN, race=race(body),
        message=message, now=now, sender=sender, **place(body, grant),
    )  # fmt: skip


def steered(request: StartRequest, message: Message) -> dict[str, Any]:
    """What a resume answers that kept a message for a running task's next attempt."""
    return {"project_id": request.task.project_id, "task_id": request.task.task_id,
            "steered": True, "message": message.to_dict()}  # fmt: skip


def refuse_unknown(body: dict[str, Any], known: dict[str, Any], what: str = "a start") -> None:
    for name in body:
        if name not in known:
            raise UsageError(
                f"{name[:80]!r} is not something {what} takes; one of: {', '.join(sorted(known))}"
            )


def overrides(
    body: dict[str, Any], workdir: Path, workspaces: tuple[Path, ...] | None = None
) -> LoopOverrides:
    """The loop settings the body changes (the form's empty fields change nothing); a working
    folder that is not one is refused here, before any task is created."""
    keys = {option.body_key: name for name, option in OPTIONS.items() if option.body_key}
    values = {keys.get(k, k): v for k, v in body.items()}
    named = {name: key for key, name in keys.items()}
    given = LoopOverrides.parse(
        values, where=lambda name: named.get(name, name), blank_is_unset=True
    )
    if given.working_dir is not None:
        folder = folder_of(workdir, given.working_dir, "cwd")
        if workspaces is not None:
            inside(folder, workspaces, "cwd")
    return given


def folder_of(workdir: Path, given: Path, name: str) -> Path:
    """The folder `given` names (relative to `workdir`, `~` expanded), if it is one here."""
    try:
        folder = (workdir / given.expanduser()).resolve()
        if folder.is_dir():
            return folder
    except (OSError, RuntimeError, ValueError):  # no such user, a name too long, a loop
        pass
    raise UsageError(f"{name} {shown(str(given))} is not a folder on this machine")


def inside(folder: Path, workspaces: tuple[Path, ...], name: str) -> None:
    """A ForbiddenError unless `folder` lies in one of `workspaces` (a token's starts)."""
    if not any(within(w, folder) for w in workspaces):
        shown_ = ", ".join(str(w) for w in workspaces)
        raise ForbiddenError(
            f"{name} {shown(str(folder))} is outside the folders a token's tasks may work in "
            f"({shown_}); add it to server.ops_workspaces, or start it with the api_key"
        )


def place(body: dict[str, Any], grant: Grant) -> dict[str, Any]:
    """`after` (a list of P/T, of projects the grant reaches) and `priority` (a whole number)."""
    after = body.get("after") or []
    if isinstance(after, str):
        after = [a for a in after.replace(",", " ").split() if a]
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise UsageError(f"after {shown(after)} is not a list of PROJECT/TASK names")
    grant.reach(*(a.partition("/")[0] for a in after if "/" in a))
    priority = body.get("priority") or 0
    digits = priority.strip().removeprefix("-") if isinstance(priority, str) else ""
    if digits.isascii() and digits.isdigit() and len(digits) <= 9:
        priority = int(priority)
    if isinstance(priority, bool) or not isinstance(priority, int) or abs(priority) >= 10**9:
        raise UsageError(f"priority {shown(priority)} is not a whole number")
    return {"after": tuple(after), "priority": priority}


def race(body: dict[str, Any]) -> RaceSpec | None:
    """`race` (a number of loops) or `agents` (a list, or names separated by commas); a form's
    empty fields are none."""
    return RaceSpec.parse(body.get("race"), body.get("agents"), ("race", "agents"))


def issue(given: object) -> IssueStart | None:
    """`issue`: `{"number", "repo", "url"?, "body"?}` (the prompt is the body unless one is
    given); None when it names none."""
    if given is None or given == {}:
        return None
    if not isinstance(given, dict):
        raise UsageError(f"issue {shown(given)} is not an object: give number and repo")
    from runagent.issues.issue import issue_number

    number = issue_number(given.get("number"), "issue.number")
    repo, url, text = given.get("repo"), given.get("url") or "", given.get("body") or ""
    if not isinstance(repo, str) or not repo.strip():
        raise UsageError(f"issue.repo {shown(repo)} is not a folder: name the issue's repository")
    if not isinstance(url, str) or not isinstance(text, str):
        raise UsageError("issue.url and issue.body are strings")
    try:
        folder = Path(repo).expanduser()
    except RuntimeError:  # ~user of no user
        raise UsageError(f"issue.repo {shown(repo)} is not a folder on this machine") from None
    return IssueStart(number, folder, text, url)


def json_type(value: object) -> str:
    """What JSON calls the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def started(request: StartRequest, started: Started) -> dict[str, Any]:
    """What a start answers: the task's ids, its supervisor and host, or where it waits."""
    queued = started.queued
    return {
        "project_id": request.task.project_id,
        "task_id": request.task.task_id,
        "supervisor_pid": started.pid or None,
        "host": started.holder.host if started.holder is not None else None,
        "queued": {"ahead": queued.ahead, "waits_for": queued.waits_for,
                   "blocked": queued.blocked} if queued is not None else None,
        **({"racers": [f"{request.task.project_id}/{r.task_id}" for r in
                       request.race.racers(request.task.task_id, None)]}
           if request.race is not None else {}),
    }  # fmt: skip
