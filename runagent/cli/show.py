"""list, status and output: what the runs root holds, read by the CLI."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import click

from runagent import listing
from runagent.cli.group import cli
from runagent.cli.options import common, existing_task, json_option, setup, task_option
from runagent.errors import NotFoundError, UsageError, spelled
from runagent.store import runfolder, taskfolder, tasks
from runagent.store.ids import validate_id
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunInfo, RunStatus, Usage
from runagent.store.tasks import RacerView, RaceView


def json_rows(rows: list[dict[str, Any]]) -> str:
    """A JSON array of `rows`, one a line: json's C encoder writes each (an indented listing is
    written by its Python one, a third of `list --json` of a thousand tasks)."""
    return json_array([json.dumps(row) for row in rows])


def json_array(texts: list[str]) -> str:
    """A JSON array of rows already written as JSON text, one a line."""
    return "[\n" + ",\n".join(texts) + "\n]" if texts else "[]"


def print_table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@cli.command(name="list")
@click.option("--project", "-p", "project_id", help="Only this project's tasks.")
@click.option("--task", "-t", "task_id", help="This task's runs (with --project).")
@json_option
@common
def list_(
    project_id: str | None, task_id: str | None, as_json: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """List tasks (all, or one project's), or one task's runs."""
    s = setup(config_path, root)
    if task_id is not None:
        if project_id is None:
            raise UsageError("--task needs --project")
        task = tasks.find_task(
            s.root, validate_id("project", project_id), validate_id("task", task_id)
        )
        found = tasks.runs(task)
        if as_json:
            click.echo(json_rows([r.to_dict() for r in found]))
            return
        rows = [
            [
                r.run_id,
                _str(r.attempt or None),  # 0: an unreadable run's, not known
                r.status.value,
                _str(r.exit_code),
                (r.message if r.status is RunStatus.UNREADABLE else r.reason) or "",
                r.start_time,
            ]
            for r in found
        ]
        print_table(rows, ["RUN", "ATTEMPT", "STATUS", "EXIT", "REASON", "STARTED"])
        return
    if project_id is not None:
        validate_id("project", project_id)
        if not (s.root / project_id).is_dir():
            raise NotFoundError(f"project {project_id!r} not found {s.where()}")
    if as_json:
        click.echo(json_array(list(listing.rows(s.root, project_id).values())))
        return
    views = listing.in_order(listing.all_tasks(s.root, project_id))
    if not views:
        click.echo(f"no tasks {s.where()}", err=True)
        return
    racers = {r.view.label for v in views if v.race is not None for r in v.race.racers}
    rows = []
    for v in views:
        if v.label in racers:  # listed under its race
            continue
        rows.append([v.paths.project_id, v.paths.task_id, v.status_words, str(v.run_count),
                     v.latest.run_id if v.latest else "", race_cell(v.race)])  # fmt: skip
        for r in v.race.racers if v.race is not None else ():  # side by side, under it
            racer = r.view
            rows.append([racer.paths.project_id, f"  {racer.paths.task_id}",
                         "won" if r.won else racer.status.value, str(racer.run_count),
                         racer.latest.run_id if racer.latest else "", _racer_cell(r)])  # fmt: skip
    header = ["PROJECT", "TASK", "STATUS", "RUNS", "LATEST RUN", "RACE"]
    if not racers:  # no race: no column for one
        rows, header = [row[:-1] for row in rows], header[:-1]
    print_table(rows, header)
    for project, used in sorted(tasks.project_usage(views).items()):
        click.echo(f"{project}: {describe_usage(used)}")


def race_cell(race: RaceView | None) -> str:
    """A race's cell in `list`: its racers, and its winner or how it ended."""
    if race is None:
        return ""
    record = race.record
    said = f"won by {record.winner}" if record.winner else record.outcome or "racing"
    return f"{plural(len(race.racers), 'racer')}, {said}"


def _racer_cell(racer: RacerView) -> str:
    """A racer's cell in `list`: its agent, attempt, spend, last check, and why it is out."""
    cells = racer_cells(racer)
    parts = [cells[1], f"attempt {cells[3]}" if cells[3] else "", cells[4],
             f"check {cells[5]}" if cells[5] else "", racer.reason or ""]  # fmt: skip
    return " · ".join(part for part in parts if part)


def describe_usage(used: Usage) -> str:
    """`20 tokens in, 10 out, $0.0003`."""
    cost = f", ${used.cost_usd:.4f}" if used.cost_usd is not None else ""
    return f"{used.tokens_in} tokens in, {used.tokens_out} out{cost}"


def _left_queue(task: TaskPaths) -> str:
    """When a task that never ran was taken out of the queue, in words."""
    try:
        data = runfolder.load_yaml(runfolder.read_text_in(task.fence, task.left_queue))
    except (OSError, ValueError):
        return "stopped before it started"
    at = data.get("at") if isinstance(data, dict) else None
    return f"{at}: stopped before it started" if at else "stopped before it started"


def _str(value: object) -> str:
    return "" if value is None else str(value)


@cli.command()
@task_option(required=True)
@json_option
@common
def status(
    project_id: str, task_id: str, as_json: bool, config_path: Path | None, root: Path | None
) -> None:
    """Show a task's status and its latest run."""
    _, task = existing_task(config_path, root, project_id, task_id)
    places = listing.places(task.root)  # read once for its place and its waiters
    view = tasks.view(task, places)
    used = tasks.usage(task)
    if as_json:
        from runagent.issues import worktree  # git is read only for a task that has git work

        git_work = worktree.progress(task, view.latest, os.environ)
        extra = {"git": git_work} if git_work is not None else {}
        usage = {"usage": used.to_dict() if used else None}
        waited = {"waited_on_by": tasks.waited_on_by(task, places)}
        click.echo(json.dumps({**view.to_dict(), **usage, **waited, **extra}, indent=2))
        return
    runs = plural(view.run_count, "run")
    rows: list[tuple[str, object]] = [
        ("task", f"{view.label}: {view.status.value} ({runs})"),
        ("folder", task.folder),
    ]
    if view.queue is not None:
        rows.append(("waits", view.status_words.partition(": ")[2] or view.queue.waits_for))
    elif view.run_count == 0 and view.status is tasks.TaskStatus.STOPPED:
        rows.append(("left the queue", _left_queue(task)))
    waited_on_by = tasks.waited_on_by(task, places)
    if waited_on_by:
        rows.append(("waited on by", ", ".join(waited_on_by)))
    if used is not None:
        rows.append(("usage", describe_usage(used)))
    started = taskfolder.read_task_settings(task)
    if started:
        said = [f"{started_key(k)} {spelled(v)}" for k, v in started.items()]
        rows.append(("started with", ", ".join(said)))
    if view.supervisor:
        rows.append(("supervisor", f"{view.supervisor.describe()} since {view.supervisor.since}"))
    if view.latest:
        r = view.latest
        rows += [
            (
                "latest",
                f"{r.run_id}{f' attempt {r.attempt}' if r.attempt else ''}: {r.status.value}",
            ),
            ("agent", r.agent or None),
            ("started", r.start_time),
            (
                "queued",
                None
                if r.queued_seconds is None
                else f"{r.queued_seconds:g}s in the queue before its loop began",
            ),
            ("ended", r.end_time),
            ("exit code", r.exit_code),
            ("reason", r.message or r.reason),
            ("pid", r.pid),
        ]
    rows += _git_rows(task, view.latest)
    if view.race is not None:
        rows += _race_rows(view.race)
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        if value is not None:
            click.echo(f"{label:<{width}}  {value}")
    if view.race is not None:  # its racers side by side
        click.echo("")
        print_table([racer_cells(r) for r in view.race.racers], RACER_HEADER)


def started_key(name: str) -> str:
    """A key of task.yaml as a person gives it (the body's and the form's `cwd`, not the field
    `working_dir`)."""
    from runagent.config.overrides import OPTIONS

    option = OPTIONS.get(name)
    return (option.body_key or name) if option is not None else name


RACER_HEADER = ["RACER", "AGENT", "STATUS", "ATTEMPT", "SPEND", "CHECK", "REASON"]


def racer_cells(racer: RacerView) -> list[str]:
    """A racer's row: its task, agent, status, attempt, spend, last check, and why it is out."""
    used = racer.view.usage
    status = "won" if racer.won else racer.view.status.value
    why = f"{racer.reason}: {racer.message}" if racer.reason and racer.message else racer.reason
    return [racer.view.paths.task_id, racer.agent or "", status, _str(racer.attempt),
            spend_words(used) if used else "", _str(racer.last_check), why or ""]  # fmt: skip


def spend_words(used: Usage) -> str:
    """`1,200 tokens, $0.01`."""
    cost = f", ${used.cost_usd:.2f}" if used.cost_usd is not None else ""
    return f"{used.tokens:,} tokens{cost}"


def _race_rows(race: RaceView) -> list[tuple[str, object]]:
    """A race's own rows in `status`: its racers in short, how it stands, its shared budget."""
    record = race.record
    rows: list[tuple[str, object]] = [
        ("race", f"{plural(len(race.racers), 'racer')} since {record.started}"),
        ("winner", record.winner),
        ("ended", record.message),
    ]
    if record.budget:
        used = race.usage
        spent = f"{spend_words(used)} spent of " if used else ""
        rows.append(("budget", f"{spent}{' and '.join(record.budget)} over its racers"))
    return rows


def _git_rows(task: TaskPaths, latest: RunInfo | None) -> list[tuple[str, object]]:
    """An issue run's issue, branch, commits since base and ready marker, for `status`."""
    from runagent.issues import worktree

    work = worktree.progress(task, latest, os.environ)
    if work is None:
        return []
    rows: list[tuple[str, object]] = []
    issue = work["issue"]
    if isinstance(issue, dict):
        rows.append(("issue", f"#{issue['number']} {issue['url'] or ''}".rstrip()))
    commits = work["commits"]
    count = len(commits) if isinstance(commits, list) else 0
    rows += [
        ("branch", work["branch"]),
        ("worktree", work["worktree"]),
        ("commits", f"{plural(count, 'commit')} since {str(work['base_commit'])[:12]}"),
        ("ready marker", "seen" if work["marker_seen"] else "not yet"),
    ]
    return rows


def plural(count: int, noun: str) -> str:
    """`1 run`, `2 runs`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


@cli.command()
@task_option(required=True)
@click.option("--run", "run_id", help="Run id (default: the task's latest run).")
@click.option(
    "--file",
    "which",
    type=click.Choice(list(runfolder.RUN_FILES)),
    help="Which file: output.md (the final answer, written when a run ends), the agent's "
    "stdout or stderr, the prompt it was given, or what the task's check printed (check.txt). "
    "Default: output, or stdout while the run is live or with --follow.",
)
@click.option("--check", "check", is_flag=True, help="What the task's check printed: --file check.")
@click.option(
    "--follow", "-f", is_flag=True, help="Keep printing as the task writes, across restarts."
)
@json_option
@common
def output(
    project_id: str, task_id: str, run_id: str | None, which: str | None, check: bool,
    follow: bool, as_json: bool, config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Print a run's output, stdout, stderr, prompt or check."""
    if check and which not in (None, "check"):
        raise UsageError(f"--check and --file {which} contradict each other; give one")
    which = "check" if check else which
    from runagent.store import follow as following  # threads and watching: not for `list`

    if run_id is not None:
        validate_id("run", run_id)
    _, task = existing_task(config_path, root, project_id, task_id)
    run_id = run_id or _latest_run_id(task)
    folder = task.run_folder(run_id)
    found = runfolder.stat_in(task.fence, folder)  # none linked in from another project
    if found is None or not stat.S_ISDIR(found.st_mode):
        raise NotFoundError(f"run {run_id!r} of task {project_id}/{task_id} not found")
    live = following.loop_alive(task) and not following.run_over(task, run_id)
    which = which or ("stdout" if live or follow else "output")
    path = folder / runfolder.RUN_FILES[which]
    if as_json:  # its last JSON_LIMIT bytes at most: said by `offset` and `size`
        data, offset, size = _read_tail(path, task.fence, JSON_LIMIT)
        text = data.decode("utf-8", errors="replace")
        click.echo(json.dumps({"run_id": run_id, "file": which, "path": str(path),
                               "content": text, "offset": offset, "size": size}))  # fmt: skip
        return
    if not follow:
        if _copy_to_stdout(path, task.fence) == 0:
            click.echo(f"run-agent: {_why_empty(path, which, live)}", err=True)
        return
    wake = following.changes(task.folder)

    def announce(previous: str, run: str) -> None:
        click.echo(f"run-agent: --- run {previous} ended; next run {run} ---", err=True)

    for chunk in following.follow(task, run_id, runfolder.RUN_FILES[which], wake, announce):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def _why_empty(path: Path, which: str, live: bool) -> str:
    """One line saying why `output` printed nothing, so an empty answer is not a silent one."""
    if which == "output" and not path.exists():
        return "no output.md: the run ended without one; see --file stdout or stderr"
    if live:
        return f"the run is live and its {which} is still empty; --follow prints it as it comes"
    return f"{path.name} is empty"


def _latest_run_id(task: TaskPaths) -> str:
    ids = task.run_ids()
    if not ids:
        raise NotFoundError(f"task {task.project_id}/{task.task_id} has no runs yet")
    return ids[-1]


JSON_LIMIT = 8 << 20  # bytes of a run file `output --json` gives: its last ones


def _read_tail(path: Path, fence: str, limit: int) -> tuple[bytes, int, int]:
    """A run file's last `limit` bytes at most, where they start, and its size; nothing where
    it is not there, or is a link (runfolder.open_regular)."""
    try:
        with runfolder.open_regular(path, fence) as f:
            size = os.fstat(f.fileno()).st_size
            offset = max(0, size - limit)
            f.seek(offset)
            return f.read(limit), offset, size
    except OSError as exc:
        if exc.errno not in runfolder.NOT_THERE:
            raise
        return b"", 0, 0


def _copy_to_stdout(path: Path, fence: str) -> int:
    """Copy a run file to stdout (as `_read` reads it); how many bytes it had."""
    copied = 0
    try:
        with runfolder.open_regular(path, fence) as f:
            while chunk := f.read(1 << 16):
                sys.stdout.buffer.write(chunk)
                copied += len(chunk)
    except OSError as exc:
        if exc.errno not in runfolder.NOT_THERE:
            raise
    sys.stdout.buffer.flush()
    return copied
