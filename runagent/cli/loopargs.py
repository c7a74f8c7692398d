"""The options of the commands that start a loop, and turning them into typed values: the
loop's overrides (`LoopArgs`) and an issue run's options (`IssueArgs`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from runagent.cli.options import PathValue
from runagent.config.overrides import OPTIONS, LoopOverrides
from runagent.config.settings import AgentSandbox, Session, Until
from runagent.errors import UsageError
from runagent.record import record
from runagent.store.race import RaceSpec


@record
class LoopArgs:
    """A loop's options from the command line, typed: what they override, and how it is told."""

    overrides: LoopOverrides
    quiet: bool = False
    schedule: str | None = None  # the schedule that fired this loop
    again: bool = False  # a completed task runs again
    one_run: bool = False  # `job`: its max_restarts 0 is not how the task is remembered
    after: tuple[str, ...] = ()  # P/T of tasks that must complete first (`--after`)
    priority: int = 0  # its place among tasks that wait in the queue (`--priority`)
    no_stuck: bool = False  # `--no-stuck`: off for this loop, not remembered for the task
    detach: bool = False  # `--detach`: start the loop where it runs and return
    admitted: bool = False  # the loop of a start the door admitted where it began
    race: RaceSpec | None = None  # `--race N` / `--agents a,b,c`: several loops race on the task


def loop_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The loop's options, handed to the command as one `loop: LoopArgs`."""
    return _loop_options(f, ())


def one_run_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The loop's options but those a single run cannot honour (`job`): refused, not ignored."""
    return _loop_options(f, ("max_restarts", "race", "agents"))


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
        race = None
        if "race" not in without:
            race = RaceSpec.parse(kwargs.pop("race"), kwargs.pop("agents"))
        no_stuck = bool(kwargs.pop("no_stuck"))
        if no_stuck:
            if raw.get("stuck_after") is not None:
                raise UsageError("--no-stuck and --stuck-after contradict each other; give one")
            raw["stuck_after"] = 0
        raw["fresh"] = raw["fresh"] or None  # a flag: given, or not
        overrides = LoopOverrides.parse(raw)
        loop = LoopArgs(
            overrides, kwargs.pop("quiet"), kwargs.pop("schedule"), kwargs.pop("again"),
            after=tuple(kwargs.pop("after")), priority=kwargs.pop("priority") or 0,
            no_stuck=no_stuck, detach=bool(kwargs.pop("detach")),
            admitted=bool(kwargs.pop("admitted")), race=race,
        )  # fmt: skip
        return f(*args, loop=loop, **kwargs)

    options = [
        ("agent", click.option("--agent", "-a", help=OPTIONS["agent"].help)),
        ("working_dir", click.option(
            "--cwd", "working_dir", type=PathValue(file_okay=False, path_type=Path),
            help=OPTIONS["working_dir"].help)),
        ("max_restarts", click.option(
            "--max-restarts", type=click.IntRange(min=0), help=OPTIONS["max_restarts"].help)),
        ("restart_delay", click.option("--restart-delay", help=OPTIONS["restart_delay"].help)),
        ("timeout", click.option("--timeout", help=OPTIONS["timeout"].help)),
        ("idle_timeout", click.option("--idle-timeout", help=OPTIONS["idle_timeout"].help)),
        ("budget", click.option(
            "--budget", multiple=True, metavar="AMOUNT", help=OPTIONS["budget"].help)),
        ("stuck_after", click.option(
            "--stuck-after", metavar="N", help=OPTIONS["stuck_after"].help)),
        ("no_stuck", click.option(
            "--no-stuck", is_flag=True, help="Never stop the loop as stuck (this task).")),
        ("until", click.option(
            "--until", type=click.Choice([u.value for u in Until]), help=OPTIONS["until"].help)),
        ("worktree", click.option(
            "--worktree/--no-worktree", default=None, help=OPTIONS["worktree"].help)),
        ("base", click.option("--base", metavar="REF", help=OPTIONS["base"].help)),
        ("sandbox", click.option(
            "--sandbox", type=click.Choice([c.value for c in AgentSandbox]),
            help=OPTIONS["sandbox"].help)),
        ("check", click.option("--check", metavar="CMD", help=OPTIONS["check"].help)),
        ("check_timeout", click.option("--check-timeout", help=OPTIONS["check_timeout"].help)),
        ("session", click.option(
            "--session", type=click.Choice([c.value for c in Session]),
            help=OPTIONS["session"].help)),
        ("fresh", click.option("--fresh", is_flag=True, help=OPTIONS["fresh"].help)),
        ("race", click.option(
            "--race", metavar="N", help="Race N loops of the agent on the task, each in a "
            "worktree of its own: the first whose check passes wins, the others are stopped.")),
        ("agents", click.option(
            "--agents", metavar="A,B,...", help="Race one loop of each of these agents on the "
            "task (as --race).")),
        ("quiet", click.option("--quiet", "-q", is_flag=True, help="Print only the final line.")),
        ("detach", click.option(
            "--detach", "-d", is_flag=True, help="Start the loop (on its executor) and return at "
            "once with exit 0, saying where it runs; follow it with `output --follow`.")),
        ("again", click.option(
            "--again", is_flag=True, help="Run a completed task again (its DONE is archived).")),
        ("schedule", click.option(
            "--schedule", hidden=True, help="The schedule that fired this loop.")),
        ("admitted", click.option(
            "--admitted", is_flag=True, hidden=True,
            help="The loop of a start run-agent admitted where it began (its own command line).")),
        ("after", click.option(
            "--after", "after", multiple=True, metavar="P/T",
            help="Start only once task P/T has completed (repeatable); until then it is blocked.")),
        ("priority", click.option(
            "--priority", type=int, help="Its place in the queue under limits: higher goes first "
            "(default 0).")),
    ]  # fmt: skip
    for name, option in reversed(options):
        if name in without:  # still parsed, so that giving it is refused with a reason
            option = click.option(f"--{name.replace('_', '-')}", name, hidden=True)
        command = option(command)
    return command


@record
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
                    "idle_timeout", "until", "stuck_after", "budget", "worktree",
                    "base", "sandbox", "check", "check_timeout", "session", "fresh")  # fmt: skip
