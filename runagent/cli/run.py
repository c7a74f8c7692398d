"""run, job, resume, stop and check: a task's loop in the foreground, stopping one, and its check
run again by itself."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runagent.cli.foreground import foreground_loop
from runagent.cli.group import IMPLICIT_RUN, RunAgentGroup, cli
from runagent.cli.loopargs import IssueArgs, LoopArgs, issue_options, loop_options, one_run_options
from runagent.cli.options import (
    Setup,
    common,
    existing_task,
    prompt_options,
    service_for,
    setup,
    task_option,
)
from runagent.config import userfile
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import ExecutorType, Until
from runagent.errors import UsageError
from runagent.loop.context import (
    START_TICKET,
    new_task_id,
    validate_id,
    validate_prompt,
)
from runagent.service import ISSUE_ON_CLUSTER, Command, StartRequest
from runagent.store import taskfolder
from runagent.store.runfolder import TaskPaths

if TYPE_CHECKING:  # an issue run imports what it needs when one starts
    from runagent.issues.issue import Issue

STOP_WAIT_MARGIN = 15.0

CONFLICT_HINT = "use `run-agent resume` or a new --task"

MAX_PROMPT_BYTES = userfile.MAX_TEXT_BYTES


@cli.command()
@task_option(required=False)
@prompt_options
@issue_options
@loop_options
@common
def run(
    project_id: str | None, task_id: str | None, prompt: str | None, prompt_file: Path | None,
    issue: IssueArgs | None, loop: LoopArgs, config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Run a task in a loop: restart the agent until it completes or the loop gives up."""
    ctx = click.get_current_context()
    if ctx.meta.get(IMPLICIT_RUN) and prompt is not None and len(prompt.split()) == 1:
        group = ctx.find_root().command
        assert isinstance(group, RunAgentGroup)
        named = project_id is not None and task_id is not None
        group.refuse_typo(prompt, as_prompt=True, task_named=named)  # `-p P -t T status`
    text = read_prompt(prompt, prompt_file)
    if issue is None:
        start_loop(setup(config_path, root), project_id, task_id, text, loop)
        return
    # An issue run: the task is named after the issue, and its body is the prompt if none is
    # given; it defaults to completion by ready marker and the protocol's 30-minute timeout.
    if loop.overrides.working_dir is not None:
        raise UsageError("--cwd does not go with --issue: the agent works in the issue's worktree")
    body = text
    if issue.body_file is not None:
        body = read_prompt(None, issue.body_file, "--issue-body-file")
    if body is None:
        raise UsageError("an issue run needs the issue's text: give a prompt or --issue-body-file")
    from runagent.issues.issue import ISSUE_TIMEOUT

    defaults = LoopOverrides(until=Until.READY_MARKER, timeout=ISSUE_TIMEOUT)
    loop = replace(loop, overrides=defaults.merged(loop.overrides))
    project = project_id or _project_of(issue.repo)
    start_loop(
        setup(config_path, root, works_on=issue.repo), project,
        task_id or f"issue-{issue.number}", text or body, loop, issue=(issue, body),
    )  # fmt: skip


def _project_of(repo: Path) -> str:
    name = repo.resolve().name
    try:
        return validate_id("project", name)
    except UsageError:
        raise UsageError(
            f"the repository's folder name {name!r} cannot be a project id; give --project"
        ) from None


