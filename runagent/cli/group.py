"""The `run-agent` command group: how a first word that is no command becomes `run`, and how an
error becomes its one line and its exit code. Only the CLI prints or exits."""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from runagent import VERSION_LINE, __version__
from runagent.errors import ExitCode, RunAgentError
from runagent.record import record

HELP = ("--help", "-h", "--version")
COMMON = ("--config", "--root", "--executor")  # options every command takes, before or after
TYPO_CUTOFF = 0.6  # how close a word must be to a command name to be taken for a typo of it


def close_names(word: str, names: list[str]) -> list[str]:
    """The name `word` is most likely a typo of, as difflib judges it, if any. difflib is
    imported only when a name is near enough in length to be close at all (its ratio is at most
    2*min/sum of the lengths): a prompt of several words never pays for it."""
    if not any(2 * min(len(word), len(n)) >= TYPO_CUTOFF * (len(word) + len(n)) for n in names):
        return []
    import difflib

    return difflib.get_close_matches(word, names, 1, TYPO_CUTOFF)


if TYPE_CHECKING:
    from click.shell_completion import CompletionItem


@record
class Lazy:
    """A command not imported yet: the module whose import registers it on `cli`, and the first
    sentence of its help, so that `--help` and completion list it without importing it."""

    module: str
    short_help: str


# Every command, imported only when it is invoked: start-up stays the interpreter, click and
# what that one command needs (a no-op `job` loads no server, `--version` loads nothing of
# ours). tests/test_startup.py keeps each short help equal to its command's own.
LAZY: dict[str, Lazy] = {
    "backends": Lazy("runagent.cli.checks",
                     "List every backend and agent, and whether it can run here."),
    "check": Lazy("runagent.cli.run",
                  "Run a task's check again on its current tree: exit 0 if it passes, 1 if not."),
    "cocode": Lazy("runagent.cli.issues", "Be a cocode agent: resolve the issue the COCODE_* "
                   "variables name, in COCODE_REPO_PATH."),
    "delete": Lazy("runagent.cli.cleanup", "Delete a task that is not running: its TASK.md, its "
                   "runs, everything in its folder."),
    "doctor": Lazy("runagent.cli.checks", "Check config, agent CLIs, versions, keys, the runs "
                   "root and the server port."),
    "fleet": Lazy("runagent.cli.fleet", "The fleet at a glance: what runs, the queue in order, "
                  "today's spend against each budget, what needs a person."),
    "gc": Lazy("runagent.cli.cleanup",
               "Remove old runs of tasks that are not running (never a running task's)."),
    "job": Lazy("runagent.cli.run", "Run the agent once: one run, no restarts."),
    "list": Lazy("runagent.cli.show", "List tasks (all, or one project's), or one task's runs."),
    "mcp": Lazy("runagent.cli.mcpserve", "Serve the MCP tools (start, list, status, output, stop, "
                "resume, approve, paste reply) and the run files over stdio."),
    "merge": Lazy("runagent.cli.issues", "Bring a task's worktree branch back: merge it into the "
                  "branch it started from, or push it."),
    "ops": Lazy("runagent.cli.ops", "Run JSON operations from a model in a workspace (files, "
                "shell) under a policy."),
    "output": Lazy("runagent.cli.show", "Print a run's output, stdout, stderr, prompt or check."),
    "paste": Lazy("runagent.cli.paste", "The copy-paste channel of `--agent paste` runs "
                  "(spec/copy-paste-protocol.md)."),
    "rebase": Lazy("runagent.cli.issues", "Bring the branch a task's worktree merges into "
                   "into its worktree; conflicts go to its agent."),
    "reindex": Lazy("runagent.cli.cleanup", "Build the runs root's index afresh from its run "
                    "folders (what listings and /metrics read)."),
    "resume": Lazy("runagent.cli.run", "Run a task's loop again from its TASK.md; or steer it "
                   "with a person's --message."),
    "run": Lazy("runagent.cli.run", "Run a task in a loop: restart the agent until it completes "
                "or the loop gives up."),
    "schedule": Lazy("runagent.cli.schedule", "Cron schedules from config.yaml: list them, run "
                     "the scheduler, fire one now, or print equivalent crontab lines."),
    "serve": Lazy("runagent.cli.serve",
                  "Serve a live view of every run in a browser (REST, SSE and a page)."),
    "status": Lazy("runagent.cli.show", "Show a task's status and its latest run."),
    "stop": Lazy("runagent.cli.run",
                 "Stop a task's loop: its agent tree is killed and nothing restarts."),
    "token": Lazy("runagent.cli.tokens", "Scoped API tokens for the server: create one (shown "
                  "once), list them, revoke one."),
    "usage": Lazy("runagent.cli.usage", "Tokens and cost of the runs, as their agents reported "
                  "them, summed by project, task, agent or day (UTC), with a total."),
    "watch": Lazy("runagent.cli.watch",
                  "Show the tasks and their latest runs, updating in place until Ctrl-C."),
    "worktrees": Lazy("runagent.cli.issues", "List the tasks' worktrees (issue and --worktree "
                      "runs), or prune those done with them."),
}  # fmt: skip


