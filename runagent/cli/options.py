"""The options commands share, and turning them into typed values: the setup (config and runs
root), a task named on the command line, and a loop's overrides."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

import backends
from runagent.config.file import (
    find_config,
    load_config,
    refuse_config_inside,
    refuse_root_inside,
    runs_root,
)
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import AgentConfig, Config, ExecutorType, Until
from runagent.errors import MissingDependencyError, NotFoundError, OutsideRootError, UsageError
from runagent.loop.context import validate_id
from runagent.store import tasks
from runagent.store.runfolder import TaskPaths

if TYPE_CHECKING:  # loaded with the first backend, by the commands that run one
    from runagent.loop.backend import Backend
    from runagent.service import Service  # loaded by the commands that start or change a task


class PathValue(click.Path):
    """A click.Path that refuses an empty value, which would quietly mean the current folder."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail(f"{value!r} is empty; give a path, or leave the option out", param, ctx)
        return super().convert(value, param, ctx)


@dataclass(frozen=True)
class Setup:
    config: Config
    root: Path
    root_from: str = "--root"  # where the runs root came from, in words

    def where(self) -> str:
        """`under ROOT (SOURCE)`, for messages that find nothing there."""
        return f"under {self.root} (the runs root from {self.root_from})"

    def refuse_inside(self, repository: Path) -> None:
        """Refuse a config or runs root inside the repository a task works on (one line)."""
        from runagent.issues.worktree import working_trees  # only for work on a repository

        folders = working_trees(repository, os.environ)
        refuse_config_inside(self.config.source, folders, os.environ)
        refuse_root_inside(self.root, self.root_from, folders)


EXECUTOR = "executor"  # ctx.meta key: the --executor the command line gave


