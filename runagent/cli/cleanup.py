"""gc and delete: removing old runs of finished tasks, and whole tasks, from the runs root."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runagent import schedule
from runagent.cli.group import cli, fail
from runagent.cli.options import common, existing_task, service_for, setup
from runagent.cli.show import plural
from runagent.errors import ExitCode, UsageError
from runagent.loop.context import validate_id
from runagent.store import cleanup


def human(size: int) -> str:
    """`2.5 MiB`, `512 B`."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


@cli.command()
@click.option("--project", "-p", "project_id", help="Only this project's tasks.")
@click.option("--older-than", help="Remove runs that ended longer ago than this, e.g. 30d.")
@click.option("--keep-last", type=click.IntRange(min=0),
              help="Keep each task's last N runs whatever their age.")  # fmt: skip
@click.option("--keep-failed", is_flag=True, help="Keep runs that failed, timed out or were lost.")
@click.option("--dry-run", is_flag=True, help="List what would be removed, and remove nothing.")
@common
def gc(
    project_id: str | None, older_than: str | None, keep_last: int | None, keep_failed: bool,
    dry_run: bool, config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Remove old runs of tasks that are not running (never a running task's)."""
    s = setup(config_path, root)
    keep = cleanup.Retention.asked(
        older_than, keep_last, keep_failed, lambda name: "--" + name.replace("_", "-")
    )
    project = validate_id("project", project_id) if project_id else None
    planned = cleanup.gc_plan(s.root, keep, schedule.utc_now(), project)
    plan = planned.doomed
    total = sum(d.size for d in plan)
    for kept in planned.kept:
        click.echo(f"run-agent: keeping {kept.label}: {kept.why}", err=True)
    for doomed in plan:
        click.echo(f"{'would remove' if dry_run else 'removing'} {doomed.label} "
                   f"({human(doomed.size)})")  # fmt: skip
    if dry_run:
        click.echo(f"run-agent: {plural(len(plan), 'run')}, {human(total)}, would be removed",
                   err=True)  # fmt: skip
        return
    freed = cleanup.carry_out(plan, s.root)
    click.echo(f"run-agent: removed {plural(len(plan), 'run')}, {human(freed)} freed", err=True)


@cli.command()
@click.option("--project", "-p", "project_id", required=True, help="Project id.")
@click.option("--task", "-t", "task_id", required=True, help="Task id.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask; needed when not in a terminal.")
@click.option("--force", is_flag=True,
              help="Delete even a run whose run-info.yaml cannot be read or whose process is "
              "alive (never a task whose loop holds it).")  # fmt: skip
@common
def delete(
    project_id: str, task_id: str, yes: bool, force: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Delete a task that is not running: its TASK.md, its runs, everything in its folder."""
    s, task = existing_task(config_path, root, project_id, task_id)
    what: list[str] = []  # said before the runs go, as they are counted then

    def confirm(doomed: cleanup.Doomed) -> None:
        what.append(
            f"task {doomed.label} ({human(doomed.size)}, {plural(len(task.run_ids()), 'run')})"
        )
        if yes:
            return
        if not sys.stdin.isatty():
            raise UsageError(f"deleting {what[0]} needs --yes when not asked in a terminal")
        try:
            agreed = click.confirm(f"Delete {what[0]}?")
        except click.Abort as exc:  # click's word for Ctrl-C and for the end of input
            click.echo("", err=True)
            if isinstance(exc.__context__, KeyboardInterrupt):  # stopped, as anywhere else
                fail(f"interrupted; {doomed.label} is not deleted", ExitCode.STOPPED)
            agreed = False
        if not agreed:
            fail(f"{doomed.label} is not deleted", ExitCode.FAILED)

    service_for(s).delete(task, force, confirm)
    click.echo(f"run-agent: deleted {what[0]}", err=True)


@cli.command()
@common
def reindex(config_path: Path | None, root: Path | None) -> None:
    """Build the runs root's index afresh from its run folders (what listings and /metrics read)."""
    import time

    from runagent.store import index, tasks

    s = setup(config_path, root)
    started = time.monotonic()
    counted, runs = index.rebuild(s.root, tasks.all_paths(s.root))
    click.echo(f"run-agent: indexed {plural(runs, 'run')} of {plural(counted, 'task')} under "
               f"{s.root} in {time.monotonic() - started:.1f} s", err=True)  # fmt: skip