class RunAgentGroup(click.Group):
    """How the first words pick a command, and how an error becomes one line and its exit code.

    The rule (README, "Commands"): `--config FILE` and `--root DIR` may stand before the command
    name. Then, if the next word is a command, that command runs. If it is an option, the words
    are `run`'s (`run-agent -p P -t T "prompt"`). A first word that is neither is refused when
    it is a command name or close to one (`stauts`, `lsit`): a typo must never start a paid
    run; write `run` to mean it. So is a one-word prompt of that short form, where it is a
    command's name, or close to one while `-p` or `-t` is missing.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        common, args = _leading_common(args)
        if not args:
            args = ["--help"] if not common else []
        first = args[0] if args else ""
        if first in self.names():
            args = _after_command(self, ctx, args, common)
        elif first in HELP:
            args = [*args, *common]
        else:
            if not first.startswith("-") and not ctx.resilient_parsing:  # not while completing
                self.refuse_typo(first)
            ctx.meta[IMPLICIT_RUN] = True
            args = ["run", *common, *args]
        return super().parse_args(ctx, args)

    def refuse_typo(self, word: str, as_prompt: bool = False, task_named: bool = False) -> None:
        """Exit 2 when `word` is, or is close to, a command name (or, as a first word, is no
        command at all); else return. A one-word prompt for a task named by both `-p` and `-t`
        is refused only as a command's very name (`status`, `Stop`): one merely close to a name
        is a word of its own (`Release`, `Lint`), and the task's name says a run is meant."""
        import shlex

        names = self.names()
        if word.lower() in names:
            close = [word.lower()]
        else:
            close = [] if as_prompt and task_named else close_names(word.lower(), names)
        run_it = f"`run-agent run ... {shlex.quote(word)}`"
        if close and as_prompt:
            fail(
                f"the one-word prompt {word!r} looks like the command `{close[0]}`; write "
                f"`run-agent {close[0]} ...` for the command, or {run_it} to run it as a prompt",
                ExitCode.USAGE,
            )
        if close:
            fail(
                f"unknown command {word!r}; did you mean `run-agent {close[0]}`? "
                f"(to run it as a prompt, write {run_it})",
                ExitCode.USAGE,
            )
        if not as_prompt:
            fail(
                f"unknown command {word!r}; commands: {', '.join(self.names())} "
                '(a task runs as `run-agent -p P -t T "prompt"`)',
                ExitCode.USAGE,
            )

    def names(self) -> list[str]:
        """Every command's name, imported or not."""
        return sorted({*LAZY, *self.commands})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return self.names()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY:
            importlib.import_module(LAZY[cmd_name].module)  # its decorators register it on `cli`
        return self.commands.get(cmd_name)

    def brief(self, name: str, limit: int = 45) -> str:
        """A command's short help, from the table while its module is not imported."""
        if name in self.commands:
            return self.commands[name].get_short_help_str(limit)
        return click.Command(name, help=LAZY[name].short_help).get_short_help_str(limit)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's list of commands, without importing every command to read its help."""
        names = [n for n in self.names() if n in LAZY or not self.commands[n].hidden]
        limit = formatter.width - 6 - max(len(n) for n in names)
        with formatter.section("Commands"):
            formatter.write_dl([(n, self.brief(n, limit)) for n in names])

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """click's completion of a command's name, without importing every command."""
        from click.shell_completion import CompletionItem

        names = [n for n in self.names() if n.startswith(incomplete)]
        items = [CompletionItem(n, help=self.brief(n)) for n in names]
        return [*items, *click.Command.shell_complete(self, ctx, incomplete)]

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The group's own options, then those every command takes (`parse_args` moves them
        after the command's name, so they are no option of the group's), then the commands."""
        from runagent.cli.options import common

        click.Command.format_options(self, ctx, formatter)
        shared = click.command("shared")(common(lambda **_: None))
        rows = [r for p in shared.params if (r := p.get_help_record(ctx)) is not None]
        with formatter.section("Options of every command (before or after its name)"):
            formatter.write_dl(rows)
        self.format_commands(ctx, formatter)

    def invoke(self, ctx: click.Context) -> Any:
        collect()  # the command is loaded: what it makes from here on may be collected
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # click's own: one line too, with where to read more
            if (
                type(exc).__name__ == "NoArgsIsHelpError"
            ):  # click >= 8.2 showing a bare group's help
                raise
            where = exc.ctx.command_path if exc.ctx is not None else "run-agent"
            fail(f"{exc.format_message()} (see `{where} --help`)", ExitCode.USAGE)
        except RunAgentError as exc:
            fail(str(exc), exc.exit_code)
        except BrokenPipeError:  # `run-agent list | head -1`: the reader stopped reading
            _quiet_stdout()
            sys.exit(ExitCode.COMPLETED)
        except OSError as exc:  # a folder or file the system refused: say which, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", ExitCode.FAILED)
        except KeyboardInterrupt:
            sys.exit(ExitCode.STOPPED)


class SubGroup(click.Group):
    """A group under `run-agent` (`schedule`, `ops`, `paste`): an unknown sub-command is one
    line with "did you mean", or the list of its commands, as at the top level."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        word = args[0] if args else ""
        if word in self.commands or word.startswith("-") or ctx.resilient_parsing:
            return super().resolve_command(ctx, args)
        close = close_names(word.lower(), list(self.commands))
        if close:
            fail(f"unknown command {word!r}; did you mean `{ctx.command_path} {close[0]}`?",
                 ExitCode.USAGE)  # fmt: skip
        fail(f"unknown command {word!r}; `{ctx.command_path}` has: "
             f"{', '.join(sorted(self.commands))}", ExitCode.USAGE)  # fmt: skip


