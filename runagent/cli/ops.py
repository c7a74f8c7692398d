"""ops: apply JSON operations to a workspace, and answer an operation held for approval."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

from runagent.cli.foreground import STOP_SIGNALS
from runagent.cli.group import cli
from runagent.cli.options import PathValue, common, json_option, setup
from runagent.cli.show import print_table
from runagent.config import userfile
from runagent.errors import ExitCode, RunAgentError, UsageError
from runagent.loop.context import new_run_id, validate_id
from runagent.ops.protocol import MAX_MESSAGE_BYTES
from runagent.ops.sandbox import Sandbox
from runagent.store.runfolder import TaskPaths, confine

if TYPE_CHECKING:
    from runagent.ops.event import EventsMessage
    from runagent.ops.runtime import Runtime

POLICIES = ("restrictive", "standard", "permissive")


@cli.group()
def ops() -> None:
    """Run JSON operations from a model in a workspace (files, shell) under a policy.

    The messages and events are those of spec/operations-protocol.md; every message and every
    answer is kept in the run's folder (operations.jsonl, events.jsonl).
    """


@ops.command()
@click.argument("file", metavar="FILE|-")
@click.option(
    "--workspace",
    "-w",
    type=PathValue(file_okay=False, path_type=Path),
    help="The folder the operations act in (required for a new run).",
)
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    default=None,
    help="What runs freely, what asks first (default: standard).",
)
@click.option(
    "--sandbox",
    type=click.Choice([s.value for s in Sandbox]),
    default=None,
    help="Where shell operations run: bwrap (bubblewrap: no network, only the workspace "
    "writable; refused in one line where bwrap is unusable), none, or auto: bwrap where it "
    "works here (default: the config's ops.sandbox, else auto).",
)
@click.option("--run", "run_id", help="Continue this operations run (its workspace and policy).")
@click.option(
    "--project",
    "-p",
    "project_id",
    default="ops",
    show_default=True,
    help="Project the run is kept under.",
)
@click.option(
    "--task", "-t", "task_id", default="ops", show_default=True, help="Task the run is kept under."
)
@common
def apply(
    file: str, workspace: Path | None, policy: str | None, sandbox: str | None,
    run_id: str | None, project_id: str, task_id: str, config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    """Apply the operations message in FILE ('-' reads standard input) and print the events.

    The events message is printed as JSON; its status is completed, awaiting_approval (answer
    with `run-agent ops approve|deny RUN OPERATION_ID`) or error (exit 1).
    """
    from runagent.ops.runtime import Runtime, find_run  # only this command pays for the runtime

    s = setup(config_path, root)
    text = _message(file)  # read, and refused if too large, before any run is made
    if run_id is not None:
        if workspace is not None or policy is not None or sandbox is not None:
            raise UsageError(
                "--run continues a run with its own workspace, policy and sandbox; "
                "leave out --workspace, --policy and --sandbox"
            )
        runtime = Runtime.open(find_run(s.root, validate_id("run", run_id)))
    else:
        if workspace is None:
            raise UsageError("--workspace is required: the folder the operations act in")
        task = confine(
            TaskPaths(s.root, validate_id("project", project_id), validate_id("task", task_id))
        )
        runtime = Runtime.create(
            task.run_folder(new_run_id()),
            workspace,
            policy or "standard",
            Sandbox(sandbox or s.config.ops.sandbox),
        )
    with _turn(runtime):
        waiting = runtime.pending
        if waiting is not None and not _answers(text):
            raise UsageError(
                f"run {runtime.run_id} awaits approval of operation {waiting.operation_id!r} "
                "from an earlier message; answer it first (run-agent ops approve|deny "
                f"{runtime.run_id} {waiting.operation_id}): this message was not applied"
            )
        reply = runtime.receive_text(text)
    _print(reply)


@ops.command(name="list")
@json_option
@common
def list_(as_json: bool, config_path: Path | None, root: Path | None) -> None:
    """List the operations runs under the runs root and what each is doing: running,
    awaiting_approval (of which operation) or done."""
    from runagent.ops.runs import all_runs, describe

    s = setup(config_path, root)
    rows = []
    for folder in all_runs(s.root):
        try:
            rows.append(describe(folder))
        except RunAgentError as exc:  # one unreadable run does not hide the others
            click.echo(f"run-agent: {exc}", err=True)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no operations runs {s.where()}", err=True)
        return
    table = [
        [
            r["runId"], r["project_id"], r["task_id"], r["state"],
            r["pending"]["operationId"] if r["pending"] else "", r["policy"], r["workspace"],
        ]
        for r in rows
    ]  # fmt: skip
    print_table(table, ["RUN", "PROJECT", "TASK", "STATE", "AWAITING", "POLICY", "WORKSPACE"])


@ops.command()
@click.argument("run_id", metavar="RUN")
@click.argument("operation_id")
@click.option("--reason", help="Why (kept with the answer).")
@common
def approve(
    run_id: str, operation_id: str, reason: str | None, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Approve the operation RUN is paused on: it runs once, then the batch goes on."""
    _answer(run_id, operation_id, "approved", reason, config_path, root)