def _remember_executor(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[EXECUTOR] = ExecutorType(value)


def common(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--executor",
        type=click.Choice([t.value for t in ExecutorType]),
        expose_value=False,
        callback=_remember_executor,
        help="What runs task loops: this machine, or a Ray cluster (default: executor.type).",
    )(f)
    f = click.option(
        "--root",
        type=PathValue(file_okay=False, path_type=Path),
        help="Runs root folder (default: storage.runs_dir of the config, else ./runs).",
    )(f)
    return click.option(
        "--config",
        "config_path",
        type=PathValue(dir_okay=False, path_type=Path),
        help="config.yaml to use (default: ./config.yaml, then ~/.config/run-agent/).",
    )(f)


def setup(config_path: Path | None, root: Path | None, works_on: Path | None = None) -> Setup:
    """The config and runs root; for a task that works on a repository (`works_on`), neither
    may lie inside it, and its config is refused before it is even read."""
    cwd = Path.cwd()
    path = find_config(config_path, cwd, os.environ)
    if works_on is not None:
        from runagent.issues.worktree import working_trees

        refuse_config_inside(path, working_trees(works_on, os.environ), os.environ)
    config = load_config(path, backends.known(), cwd)
    ctx = click.get_current_context(silent=True)
    chosen = ctx.meta.get(EXECUTOR) if ctx is not None else None
    if chosen is not None:
        config = replace(config, executor=replace(config.executor, type=chosen))
    if config.executor.type is ExecutorType.RAY:
        from runagent.executors import control  # the command line's start-up does not pay for it

        control.judge_foreign_hosts(config.executor)
    s = Setup(config, *runs_root(root, os.environ, config))
    if works_on is not None:
        s.refuse_inside(works_on)
    return s


def existing_task(
    config_path: Path | None, root: Path | None, project_id: str, task_id: str
) -> tuple[Setup, TaskPaths]:
    """The setup and an existing task's paths; a bad or unknown id is a one-line error."""
    s = setup(config_path, root)
    project = validate_id("project", project_id)
    try:
        return s, tasks.find_task(s.root, project, validate_id("task", task_id))
    except OutsideRootError:
        raise
    except NotFoundError as exc:  # say where the root came from: it may not be the one meant
        raise NotFoundError(f"{exc} (the runs root from {s.root_from})") from exc


def service_for(s: Setup) -> Service:
    """The one door, for a command of this command line: its config as its options made it,
    the backends' agent check, loops working where the command was typed unless told."""
    from runagent.service import Service  # a listing reads the root without it

    return Service(
        s.root, usable_backend, config=s.config, config_path=s.config.source,
        executor=s.config.executor, workdir=Path.cwd(),
    )  # fmt: skip


def task_option(required: bool) -> Callable[..., Any]:
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        f = click.option(
            "--task", "-t", "task_id", required=required, help="Task id (letters, digits, . _ -)."
        )(f)
        return click.option("--project", "-p", "project_id", required=required, help="Project id.")(
            f
        )

    return decorate


def prompt_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The prompt: an argument (`-` reads standard input), or --prompt-file."""
    f = click.option(
        "--prompt-file",
        type=PathValue(exists=True, dir_okay=False, path_type=Path),
        help="Read the prompt from a file ('-' as PROMPT reads standard input).",
    )(f)
    return click.argument("prompt", required=False)(f)


def json_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(f)


@dataclass(frozen=True)
class LoopArgs:
    """A loop's options from the command line, typed: what they override, and how it is told."""

    overrides: LoopOverrides
    quiet: bool = False
    schedule: str | None = None  # the schedule that fired this loop
    again: bool = False  # a completed task runs again
    one_run: bool = False  # `job`: its max_restarts 0 is not how the task is remembered


def loop_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The loop's options, handed to the command as one `loop: LoopArgs`."""
    return _loop_options(f, ())


def one_run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The loop's options but those a single run cannot honour (`job`): refused, not ignored."""
    return _loop_options(f, ("max_restarts",))


def _loop_options(f: Callable[..., Any], without: tuple[str, ...]) -> Callable[..., Any]:
    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        for name in without:
            if kwargs.pop(name) is not None:
                raise UsageError(
                    f"--{name.replace('_', '-')} does not apply here: this command runs the "
                    "agent once; use `run-agent run` for a loop with restarts"
                )
        raw = {name: kwargs.pop(name) for name in OVERRIDE_OPTIONS if name not in without}
        overrides = LoopOverrides.parse(raw)
        loop = LoopArgs(overrides, kwargs.pop("quiet"), kwargs.pop("schedule"), kwargs.pop("again"))
        return f(*args, loop=loop, **kwargs)

    options = [
        ("agent", click.option(
            "--agent", "-a", help="Agent from config.yaml `agents:` (or a backend name).")),
        ("working_dir", click.option(
            "--cwd", "working_dir", type=PathValue(file_okay=False, path_type=Path),
            help="Working folder of the agent (default: the current folder).")),
        ("max_restarts", click.option(
            "--max-restarts", type=click.IntRange(min=0), help="Restarts after the first run.")),
        ("restart_delay", click.option(
            "--restart-delay", help="First backoff, e.g. 2s; it doubles up to restart_delay_max.")),
        ("timeout", click.option(
            "--timeout", help="Stop a run after this long in total, e.g. 30m (0: never).")),
        ("idle_timeout", click.option(
            "--idle-timeout", help="Stop a run after this long without output (0: never).")),
        ("until", click.option(
            "--until", type=click.Choice([u.value for u in Until]),
            help="exit: exit 0 completes the task; done-file: only a DONE file does; "
            "ready-marker: only a commit since the start carrying the ready marker.")),
        ("quiet", click.option("--quiet", "-q", is_flag=True, help="Print only the final line.")),
        ("again", click.option(
            "--again", is_flag=True, help="Run a completed task again (its DONE is archived).")),
        ("schedule", click.option(
            "--schedule", hidden=True, help="The schedule that fired this loop.")),
    ]  # fmt: skip
    for name, option in reversed(options):
        if name in without:  # still parsed, so that giving it is refused with a reason
            option = click.option(f"--{name.replace('_', '-')}", name, hidden=True)
        command = option(command)
    return command


@dataclass(frozen=True)
class IssueArgs:
    """`--issue N [--issue-url U] [--issue-body-file F] --repo DIR`: an issue run."""

    number: int
    repo: Path
    url: str = ""
    body_file: Path | None = None


def issue_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The issue-run options, handed to the command as one `issue: IssueArgs | None`."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        number, repo = kwargs.pop("issue_number"), kwargs.pop("repo")
        url, body_file = kwargs.pop("issue_url"), kwargs.pop("issue_body_file")
        issue = None
        if number is not None:
            from runagent.issues.issue import issue_number  # only an issue run pays for git's

            if repo is None:
                raise UsageError("--issue needs --repo: the repository its worktree comes from")
            issue = IssueArgs(issue_number(number, "--issue"), repo, url or "", body_file)
        elif repo is not None or url is not None or body_file is not None:
            raise UsageError("--repo, --issue-url and --issue-body-file go with --issue N")
        return f(*args, issue=issue, **kwargs)

    options = [
        click.option("--issue", "issue_number", help="Run on issue N in a git worktree of --repo."),
        click.option("--issue-url", help="The issue's link (COCODE_ISSUE_URL)."),
        click.option(
            "--issue-body-file", type=PathValue(exists=True, dir_okay=False, path_type=Path),
            help="The issue's text (default: the prompt; without a prompt, it is the prompt)."),
        click.option(
            "--repo", type=PathValue(exists=True, file_okay=False, path_type=Path),
            help="The repository whose default branch the issue's worktree starts from."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


OVERRIDE_OPTIONS = ("agent", "working_dir", "max_restarts", "restart_delay", "timeout",
                    "idle_timeout", "until")  # fmt: skip


def usable_backend(config: Config, name: str | None, who: str = "") -> tuple[AgentConfig, Backend]:
    """The agent named (or the default) and its backend, once its executable and credentials
    are checked: a missing one is refused here, before anything is created or started."""
    agent = config.agent(name, backends.known())
    backend = backends.create(agent)
    for finding in backend.check():
        if not finding.ok:
            hint = f"; {finding.fix}" if finding.fix else ""
            raise MissingDependencyError(f"{who}{finding.what}{hint}")
    return agent, backend
