"""merge, rebase, worktrees and cocode: tasks' git worktrees and the way back from them, and
run-agent as a cocode agent."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from runagent.cli.foreground import STOP_SIGNALS, executable_dir
from runagent.cli.group import cli
from runagent.cli.options import (
    Setup,
    common,
    existing_task,
    json_option,
    service_for,
    setup,
    task_option,
)
from runagent.cli.show import print_table
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import Until
from runagent.errors import RunAgentError, UsageError
from runagent.issues import pruning
from runagent.issues.cocode import CocodeRequest, commit_work, log_line, ready_commit
from runagent.issues.issue import ISSUE_TIMEOUT
from runagent.issues.repository import READY_MARKER_VARIABLE, Checkout, GitDirs
from runagent.loop.context import LoopRequest, new_task_id, parent_run_id, validate_id
from runagent.loop.events import Event, EventKind, LoopResult, Outcome
from runagent.loop.supervisor import Supervisor
from runagent.service import Admission, StartRequest
from runagent.store import credentials, taskfolder
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import RunStatus

# The cocode protocol's exit codes, by how the loop ended (2 and 3 come from errors before it
# starts). A loop stopped as stuck or at its budget did not resolve the issue: it failed.
COCODE_EXIT = {
    Outcome.COMPLETED: 0,
    Outcome.FAILED: 1,
    Outcome.STUCK: 1,
    Outcome.BUDGET: 1,
    Outcome.MISSING_DEPENDENCY: 3,
    Outcome.TIMED_OUT: 124,
    Outcome.STOPPED: 130,
}


@cli.command()
@task_option(required=True)
@click.option("--push", metavar="REMOTE", help="Push the task's branch to REMOTE instead.")
@click.option(
    "--into", metavar="BRANCH", help="Merge into BRANCH (default: the branch it started from)."
)
@click.option("--force", is_flag=True, help="Bring back a task that did not complete.")
@common
def merge(
    project_id: str, task_id: str, push: str | None, into: str | None, force: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Bring a task's worktree branch back: merge it into the branch it started from, or push it."""
    s, task = existing_task(config_path, root, project_id, task_id)
    click.echo(f"run-agent: {service_for(s).merge(task, push=push, into=into, force=force)}")


@cli.command()
@task_option(required=True)
@click.option(
    "--onto", metavar="BRANCH", help="Bring in BRANCH (default: the branch it merges into)."
)
@click.option("--abort", is_flag=True, help="Undo a rebase whose conflicts are not resolved.")
@json_option
@common
def rebase(
    project_id: str, task_id: str, onto: str | None, abort: bool, as_json: bool,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Bring the branch a task's worktree merges into into its worktree; conflicts go to its agent.

    It is brought in by a merge commit on the task's branch (then `merge` is a fast-forward).
    Conflicts, or a check that fails on the result, resume the task's loop, which completes
    only once they are resolved."""
    if abort and onto is not None:
        raise UsageError("--abort and --onto do not go together: undo the rebase, or make one")
    s, task = existing_task(config_path, root, project_id, task_id)
    done = service_for(s).rebase(task, onto=onto, abort=abort, owner=True,
                                 sender="command line")  # fmt: skip
    if as_json:
        click.echo(json.dumps(done.to_dict(), indent=2))
        return
    click.echo(f"run-agent: {done.words(task.label)}")
    if done.resumed:
        click.echo(f"run-agent: follow it with `run-agent watch -p {task.project_id} -t "
                   f"{task.task_id}`")  # fmt: skip


@cli.command()
@click.argument("action", type=click.Choice(["list", "prune"]), default="list")
@click.option(
    "--all", "every", is_flag=True, help="prune: every task not running, not only completed ones."
)
@click.option("--force", is_flag=True, help="prune: dirty worktrees too, their diff saved first.")
@json_option
@common
def worktrees(
    action: str, every: bool, force: bool, as_json: bool, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """List the tasks' worktrees (issue and --worktree runs), or prune those done with them."""
    s = setup(config_path, root)
    env = dict(os.environ)
    found = pruning.issue_worktrees(s.root, env)
    if action == "list":
        if every or force:
            raise UsageError("--all and --force go with `run-agent worktrees prune`")
        if as_json:
            click.echo(json.dumps([w.to_dict() for w in found], indent=2))
            return
        if not found:
            click.echo(f"run-agent: no issue worktrees {s.where()}", err=True)
            return
        rows = [
            [w.task.label, w.task.status.value, w.branch or "", _ahead(w), _state(w), str(w.path)]
            for w in found
        ]
        print_table(rows, ["TASK", "STATUS", "BRANCH", "AHEAD", "STATE", "PATH"])
        return
    results = [pruning.prune(w, env, every=every, force=force) for w in found]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        **p.worktree.to_dict(),
                        "action": p.action.value,
                        "saved_diff": str(p.saved_diff) if p.saved_diff else None,
                        "branch_deleted": p.branch_deleted,
                    }
                    for p in results
                ],
                indent=2,
            )
        )
        return
    for pruned in results:
        click.echo(pruned.describe())
    if not results:
        click.echo(f"run-agent: no issue worktrees {s.where()}", err=True)