@ops.command()
@click.argument("run_id", metavar="RUN")
@click.argument("operation_id")
@click.option("--reason", help="Why (told to the model).")
@common
def deny(
    run_id: str, operation_id: str, reason: str | None, config_path: Path | None,
    root: Path | None,
) -> None:  # fmt: skip
    """Deny the operation RUN is paused on: it is reported as denied, and the batch goes on."""
    _answer(run_id, operation_id, "denied", reason, config_path, root)


def _answer(
    run_id: str, operation_id: str, decision: str, reason: str | None,
    config_path: Path | None, root: Path | None,
) -> None:  # fmt: skip
    from runagent.ops.approval import awaited
    from runagent.ops.runtime import Runtime, find_run

    s = setup(config_path, root)
    runtime = Runtime.open(find_run(s.root, validate_id("run", run_id)))
    with _turn(runtime):
        awaited(runtime.pending, run_id, operation_id)
        answer = {"operationId": operation_id, "decision": decision, "reason": reason}
        reply = runtime.receive({"approval": {k: v for k, v in answer.items() if v is not None}})
    _print(reply)


@contextlib.contextmanager
def _turn(runtime: Runtime) -> Iterator[None]:
    """Hold the run's turn, waiting for it (and saying so) while another process answers a
    message; a stop signal (SIGINT, SIGTERM, SIGHUP) ends the batch recorded, with exit 130.

    SIGINT is set here even when it was ignored: a shell starts a background job (`&`) with
    SIGINT ignored, and such an `ops apply` must still stop on it, recorded."""
    from runagent.ops.runtime import Interrupted

    def stop(signum: int, frame: object) -> None:
        for sig in STOP_SIGNALS:  # one stop is enough: the record of it is written whole
            signal.signal(sig, signal.SIG_IGN)
        raise Interrupted(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    runtime.on_busy = lambda why: click.echo(f"run-agent: {why}; waiting for its turn", err=True)
    entered = False
    try:
        with runtime.turn():
            entered = True
            yield
    except Interrupted as exc:
        if exc.reply is not None:
            click.echo(json.dumps(exc.reply.to_dict(), indent=2))
            note = "; what ran is recorded in the run's folder"
        else:
            note = "" if entered else " while waiting for the run's turn; nothing was applied"
        click.echo(f"run-agent: stopped by {exc.signal_name}{note}", err=True)
        sys.exit(int(ExitCode.STOPPED))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _answers(text: str) -> bool:
    """Whether the message is an answer to a pause (which a paused run takes)."""
    from runagent.ops import approval

    try:
        return approval.is_answer(json.loads(text))
    except (ValueError, RecursionError):
        return False


def _message(file: str) -> str:
    """The operations message in `file` ('-': standard input), at most MAX_MESSAGE_BYTES; bytes
    that are not UTF-8 are kept as they are, for the runtime to answer."""
    if file == "-":
        data = userfile.read_stream(sys.stdin.buffer, MAX_MESSAGE_BYTES, "the message on stdin")
    else:
        data = userfile.read_file(Path(file), MAX_MESSAGE_BYTES, "message file")
    return data.decode("utf-8", errors="surrogateescape")


def _print(reply: EventsMessage) -> None:
    from runagent.ops.protocol import Status

    click.echo(json.dumps(reply.to_dict(), indent=2))
    if reply.status is Status.ERROR:
        sys.exit(int(ExitCode.FAILED))
