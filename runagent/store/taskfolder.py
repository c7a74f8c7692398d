"""What a task's folder holds besides its runs: the prompt it was given (and the one rule for a
different one), how it was last started, what its runs used, and an issue run's record."""

from __future__ import annotations

import errno
import json
from collections.abc import Mapping
from pathlib import Path

from runagent.errors import PromptConflictError
from runagent.store import credentials, runfolder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Usage


def write_task_prompt(task: TaskPaths, prompt: str) -> None:
    """Write TASK.md once; an existing one is never overwritten."""
    runfolder.make_task_folder(task)
    try:
        with open(task.task_md, "x", encoding="utf-8", opener=runfolder.private) as f:
            f.write(prompt)
    except FileExistsError:
        pass


def read_task_usage(task: TaskPaths) -> Usage | None:
    """What the task's runs used, as summed at each run's end; None if none said."""
    try:
        data = json.loads(runfolder.read_text_in(task.fence, task.folder / runfolder.TASK_USAGE))
        return Usage(int(data["tokens_in"]), int(data["tokens_out"]), data.get("cost_usd"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def add_task_usage(task: TaskPaths, used: Usage) -> None:
    """Add a run's usage to the task's sum (the supervisor holds the task lock meanwhile)."""
    total = read_task_usage(task)
    total = used if total is None else total + used
    runfolder.atomic_write(task.folder / runfolder.TASK_USAGE, json.dumps(total.to_dict()))


def write_task_settings(task: TaskPaths, settings: Mapping[str, object]) -> None:
    """Remember how the task was started (replacing what an earlier start remembered)."""
    text = runfolder.dump_yaml(dict(settings), sort_keys=False, allow_unicode=True)
    runfolder.atomic_write(task.folder / runfolder.TASK_SETTINGS, text)


def read_task_settings(task: TaskPaths) -> dict[str, object]:
    """How the task was last started; {} when it never was (or the file is unreadable)."""
    try:
        path = runfolder.confine(task).folder / runfolder.TASK_SETTINGS
        data = runfolder.load_yaml(runfolder.read_text_in(task.fence, path))
    except (OSError, ValueError):  # not YAML (YAMLSyntaxError), not UTF-8
        return {}
    return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}


CONFIG_KEY = "config"  # in task.yaml: the config file the task's loop last started with


def recorded_config(task: TaskPaths) -> Path | None:
    """The config file the task's loop last started with, as its record says (None: unsaid)."""
    value = read_task_settings(task).get(CONFIG_KEY)
    return Path(value) if isinstance(value, str) and value.startswith("/") else None


def write_worktree_record(task: TaskPaths, record: Mapping[str, object]) -> None:
    """Write down a task's worktree: its repository, branch and base, and for an issue run the
    issue (issue.yaml; a worktree run's is worktree.yaml). A URL in it (the issue's, a remote
    pushed to) is written without its credentials."""
    task = runfolder.confine(task)
    path = task.issue_record if record.get("issue") else task.worktree_record
    text = runfolder.dump_yaml(dict(record), sort_keys=False, allow_unicode=True)
    text = credentials.scrub_urls(text)
    runfolder.atomic_write(path, text)


def read_worktree_record(task: TaskPaths) -> dict[str, object]:
    """The record of a task's worktree (an issue run's, else a worktree run's); {} for a task
    that has none (or an unreadable record)."""
    task = runfolder.confine(task)
    for path in (task.issue_record, task.worktree_record):
        try:
            data = runfolder.load_yaml(runfolder.read_text_in(task.fence, path))
        except FileNotFoundError:
            continue
        except (OSError, ValueError):  # not YAML (YAMLSyntaxError), not UTF-8
            return {}
        return {str(k): v for k, v in data.items()} if isinstance(data, dict) else {}
    return {}


def check_task_prompt(task: TaskPaths, prompt: str, hint: str) -> None:
    """The one rule for a task's prompt: a task that exists with another prompt in its TASK.md
    is never run with this one (PromptConflictError, ending with `hint`, what to do instead)."""
    existing = read_task_prompt(task)
    if existing is not None and existing != prompt:
        raise PromptConflictError(
            f"task {task.label} exists with another prompt in {task.task_md}; {hint}"
        )


def claim_task_prompt(task: TaskPaths, prompt: str, hint: str) -> None:
    """`check_task_prompt`, then TASK.md written with `prompt` if the task has none yet."""
    check_task_prompt(task, prompt, hint)
    write_task_prompt(task, prompt)


def discard_new_task(task: TaskPaths) -> None:
    """Undo the creation of a task whose start was refused: its TASK.md, supervisor.log and
    lock go, and its folder if that leaves it empty. A task with runs is never touched."""
    if task.runs.exists():
        return
    for path in (task.task_md, runfolder.supervisor_log_path(task), task.lock):
        path.unlink(missing_ok=True)
    try:
        task.folder.rmdir()
    except OSError:  # something else is in it: leave it
        pass


def read_task_prompt(task: TaskPaths) -> str | None:
    try:
        return runfolder.read_text_in(task.fence, runfolder.confine(task).task_md)
    except FileNotFoundError:
        return None
    except OSError as exc:  # a link swapped in since it was confined
        if exc.errno != errno.EXDEV:
            raise
        where = f"out of its project's folder {task.root / task.project_id}"
        raise runfolder.leads_out(task.task_md, where) from None
