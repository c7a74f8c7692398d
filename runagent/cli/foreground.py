"""A task's loop run here, in the foreground of the command line: the door admits it and gives
it its turn (`Service.enter`); this module follows the loop, says what happens, and exits with
its code. Nothing of a start's admission is done here."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runagent.cli.console import Console
from runagent.cli.loopargs import LoopArgs
from runagent.cli.options import Setup
from runagent.errors import ExitCode
from runagent.loop import notify
from runagent.loop.context import QUEUED_SINCE, LoopRequest, parent_run_id
from runagent.loop.events import Event, Outcome
from runagent.loop.supervisor import Supervisor
from runagent.service import Admission, Service, StartRequest
from runagent.store import credentials

if TYPE_CHECKING:  # an issue run imports what it needs when one starts
    from runagent.fleet.queue import Turn
    from runagent.issues.issue import Issue
    from runagent.issues.worktree import Tree
    from runagent.store.runfolder import TaskPaths

OUTCOME_EXIT = {
    Outcome.COMPLETED: ExitCode.COMPLETED,
    Outcome.FAILED: ExitCode.FAILED,
    Outcome.TIMED_OUT: ExitCode.TIMED_OUT,
    Outcome.STOPPED: ExitCode.STOPPED,
    Outcome.MISSING_DEPENDENCY: ExitCode.MISSING_DEPENDENCY,
    Outcome.STUCK: ExitCode.STUCK,
    Outcome.BUDGET: ExitCode.BUDGET,
}

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

NOTIFY_DRAIN = notify.DRAIN  # seconds a finished loop waits for its notifications to go out


def executable_dir() -> Path:
    """The folder of the run-agent being run, so agents can start sub-runs by name."""
    script = Path(sys.argv[0])
    if script.name == "run-agent":
        return script.resolve().parent
    return Path(sys.executable).parent


def foreground_loop(
    s: Setup, service: Service, start: StartRequest, loop: LoopArgs, issue: Issue | None = None
) -> None:
    """Run the task's loop here until it ends, once the door let it in and gave it its turn
    (one line, even with --quiet, when it waits: the run is not lost); exit with its code."""
    task = start.task

    def tell(turn: Turn) -> None:
        click.echo(f"run-agent: {turn.words(task.label)}", err=True)

    with service.enter(start, tell) as admission:
        assert admission.agent is not None  # the command line's door checks its agent
        request = loop_request(s, task, admission, loop, issue)
        backend = admission.agent[1]
        console = Console(
            sys.stderr, request.settings.max_restarts + 1, loop.quiet, backend.summarize,
            echo=backend.talks_to_person, terminal_copy=backend.terminal_copy,
        )  # fmt: skip
        redactor = backend.redactor(request.base_env)
        notifier = notify.loop_notifier(s.config, loop.schedule, console.say, redactor)

        def on_event(event: Event) -> None:
            console.show(event)
            if notifier is not None:
                notifier.on_event(event, task, loop.schedule)

        supervisor = Supervisor(
            request, backend, on_event=on_event, redactor=redactor, pauser=admission.pauser
        )
        previous = {
            sig: signal.signal(sig, lambda *_: supervisor.request_stop()) for sig in STOP_SIGNALS
        }
        try:
            result = supervisor.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if "." in task.task_id:  # a racer's loop: its race stays watched whatever befell its watcher
        from runagent.race import ensure_watched

        ensure_watched(task)
    if notifier is not None and result.outcome is not Outcome.COMPLETED:
        service.tell_blocked(task, notifier=notifier)  # the tasks that ran after it need a person
    console.finish(result.message, result.outcome)
    if notifier is not None:
        notifier.drain(NOTIFY_DRAIN)
    sys.exit(int(OUTCOME_EXIT[result.outcome]))


def loop_request(
    s: Setup, task: TaskPaths, admission: Admission, loop: LoopArgs, issue: Issue | None
) -> LoopRequest:
    """What the supervisor runs: the admitted start, in the folder it works in, with what it is
    remembered as having been started with (a job's single run and --no-stuck are not)."""
    assert admission.agent is not None
    agent = admission.agent[0]
    overrides = admission.overrides
    settings = overrides.apply(agent.loop_defaults(s.config.defaults))
    if issue is not None:  # made (or found) once the loop holds the task
        overrides = replace(overrides, working_dir=task.worktree)
    working_dir = (overrides.working_dir or Path.cwd()).resolve()
    started_with = replace(overrides, agent=agent.name, working_dir=working_dir)
    tree: Tree | None = None
    if issue is not None:
        from runagent.issues.worktree import Tree

        tree = Tree(issue.repo, None, issue.setup)
    elif settings.worktree:  # the agent works in the task's worktree, at the folder's place
        from runagent.issues import worktree

        tree = worktree.Tree(working_dir, overrides.base or "HEAD", s.config.issues.setup)
        working_dir = worktree.work_folder(task, working_dir, os.environ)
    if loop.one_run:  # a job's single run is not how the task's loop is to be resumed
        started_with = replace(started_with, max_restarts=admission.remembered.max_restarts)
    if loop.no_stuck:  # for this loop only
        started_with = replace(started_with, stuck_after=admission.remembered.stuck_after)
    # Started by the queue's keeper or a cluster's host agent after it waited: since when. For
    # its first run's record, not for anything this process starts.
    queued_since = os.environ.pop(QUEUED_SINCE, None)
    return LoopRequest(
        task=task,
        prompt=admission.prompt,
        agent_name=agent.name,
        working_dir=working_dir,
        settings=settings,
        base_env=credentials.scrub(os.environ, s.config.server.api_key_env),
        parent_run_id=parent_run_id(os.environ),
        executable_dir=executable_dir(),
        started_with={**started_with.to_record(), **s.config_record()},
        worktree=tree,
        issue=issue,
        budgets=s.config.budgets,
        queued_since=admission.waited or queued_since,
        control=s.control,
    )


def foreground_race(s: Setup, service: Service, start: StartRequest, loop: LoopArgs) -> None:
    """A race run here: the door starts its racers (detached loops, each in a worktree of its
    own) holding the race's task, and this process watches them to the end (runagent/race.py),
    saying who won or why none did; Ctrl-C (or `stop`) stops every racer. Exits with the race's
    code."""
    from runagent.race import Watcher

    task = start.task

    def say(line: str) -> None:
        if not loop.quiet:
            click.echo(f"run-agent: {line}", err=True)

    with service.begin_race(start) as record:
        default = s.config.defaults.agent or "the default agent"
        racers = ", ".join(
            f"{task.project_id}/{r.task_id} ({r.agent or default})" for r in record.racers
        )
        say(f"race {task.label}: {len(record.racers)} racers started: {racers}")
        watcher = Watcher(service, task, say)
        previous = {sig: signal.signal(sig, lambda *_: watcher.request_stop())
                    for sig in STOP_SIGNALS}  # fmt: skip
        try:
            finished = watcher.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    click.echo(f"run-agent: {finished.message}", err=True)
    sys.exit(int(finished.code))
