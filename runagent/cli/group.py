"""The `run-agent` command group: how a first word that is no command becomes `run`, and how an
error becomes its one line and its exit code. Only the CLI prints or exits."""

from __future__ import annotations

import sys
from typing import Any, NoReturn

import click

from runagent import __version__
from runagent.errors import ExitCode, RunAgentError


class RunAgentGroup(click.Group):
    """`run-agent ARGS` means `run-agent run ARGS` unless ARGS starts with a command name;
    a RunAgentError becomes its one-line message and its exit code."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["run", *args]
        elif not args:
            args = ["--help"]
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
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
        except OSError as exc:  # a folder or file the system refused: say which, not a traceback
            where = f": {exc.filename}" if exc.filename else ""
            fail(f"{exc.strerror or exc}{where}", ExitCode.FAILED)
        except KeyboardInterrupt:
            sys.exit(ExitCode.STOPPED)


def fail(message: str, code: ExitCode) -> NoReturn:
    click.echo(f"run-agent: {message}", err=True)
    sys.exit(int(code))


@click.group(cls=RunAgentGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="run-agent")
def cli() -> None:
    """Run an AI coding agent in a supervised run folder, restarting it until the task is done.

    `run-agent --project P --task T "prompt"` is short for `run-agent run ...`.
    """
