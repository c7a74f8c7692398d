"""paste: hand a chat window's reply to a paste run, and show the outbox to paste into it."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runagent.cli.group import cli
from runagent.cli.options import common, existing_task, setup, task_option
from runagent.errors import NotFoundError, UsageError
from runagent.store.runfolder import TaskPaths


@cli.group()
def paste() -> None:
    """The copy-paste channel of `--agent paste` runs (spec/copy-paste-protocol.md).

    Without --project/--task, the one task whose paste session waits for a reply is meant.
    """


@paste.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path))
@task_option(required=False)
@common
def reply(
    file: Path, project_id: str | None, task_id: str | None, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Send the chat's reply (FILE, or - for standard input) to a waiting paste run."""
    from runagent.paste import state

    text = _read(file)
    task = _task(config_path, root, project_id, task_id)
    saved = state.submit(task, text)
    click.echo(f"run-agent: reply for {task.label} saved as {saved}")


@paste.command()
@task_option(required=False)
@click.option("--path", "path_only", is_flag=True, help="Print the outbox's path, not its text.")
@common
def show(
    project_id: str | None, task_id: str | None, path_only: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Print the outbox to paste into the chat now (e.g. `run-agent paste show | pbcopy`)."""
    from runagent.paste import state

    task = _task(config_path, root, project_id, task_id)
    session = state.current(task)
    if session is None:
        raise NotFoundError(f"task {task.label} has no paste session")
    if session.is_complete:
        click.echo(f"run-agent: the paste session of {task.label} is complete: {session.summary}")
        return
    path = state.outbox_path(task, session)
    if path_only:
        click.echo(str(path))
        return
    try:
        sys.stdout.write(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NotFoundError(
            f"outbox {path} cannot be read ({exc.strerror}); is the paste run still going?"
        ) from exc


def _read(file: Path) -> str:
    from runagent.paste.inbox import MAX_REPLY

    limit = MAX_REPLY + 1  # one byte more than a reply may hold: submit says it is too long
    try:
        if str(file) == "-":
            data = sys.stdin.buffer.read(limit)
        else:
            with open(file, "rb") as f:
                data = f.read(limit)
    except OSError as exc:
        raise UsageError(f"reply file {str(file)!r} cannot be read ({exc.strerror})") from exc
    return data.decode("utf-8", errors="replace")


def _task(
    config_path: Path | None, root: Path | None, project_id: str | None, task_id: str | None
) -> TaskPaths:
    from runagent.paste import state

    if project_id is not None and task_id is not None:
        return existing_task(config_path, root, project_id, task_id)[1]
    if project_id is not None or task_id is not None:
        raise UsageError("give both --project and --task, or neither for the waiting paste run")
    s = setup(config_path, root)
    waiting = state.waiting_tasks(s.root)
    if not waiting:
        raise NotFoundError(
            f"no paste run waits for a reply under {s.root} (the runs root from {s.root_from}); "
            "start one with --agent paste, or name it with -p/-t"
        )
    if len(waiting) > 1:
        names = ", ".join(t.label for t in waiting)
        raise UsageError(f"several paste runs wait for a reply ({names}); name one with -p/-t")
    return waiting[0]