@cli.command()
@task_option(required=False)
@prompt_options
@one_run_options
@common
def job(
    project_id: str | None, task_id: str | None, prompt: str | None, prompt_file: Path | None,
    loop: LoopArgs, config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Run the agent once: one run, no restarts."""
    once = replace(loop, overrides=replace(loop.overrides, max_restarts=0), one_run=True)
    start_loop(
        setup(config_path, root), project_id, task_id, read_prompt(prompt, prompt_file), once
    )


@cli.command()
@task_option(required=True)
@click.option("--message", "message", metavar="TEXT", default=None,
              help="A person's words for the task's next attempt (a running task's waits for "
              "it; `-` reads them from stdin).")  # fmt: skip
@click.option("--now", is_flag=True, default=False,
              help="With --message on a running task: end its current attempt and start the "
              "next with the message (no failure counted).")  # fmt: skip
@loop_options
@common
def resume(
    project_id: str, task_id: str, message: str | None, now: bool, loop: LoopArgs,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Run a task's loop again from its TASK.md; or steer it with a person's --message."""
    s, task = existing_task(config_path, root, project_id, task_id)
    issue = remembered_issue(s, task)
    if message == "-":
        message = read_prompt("-", None)
    request = StartRequest(
        task, command=Command.RESUME, overrides=loop.overrides, again=loop.again,
        schedule=loop.schedule, conflict_hint=CONFLICT_HINT, after=loop.after,
        priority=loop.priority, issue_run=issue is not None, owner=True, admitted=loop.admitted,
        race=loop.race, message=message, now=now, sender="command line",
    )  # fmt: skip
    service = service_for(s)
    kept = service.steer(request)
    if kept is not None:  # its loop runs: the message waits for it, or ends its attempt
        then = ("its current attempt ends and the next starts with it" if now
                else "its next attempt starts with it")  # fmt: skip
        click.echo(f"run-agent: message {kept.number} kept for task {task.label}: {then}",
                   err=True)  # fmt: skip
        return
    enter(s, service.raced(request), loop, issue)


def start_loop(
    s: Setup, project_id: str | None, task_id: str | None, text: str | None, loop: LoopArgs,
    issue: tuple[IssueArgs, str] | None = None,
) -> None:  # fmt: skip
    """Run a new task, or an existing one with the same prompt (TASK.md's when none is given)."""
    if project_id is None:
        raise UsageError("--project is required: say which project the task belongs to")
    validate_id("project", project_id)
    generated = task_id is None  # an empty --task is refused, not replaced
    task = TaskPaths(
        s.root, project_id, new_task_id() if task_id is None else validate_id("task", task_id)
    )
    while generated and task.folder.exists():  # a generated id never joins an existing task
        task = TaskPaths(s.root, project_id, new_task_id())
    request = StartRequest(
        task, text, overrides=loop.overrides, again=loop.again, schedule=loop.schedule,
        conflict_hint=CONFLICT_HINT, after=loop.after, priority=loop.priority,
        issue_run=issue is not None, owner=True,  # the command line of the config's user
        admitted=loop.admitted, race=loop.race,
    )  # fmt: skip
    if generated:
        click.echo(f"run-agent: task id {task.task_id}", err=True)
    enter(s, request, loop, _issue(s, task, *issue) if issue else None)


def enter(s: Setup, request: StartRequest, loop: LoopArgs, issue: Issue | None) -> None:
    """Through the one door: the loop runs here in the foreground, or on the configured
    executor followed here in the foreground (the same lines and exit code), or, with
    --detach, is started where it runs and left to run."""
    here = request
    ticket = os.environ.pop(START_TICKET, None)  # started by the queue's keeper: its claim
    if ticket is not None:  # taken over before anything runs, or nothing runs
        from runagent.fleet import gate

        gate.take_over(request.task, ticket)
    if loop.one_run:  # started elsewhere as `job`, which says its single run itself
        once = replace(request.overrides, max_restarts=None)
        request = replace(request, command=Command.JOB, overrides=once)
    if request.race is not None:  # through the door, which refuses it with an issue
        if loop.detach:
            dispatch(s, request, loop.quiet)
        else:
            from runagent.cli.foreground import foreground_race

            foreground_race(s, service_for(s), request, loop)
        return
    on_cluster = s.config.executor.type is not ExecutorType.LOCAL
    if on_cluster and issue is not None:
        raise UsageError(ISSUE_ON_CLUSTER)
    if issue is not None:  # not a repository, or a config or runs root inside it: refused
        s.refuse_inside(issue.repo)  # before anything (a resume finds the repository only now)
    if loop.detach:
        dispatch(s, _detached(request, issue), loop.quiet)
        return
    service = service_for(s)
    if on_cluster:
        from runagent.cli.remote import follow_remote

        follow_remote(service, request, loop.quiet)
    foreground_loop(s, service, here, loop, issue)


def _detached(request: StartRequest, issue: Issue | None) -> StartRequest:
    """The request of a detached start: an issue run goes as the door's issue start (which
    writes the issue down for the loop to take up)."""
    if issue is None or request.command is Command.RESUME:
        return request
    from runagent.service import IssueStart

    start = IssueStart(issue.number, issue.repo, issue.body, issue.url)
    return replace(request, issue=start, issue_run=True)


def _issue(s: Setup, task: TaskPaths, args: IssueArgs, body: str) -> Issue:
    from runagent.issues.issue import Issue

    return Issue(
        number=args.number, repo=args.repo.resolve(), body=body, body_file=task.issue_body,
        url=args.url, setup=s.config.issues.setup,
    )  # fmt: skip


def remembered_issue(s: Setup, task: TaskPaths) -> Issue | None:
    """The issue a task was started on (its issue.yaml and ISSUE.md), for a resume."""
    record = taskfolder.read_worktree_record(task)
    if not record.get("issue"):  # not an issue run (a worktree run's record names none)
        return None
    try:
        body = task.issue_body.read_text(encoding="utf-8")
    except OSError:
        body = taskfolder.read_task_prompt(task) or ""
    from runagent.issues.issue import issue_number

    args = IssueArgs(issue_number(record.get("issue"), str(task.issue_record)),
                     Path(str(record.get("repo"))), str(record.get("url") or ""))  # fmt: skip
    return _issue(s, task, args, body)


def read_prompt(
    prompt: str | None, prompt_file: Path | None, what: str = "prompt file"
) -> str | None:
    """The prompt from the argument, `-` (stdin) or --prompt-file (`what` names the file in an
    error); None if none was given."""
    if prompt is not None and prompt_file is not None:
        raise UsageError("give the prompt either as an argument or with --prompt-file, not both")
    source = "the prompt"
    try:
        if prompt_file is not None:
            source = f"{what} {str(prompt_file)!r}"
            prompt = userfile.read_file(prompt_file, MAX_PROMPT_BYTES, what).decode("utf-8")
        elif prompt == "-":
            source = "the prompt on standard input"
            data = userfile.read_stream(sys.stdin.buffer, MAX_PROMPT_BYTES, source)
            prompt = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{source} is not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    return None if prompt is None else validate_prompt(prompt, source)


def dispatch(s: Setup, request: StartRequest, quiet: bool = False) -> None:
    """Start the task's loop where it runs (--detach), say where, and return."""
    task = request.task
    started = service_for(s).start(request)
    watch = f"`run-agent output -p {task.project_id} -t {task.task_id} --follow`"
    if started.queued is not None:  # in the queue, or blocked until others complete
        click.echo(f"run-agent: {started.queued.words(task.label)}; follow it with {watch}",
                   err=True)  # fmt: skip
        return
    on_cluster = s.config.executor.type is not ExecutorType.LOCAL
    held = started.holder
    where = held.describe(host=on_cluster) if held is not None else f"pid {started.pid}"
    if request.race is not None:
        if not quiet:
            click.echo(f"run-agent: race {task.label} started ({request.race.words()}, watcher "
                       f"{where}); follow it with `run-agent status -p {task.project_id} -t "
                       f"{task.task_id}`", err=True)  # fmt: skip
        return
    if not quiet:
        click.echo(f"run-agent: task {task.label} started on {s.config.executor.type} "
                   f"(supervisor {where}); follow it with {watch}", err=True)  # fmt: skip


@cli.command()
@task_option(required=False)
@click.option("--all", "every", is_flag=True,
              help="Stop every loop (of -p's project, if given) and empty the queue of its "
                   "tasks, none of them started meanwhile.")  # fmt: skip
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until it stopped.")
@common
def stop(
    project_id: str | None, task_id: str | None, every: bool, wait: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Stop a task's loop: its agent tree is killed and nothing restarts. With --all, every
    loop, and every task waiting in the queue leaves it."""
    if every:
        if task_id is not None:
            raise UsageError(f"--all stops every task; -t {task_id} names one: give one or the "
                             "other")  # fmt: skip
        _stop_all(project_id, wait, config_path, root)
        return
    if project_id is None or task_id is None:
        missing = " and ".join(o for o, v in (("-p", project_id), ("-t", task_id)) if v is None)
        raise UsageError(f"stop needs {missing} (the task to stop), or --all to stop every one")
    s, task = existing_task(config_path, root, project_id, task_id)
    grace = s.config.defaults.kill_grace + STOP_WAIT_MARGIN
    from runagent.fleet.queue import Waiting  # (loaded already where there is a queue)

    stopped = service_for(s).stop(task, grace if wait else None)
    if stopped is None:
        click.echo(f"run-agent: task {task.label} is not running")
    elif isinstance(stopped, Waiting):
        why = stopped.unreadable
        damaged = f" (its record could not be read: {why})" if why else ""
        click.echo(f"run-agent: task {task.label} left the queue{damaged}; it was never started")
    elif wait:
        click.echo(f"run-agent: task {task.label} stopped")
    else:
        click.echo(
            f"run-agent: asked the supervisor of {task.label} ({stopped.describe()}) to stop"
        )


def _stop_all(
    project_id: str | None, wait: bool, config_path: Path | None, root: Path | None
) -> None:
    """`stop --all`: the queue held while every loop in reach is stopped and every queued task
    of theirs taken out, then released unless it was held before."""
    from runagent.loop.context import validate_id

    s = setup(config_path, root)
    project = validate_id("project", project_id) if project_id is not None else None
    grace = s.config.defaults.kill_grace + STOP_WAIT_MARGIN
    done = service_for(s).stop_everything(grace if wait else 0.0, project)
    if done.stopped:
        click.echo(f"run-agent: {'stopped' if wait else 'asked to stop'} {len(done.stopped)} "
                   f"running: {', '.join(done.stopped)}")  # fmt: skip
    if done.left_queue:
        click.echo(f"run-agent: took {len(done.left_queue)} out of the queue, never started: "
                   f"{', '.join(done.left_queue)}")  # fmt: skip
    if not (done.stopped or done.left_queue):
        click.echo("run-agent: nothing runs or waits" + (f" in project {project}" if project
                                                         else ""))  # fmt: skip
    if done.held:
        click.echo("run-agent: the queue stays held, as it was; `run-agent fleet release` lets "
                   "it go")  # fmt: skip


@cli.command()
@task_option(required=True)
@common
def check(project_id: str, task_id: str, config_path: Path | None, root: Path | None) -> None:
    """Run a task's check again on its current tree: exit 0 if it passes, 1 if not."""
    s, task = existing_task(config_path, root, project_id, task_id)
    result = service_for(s).recheck(task)
    try:
        with open(task.check, "rb") as said:
            while chunk := said.read(1 << 16):
                sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()
    except OSError:
        pass  # nothing printed, or gone: the verdict below says how it went
    click.echo(f"run-agent: {result.words()}", err=True)
    sys.exit(0 if result.passed else 1)