RunAgentGroup.group_class = SubGroup  # every `@cli.group()` is one


IMPLICIT_RUN = "run-agent.implicit-run"  # ctx.meta: the command line had no command name


def _leading_common(args: list[str]) -> tuple[list[str], list[str]]:
    """The `--config X` / `--root R` options before the command name, and the rest."""
    common: list[str] = []
    i = 0
    while i < len(args):
        name, eq, _ = args[i].partition("=")
        if name not in COMMON:
            break
        take = 1 if eq else 2
        common += args[i : i + take]
        i += take
    return common, args[i:]


def _after_command(
    group: click.Group, ctx: click.Context, args: list[str], common: list[str]
) -> list[str]:
    """`args` with `common` placed after the command name (and a sub-command's name)."""
    command = group.get_command(ctx, args[0])
    at = 1
    if isinstance(command, click.Group) and len(args) > 1 and args[1] in command.commands:
        at = 2
    return [*args[:at], *common, *args[at:]]


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises no second BrokenPipeError."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def fail(message: str, code: ExitCode) -> NoReturn:
    from runagent.store.credentials import scrub_urls  # a URL's password is never printed

    click.echo(f"run-agent: {scrub_urls(message)}", err=True)
    sys.exit(int(code))


@click.group(cls=RunAgentGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="run-agent", message=VERSION_LINE)
def cli() -> None:
    """Run an AI coding agent in a supervised run folder, restarting it until the task is done.

    `run-agent --project P --task T "prompt"` is short for `run-agent run ...`.
    """


def collect() -> None:
    """Let the collector run again, leaving out what the command loaded until now (nor will
    the interpreter's last collection at exit walk it): `main` turns it off while loading."""
    import gc

    if not gc.isenabled():
        gc.freeze()
        gc.enable()
