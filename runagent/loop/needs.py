"""What a task waits for from a person, and the command that answers it: an operation held for
approval, the chat's reply to a copy-paste run's outbox, a look after its loop stopped on a
budget or stuck, or a task it runs after (`--after`) that failed or was stopped, which blocks it.
The notifiers tell it as it happens (`needs_input`); the fleet view lists it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runagent.record import record
from runagent.store import runfolder
from runagent.store.runfolder import RunPaths, TaskPaths

OVER_BUDGET = "over_budget"  # one word for a loop its budget stopped, wherever it is shown
STUCK = "stuck"


@record
class Need:
    """One task waiting for a person: what it waits for, the words for it, and the command that
    answers it."""

    label: str  # P/T
    waits_for: str  # approval, reply, over_budget, stuck, blocked
    episode: str  # which wait this is: a notifier tells each one once
    message: str
    answer: str
    on: str | None = None  # blocked: the task (P/T) it runs after that did not complete

    def to_dict(self) -> dict[str, Any]:
        project, _, task = self.label.partition("/")
        return {"project_id": project, "task_id": task, "waits_for": self.waits_for,
                "message": self.message, "answer": self.answer, "on": self.on}  # fmt: skip


def approval(task: TaskPaths, run_folder: Path) -> Need | None:
    """The operation of the run in `run_folder` held for a person's approval, if one is."""
    paths = RunPaths(run_folder)
    if not runfolder.is_file_in(paths.fence, paths.approval_pending):
        return None
    operation = _pending_operation(paths)
    run = run_folder.name
    return Need(task.label, "approval", f"{run}/{operation}",
                f"operation {operation} of run {run} awaits approval",
                f"run-agent ops approve {run} {operation} (or ops deny ...)")  # fmt: skip


def reply(task: TaskPaths) -> Need | None:
    """The chat's reply a copy-paste task waits for, if it waits for one (none handed in)."""
    if not (task.folder / "paste").is_dir():
        return None
    from runagent.paste import state  # only a copy-paste task pays for it

    view = state.view(task)
    if view is None or view["complete"] or not view["outbox"] or view["waiting_replies"]:
        return None
    return Need(task.label, "reply", str(view["outbox"]),
                f"the chat's reply to {view['outbox']} is awaited",
                f"run-agent paste reply FILE -p {task.project_id} -t {task.task_id} "
                f"(FILE: the chat's answer to {view['outbox_path']})")  # fmt: skip


def stopped(task: TaskPaths, why: str, message: str) -> Need:
    """A loop that stopped over its budget (`over_budget`) or stuck: a person looks, then
    resumes it (past a daily budget: once the day's budget is raised, or the next day)."""
    if why == OVER_BUDGET:
        from runagent.loop import budget

        said = message.removeprefix("budget: ")
        return Need(task.label, why, message, f"stopped by its budget: {said}",
                    budget.answer(task, said))  # fmt: skip
    return Need(task.label, why, message, message,
                f"run-agent resume -p {task.project_id} -t {task.task_id}")  # fmt: skip


def blocked(task: TaskPaths, on: str, words: str, *, gone: bool, episode: str = "") -> Need:
    """A task blocked because `on`, a task it runs after, failed or was stopped (`words` say
    how): a person resumes that one, then this one. One whose task was deleted is taken out of
    the queue and started again, without waiting for it."""
    me = f"-p {task.project_id} -t {task.task_id}"
    if gone:
        answer = f"run-agent stop {me}, then run-agent resume {me} (it no longer waits for {on})"
    else:
        project, _, name = on.partition("/")
        answer = f"run-agent resume -p {project} -t {name}, then run-agent resume {me}"
    return Need(task.label, "blocked", episode or words, f"waits for {words}", answer,
                on)  # fmt: skip


def _pending_operation(run: RunPaths) -> str:
    """The id of the operation a run's approval file holds; '?' when it cannot be read."""
    try:
        data = json.loads(runfolder.read_text_in(run.fence, run.approval_pending))
        return str(data.get("operationId") or "?")
    except (OSError, ValueError, AttributeError):
        return "?"