def _ahead(w: pruning.IssueWorktree) -> str:
    return "" if w.ahead is None else str(w.ahead)


def _state(w: pruning.IssueWorktree) -> str:
    if not w.registered:
        return "unregistered" if w.path.exists() else "missing"
    words = ["dirty" if w.dirty else "clean"]
    if w.locked is not None:
        words.append("locked")
    return ",".join(words)


@cli.command()
@click.option("--agent", "-a", help="Agent from config.yaml `agents:` (default: defaults.agent).")
@click.option("--project", "-p", "project_id", default="cocode", show_default=True,
              help="Project id of the run folder.")  # fmt: skip
@click.option("--max-restarts", type=click.IntRange(min=0), help="Restarts after the first run.")
@click.option("--timeout", help="Stop a run after this long (default 30m, as the protocol's).")
@common
def cocode(
    agent: str | None, project_id: str, max_restarts: int | None, timeout: str | None,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Be a cocode agent: resolve the issue the COCODE_* variables name, in COCODE_REPO_PATH.

    Runs the agent in a supervised loop (with the usual run folder), commits its changes when
    it did not, and makes the final commit carrying COCODE_READY_MARKER only when it succeeded.
    Logs JSON lines on stdout. Exit codes: 0 ready, 1 failed, 2 a variable missing or wrong,
    3 the agent's executable or key missing, 124 timed out, 130 interrupted.
    """
    env = dict(os.environ)
    try:
        request = CocodeRequest.from_env(env)
        s = setup(config_path, root, works_on=request.repo)
        given = LoopOverrides.parse({"agent": agent, "max_restarts": max_restarts,
                                     "timeout": timeout})  # fmt: skip
        overrides = LoopOverrides(until=Until.EXIT, timeout=ISSUE_TIMEOUT).merged(given)
        checkout = Checkout.at(request.repo)
        task = _cocode_task(s.root, validate_id("project", project_id), request)
        # Through the one door, as every start: the same checks in the same order, TASK.md
        # claimed, its turn under `limits:`. A host that runs its agent again on a resolved
        # issue asks for that in so many words.
        start = StartRequest(task, request.prompt(), overrides=overrides, again=True)
        with service_for(s).enter(start, lambda turn: _log("info", turn.words(task.label))) as a:
            assert a.agent is not None  # the command line's door checks its agent
            agent_name = a.agent[0].name
            result = _cocode_loop(s, task, request, env, checkout, a)
    except RunAgentError as exc:
        _log("error", str(exc))
        raise
    _finish(result, agent_name, checkout, request, env)
    sys.exit(COCODE_EXIT[result.outcome])


def _cocode_loop(
    s: Setup, task: TaskPaths, request: CocodeRequest, env: dict[str, str], checkout: Checkout,
    admitted: Admission,
) -> LoopResult:  # fmt: skip
    """Run the admitted cocode task's loop in the issue's repository, narrated as the protocol's
    JSON log lines, until it ends."""
    assert admitted.agent is not None
    agent_config, backend = admitted.agent
    overrides = replace(admitted.overrides, agent=agent_config.name)
    # The marker is run-agent's to commit, once the agent has succeeded: its agent never sees it.
    # Nor any credential of run-agent itself (the server's API key, a token), as for `run`.
    scrubbed = credentials.scrub(env, s.config.server.api_key_env)
    agent_env = {k: v for k, v in scrubbed.items() if k != READY_MARKER_VARIABLE}
    loop = LoopRequest(
        task=task, prompt=admitted.prompt, agent_name=agent_config.name,
        working_dir=request.repo.resolve(),
        settings=overrides.apply(agent_config.loop_defaults(s.config.defaults)),  # its sandbox
        base_env=agent_env, parent_run_id=parent_run_id(env), executable_dir=executable_dir(),
        started_with={**replace(overrides, working_dir=request.repo.resolve()).to_record(),
                      **s.config_record()},
        checkout=checkout, control=s.control,
    )  # fmt: skip
    _log(
        "info",
        f"starting work on issue #{request.number} with {agent_config.name} in "
        f"{checkout.folder} (base {checkout.base[:12]}); run folder {task.folder}",
    )
    on_event = _narrator(request, env, checkout.dirs)
    # A limit pauses its agent across the fleet, as any loop's does (the door's pauser).
    supervisor = Supervisor(loop, backend, on_event=on_event, redactor=backend.redactor(env),
                            pauser=admitted.pauser)  # fmt: skip
    previous = {sig: signal.signal(sig, lambda *_: supervisor.request_stop())
                for sig in STOP_SIGNALS}  # fmt: skip
    try:
        return supervisor.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _narrator(
    request: CocodeRequest, env: dict[str, str], dirs: GitDirs | None
) -> Callable[[Event], None]:
    """The loop's events as the protocol's JSON log lines; after each run, its work committed."""

    def on_event(event: Event) -> None:
        info = event.run
        if event.kind is EventKind.RUN_STARTED and info is not None:
            _log("info", f"attempt {info.attempt}: run {info.run_id} started")
        elif event.kind is EventKind.RUN_ENDED and info is not None:
            ok = info.status is RunStatus.COMPLETED
            _log("info" if ok else "error", f"attempt {info.attempt}: run {info.run_id} "
                 f"{info.status.value}: {info.describe()}")  # fmt: skip
            _commit_left_work(request.repo, request, info.run_id, info.attempt, env, dirs)
        elif event.kind is EventKind.WAITING:
            _log(
                "info",
                f"restarting in {event.delay:g}s{'; ' + event.message if event.message else ''}",
            )

    return on_event


def _finish(
    result: LoopResult, agent: str, checkout: Checkout, request: CocodeRequest,
    env: dict[str, str],
) -> None:  # fmt: skip
    """The ready marker committed when the loop completed the work, and never otherwise."""
    if result.outcome is Outcome.COMPLETED:
        last = result.runs[-1]
        summary = f"Resolved by {agent} (run-agent run {last.run_id}, attempt {last.attempt})."
        sha = ready_commit(checkout, request, summary, env)
        _log("info", f"work complete: commit {sha[:12]} carries the ready marker")
    else:
        _log("error", f"{result.message}; no ready marker committed")


def _log(level: str, message: str) -> None:
    click.echo(log_line(level, message))


def _cocode_task(root: Path, project_id: str, request: CocodeRequest) -> TaskPaths:
    """The task `issue-N`, unless it exists for another text of the issue: then a new one."""
    task = TaskPaths(root, project_id, f"issue-{request.number}")
    existing = taskfolder.read_task_prompt(task)
    if existing is not None and existing != request.prompt():
        task = TaskPaths(root, project_id, f"issue-{request.number}-{new_task_id()[5:]}")
    return task


def _commit_left_work(
    folder: Path, request: CocodeRequest, run_id: str, attempt: int, env: dict[str, str],
    dirs: GitDirs | None,
) -> None:  # fmt: skip
    """Commit what a run changed and left uncommitted, so no work is lost between attempts."""
    message = f"Work on issue #{request.number} (run-agent run {run_id}, attempt {attempt})"
    try:
        sha = commit_work(folder, message, env, dirs)
    except RunAgentError as exc:
        _log("error", f"could not commit the work left by run {run_id}: {exc}")
        return
    if sha is not None:
        _log("info", f"committed the work run {run_id} left uncommitted: {sha[:12]}")
