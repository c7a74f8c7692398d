"""The options commands share, and turning them into typed values: the setup (config and runs
root) and a task named on the command line. A loop's options are in loopargs.py, loaded only by
the commands that start one."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
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
from runagent.config.settings import AgentConfig, Config, ExecutorType
from runagent.errors import MissingDependencyError, NotFoundError, OutsideRootError
from runagent.record import record
from runagent.store import tasks
from runagent.store.ids import validate_id
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


@record
class Setup:
    """What every command reads first: the config and the runs root, and where each came from
    (for the words of an error)."""

    config: Config
    root: Path
    root_from: str = "--root"  # where the runs root came from, in words
    config_found: bool = False  # the config file was found in the current folder, not named

    @property
    def control(self) -> tuple[Path, ...]:
        """Files that decide what runs on the host: the config file, read-only to a sandboxed
        agent wherever it lies (runagent/loop/sandbox.py)."""
        return (self.config.source.resolve(),) if self.config.source is not None else ()

    def config_record(self) -> dict[str, object]:
        """The config file a loop starts with, for its task's record: a later start through
        the door finds it there (`Service._check_config_origin`)."""
        from runagent.store.taskfolder import CONFIG_KEY

        return {CONFIG_KEY: str(self.control[0])} if self.control else {}

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
    found = path is not None and config_path is None and not os.environ.get("RUN_AGENT_CONFIG")
    s = Setup(config, *runs_root(root, os.environ, config), config_found=found)
    if config.executor.type is ExecutorType.RAY:  # a command's calls go by its root's broker
        from runagent.executors import control

        control.use_broker(s.root)
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
        executor=s.config.executor, workdir=Path.cwd(), config_found=s.config_found,
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
