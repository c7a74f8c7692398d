"""watch: the tasks and their latest runs, redrawn in place as they change (what people run
`supervisorctl status` in a loop for), until Ctrl-C."""

from __future__ import annotations

import shutil
import signal
import sys
import threading
from pathlib import Path

import click

from runagent import listing
from runagent.cli.group import cli
from runagent.cli.options import Setup, common, setup
from runagent.errors import ExitCode
from runagent.loop.context import validate_id
from runagent.store import follow, runfolder

HOME_AND_CLEAR = "\x1b[H\x1b[2J"


def screen(s: Setup, project: str | None) -> list[str]:
    """The lines of one frame: a row per task with its latest run and why it ended."""
    views = listing.in_order(listing.all_tasks(s.root, project))
    if not views:
        return [f"no tasks {s.where()}"]
    rows = [["TASK", "STATUS", "RUNS", "LATEST RUN", "ENDED", "WHY"]]
    for v in views:
        latest = v.latest
        rows.append([
            v.label, v.status_words, str(v.run_count), latest.run_id if latest else "",
            (latest.end_time or "")[:19].replace("T", " ") if latest else "",
            (latest.message or "") if latest else "",
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


@cli.command()
@click.option("--project", "-p", "project_id", help="Only this project's tasks.")
@common
def watch(project_id: str | None, config_path: Path | None, root: Path | None) -> None:
    """Show the tasks and their latest runs, updating in place until Ctrl-C."""
    s = setup(config_path, root)
    project = validate_id("project", project_id) if project_id else None
    runfolder.make_folder(s.root)
    live = sys.stdout.isatty()
    previous: list[str] = []
    # Ctrl-C is the way to leave: it sets `stop`, which the watcher checks at every step, so
    # the command ends at once and cleanly (exit 0), whatever it was doing.
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    wakes = follow.changes(s.root, stop)  # also wakes every second: a run can be lost silently
    while not stop.is_set():
        lines = screen(s, project)
        if lines != previous:
            width = shutil.get_terminal_size((120, 40)).columns
            frame = "\n".join(line[:width] for line in lines)
            click.echo((HOME_AND_CLEAR if live else "") + frame + ("" if live else "\n"))
            previous = lines
        next(wakes, None)
    sys.exit(ExitCode.COMPLETED)
