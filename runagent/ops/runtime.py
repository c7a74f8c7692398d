"""The operations runtime of one run: a batch in, its events out, paused for approvals, recorded.

Operations run in order, each answered by exactly one event. A malformed operation is answered by
an `error` event (category `validation`) and skipped; a denied one by `policyDenied`; one the
policy holds for approval stops the batch (`awaiting_approval`), its state saved in the run folder
for whichever process answers. Every message received goes to `operations.jsonl` and every events
message to `events.jsonl`. Nothing a model sends makes the runtime raise.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from runagent.errors import NotFoundError, UsageError
from runagent.ops import approval
from runagent.ops.approval import Answer, Pending
from runagent.ops.event import Event, EventsMessage, approval_required, error, event, policy_denied
from runagent.ops.operation import (
    BadMessage,
    CreateFile,
    DeleteFile,
    EditFile,
    Invalid,
    Message,
    Operation,
    ReadFile,
    Shell,
    read_message,
    read_operation,
)
from runagent.ops.policy import Decision, Policy, Verdict
from runagent.ops.protocol import Clock, Encoding, ErrorCategory, EventType, Status, iso, utc_now
from runagent.ops.sandbox import SANDBOXED, Bwrap, InForce, Sandbox
from runagent.ops.shell import run_shell, shell_environment
from runagent.ops.turn import TurnLock
from runagent.ops.workspace import Workspace, WorkspaceError
from runagent.record import record
from runagent.store import runfolder
from runagent.store.runfolder import RunPaths


@record
class Settings:
    """What an operations run acts with, kept in its folder so any process can resume it."""

    workspace: Path
    policy: str
    sandbox: Sandbox = Sandbox.NONE  # what is in force: never AUTO, which create resolves
    rules: Mapping[str, object] = dataclasses.field(default_factory=dict)  # added to the preset
    shell: str | None = None  # what runs shell commands with -c (None: bash, else sh)
    # The line every shell event carries: "sandboxed (bubblewrap)" or "not sandboxed: <why>".
    sandbox_line: str = ""

    def to_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            "workspace": str(self.workspace),
            "policy": self.policy,
            "sandbox": self.sandbox.value,
            "sandbox_line": self.sandbox_line,
        }
        if self.rules:
            found["rules"] = dict(self.rules)
        if self.shell:
            found["shell"] = self.shell
        return found

    def make_policy(self) -> Policy:
        if not self.rules:
            return Policy.preset(self.policy)
        return Policy.from_config({"policy": self.policy, "rules": self.rules})


class Interrupted(KeyboardInterrupt):
    """A stop signal that ends the batch: raised by the handler the command line sets for
    SIGINT, SIGTERM and SIGHUP, and raised on by the runtime with the events message it
    recorded (None when the signal came before any operation ran)."""

    def __init__(self, signal_name: str, reply: EventsMessage | None = None) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name
        self.reply = reply


def _queue_quietly(why: str) -> None:
    """By default a message waits for the run's turn without a word."""


class Runtime:
    """The runtime of one run folder. `create` starts a run, `open` continues one."""

    def __init__(
        self, paths: RunPaths, settings: Settings, *, clock: Clock = utc_now,
        workspace: Workspace | None = None, policy: Policy | None = None,
        environment: Mapping[str, str] | None = None,
        on_busy: Callable[[str], None] | None = _queue_quietly,
    ) -> None:  # fmt: skip
        """`workspace`, `policy` and `environment` (what shell commands start from, default a
        few variables of this process) are seams; by default they follow `settings`.
        `on_busy`: while another process answers a message of this run, this one is told why
        and waits its turn; None refuses instead (AlreadyRunningError)."""
        self.paths = paths
        self.on_busy = on_busy
        self._turns = 0  # how deep this runtime is in its own turn
        self.settings = settings
        self.workspace = workspace or Workspace(settings.workspace)
        _refuse_inside(self.workspace.root, paths.folder)
        self.policy = policy or settings.make_policy()
        self.environment = shell_environment() if environment is None else dict(environment)
        self._clock = clock

    @classmethod
    def create(
        cls, folder: Path, workspace: Path, preset: str, sandbox: Sandbox = Sandbox.AUTO,
        rules: Mapping[str, object] | None = None, shell: str | None = None, **kw: Any,
    ) -> Runtime:  # fmt: skip
        """A new run in `folder`, acting in `workspace` under the policy `preset` (with `rules`
        added to it, as the config's `ops.rules`) and the OS `sandbox`: `bwrap` must be usable
        here (else MissingDependencyError, nothing written), `auto` uses it where it is; `shell`
        runs shell commands."""
        root = Workspace(workspace).root
        if Sandbox(sandbox) is Sandbox.BWRAP:
            Bwrap(root).check()
        in_force = InForce.of(Sandbox(sandbox), root)
        settings = Settings(root, preset, in_force.sandbox, dict(rules or {}), shell, in_force.line)
        settings.make_policy()  # a bad name or rule is refused before anything is written
        _refuse_inside(settings.workspace, folder)
        runfolder.make_folder(folder)
        paths = RunPaths(folder)
        runfolder.atomic_write(paths.ops_settings, json.dumps(settings.to_dict()))
        return cls(paths, settings, **kw)

    @classmethod
    def open(cls, folder: Path, **kw: Any) -> Runtime:
        paths = RunPaths(folder)
        try:
            data = json.loads(runfolder.read_text_in(paths.fence, paths.ops_settings))
            sandbox = Sandbox(data.get("sandbox", "none"))
            if sandbox is Sandbox.AUTO:
                raise ValueError("sandbox auto was never resolved")
            settings = Settings(
                Path(data["workspace"]),
                str(data["policy"]),
                sandbox,
                dict(data.get("rules") or {}),
                str(data["shell"]) if data.get("shell") else None,
                # A run from before the line was kept: its sandbox was chosen explicitly.
                str(data.get("sandbox_line") or _line(sandbox)),
            )
        except FileNotFoundError:
            raise NotFoundError(
                f"{folder} is not an operations run (no {paths.ops_settings.name})"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{paths.ops_settings} cannot be read: {exc}") from exc
        return cls(paths, settings, **kw)

    @property
    def run_id(self) -> str:
        return self.paths.folder.name

    @property
    def pending(self) -> Pending | None:
        return approval.peek(self.paths.approval_pending)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Hold the run's turn (see `turn`): what is read of the run inside, such as `pending`,
        stays true until the message is answered. Re-entrant within this runtime."""
        if self._turns:
            self._turns += 1
            try:
                yield
            finally:
                self._turns -= 1
            return
        lock = TurnLock(self.paths.ops_lock, self.run_id)
        lock.acquire(self.on_busy)
        self._turns = 1
        try:
            yield
        finally:
            self._turns = 0
            lock.release()

    def receive_text(self, text: str) -> EventsMessage:
        """Answer one message as sent: JSON text (what is not JSON gets an error event)."""
        with self.turn():
            return self._receive_text(text)

    def _receive_text(self, text: str) -> EventsMessage:
        try:
            value = json.loads(text)
        except RecursionError:  # valid JSON, maybe, but deeper than the parser goes
            self._record(text)
            why = "the message is nested too deep to read; nest objects and arrays less deeply"
            return self._answered(self._reply(Status.ERROR, [self._invalid(why)]))
        except ValueError as exc:
            self._record(text)
            why = f"the message is not JSON ({type(exc).__name__}: {str(exc)[:200]})"
            return self._answered(self._reply(Status.ERROR, [self._invalid(why)]))
        return self._receive(value)

    def receive(self, value: object) -> EventsMessage:
        """Answer one decoded message: operations, or an answer to a pause."""
        with self.turn():
            return self._receive(value)

    def _receive(self, value: object) -> EventsMessage:
        self._record(value)
        return self._answered(
            self._answer(value) if approval.is_answer(value) else self._apply(value)
        )

    def _answered(self, reply: EventsMessage) -> EventsMessage:
        runfolder.append_line(self.paths.events, json.dumps(reply.to_dict()))
        return reply

    def _invalid(self, why: str) -> Event:
        return error(ErrorCategory.VALIDATION, why, self._now())

    def _apply(self, value: object) -> EventsMessage:
        waiting = self.pending
        if waiting is not None:
            why = (
                f"run {self.run_id} awaits approval of operation {waiting.operation_id!r}; "
                "approve or deny it before sending more operations"
            )
            return self._reply(Status.AWAITING_APPROVAL, [self._invalid(why)])
        batch = read_message(value)
        if isinstance(batch, BadMessage):
            return self._reply(
                Status.ERROR, [error(ErrorCategory.VALIDATION, batch.reason, self._now())]
            )
        return self._run(batch.raw, list(batch.entries), 0, [])

    def _answer(self, value: object) -> EventsMessage:
        answer = approval.read_answer(value)
        waiting = self.pending
        if waiting is None:
            why = f"nothing in run {self.run_id} awaits approval"
            return self._reply(Status.ERROR, [self._invalid(why)])
        if isinstance(answer, str) or not _meant_for(answer, waiting):
            why = (
                answer
                if isinstance(answer, str)
                else (
                    f"operation {answer.operation_id!r} does not await approval; "
                    f"{waiting.operation_id!r} does"
                )
            )
            return self._reply(Status.AWAITING_APPROVAL, [self._invalid(why)])
        taken = approval.take(self.paths.approval_pending)
        if taken is None:
            why = f"operation {waiting.operation_id!r} was answered meanwhile by another process"
            return self._reply(Status.ERROR, [self._invalid(why)])
        at = taken.position
        raw = taken.operations
        if approval.digest(raw[at]) != taken.digest:
            why = f"operation {taken.operation_id!r} changed since approval was asked; not run"
            return self._reply(
                Status.ERROR, [error(ErrorCategory.SYSTEM, why, self._now(), taken.operation_id)]
            )
        entries = [read_operation(op, i) for i, op in enumerate(raw)]
        paused = entries[at]
        assert not isinstance(paused, Invalid)  # it was valid when it paused, and is unchanged
        # An operation sent without an id was given one for its pause: its result carries it.
        entries[at] = dataclasses.replace(paused, id=taken.operation_id)
        if answer.approved:
            return self._run(raw, entries, at, [], approved=at)
        reason = f"denied by the user{': ' + answer.reason if answer.reason else ''}"
        suggestion = taken.suggestion or "do it another way, or ask the user first"
        denied = policy_denied(paused.type, taken.operation_id, self._now(), reason, suggestion)
        return self._run(raw, entries, at + 1, [denied])

    def _run(
        self, raw: tuple[Any, ...], entries: list[Operation | Invalid], start: int,
        events: list[Event], approved: int | None = None,
    ) -> EventsMessage:  # fmt: skip
        at = start
        try:
            for at in range(start, len(entries)):
                reply = self._step(raw, entries, at, events, approved)
                if reply is not None:
                    return reply
        except KeyboardInterrupt as exc:  # a signal: what ran is recorded, then the stop goes on
            raise self._interrupted(exc, entries, start, at, events) from exc
        return self._reply(Status.COMPLETED, events)

    def _interrupted(
        self, exc: KeyboardInterrupt, entries: list[Operation | Invalid], start: int, at: int,
        events: list[Event],
    ) -> Interrupted:  # fmt: skip
        """Record a batch stopped by a signal at operation `at`: in operations.jsonl which
        operations were answered, which one was stopped and which never ran; in events.jsonl the
        events so far and an error event saying so."""
        name = exc.signal_name if isinstance(exc, Interrupted) else "SIGINT"
        op = entries[at] if at < len(entries) else None
        op_id = op.id if op is not None else None
        not_run = list(range(at + 1, len(entries)))
        note = {
            "signal": name, "answered": list(range(start, at)), "stopped": at,
            "operationId": op_id, "notRun": not_run,
        }  # fmt: skip
        runfolder.append_line(
            self.paths.operations, json.dumps({"timestamp": self._now(), "interrupted": note})
        )
        why = (
            f"interrupted by {name} during operations[{at}]"
            + (f" ({op_id!r})" if op_id else "")
            + (f"; operations[{not_run[0]}] to [{not_run[-1]}] were not run" if not_run else "")
        )
        stopped = error(ErrorCategory.SYSTEM, why, self._now(), op_id)
        reply = self._answered(self._reply(Status.ERROR, [*events, stopped]))
        return Interrupted(name, reply)

    def _step(
        self, raw: tuple[Any, ...], entries: list[Operation | Invalid], i: int,
        events: list[Event], approved: int | None,
    ) -> EventsMessage | None:  # fmt: skip
        """Answer operation `i` into `events`; the reply when the batch stops there for approval."""
        op = entries[i]
        if isinstance(op, Invalid):
            details = {"index": op.index, "field": op.field}
            events.append(error(ErrorCategory.VALIDATION, op.message, self._now(), op.id, details))
            return None
        decision = None if i == approved else self._decide(op)
        if decision is not None and decision.verdict is Verdict.DENY:
            events.append(
                policy_denied(op.type, op.id, self._now(), decision.reason, decision.suggestion)
            )
            return None
        if decision is not None and decision.verdict is Verdict.APPROVE:
            op_id = op.id or f"operation-{i + 1}"  # ids are optional; a pause needs one
            asked = {**_subject(op), "policy": decision.rule}
            events.append(approval_required(op.type, op_id, self._now(), decision.reason, asked))
            pending = Pending(
                op_id, i, raw, tuple(events), approval.digest(raw[i]), decision.suggestion
            )
            approval.save(self.paths.approval_pending, pending)
            return self._reply(Status.AWAITING_APPROVAL, events)
        events.append(self._execute(op))
        return None

    def _decide(self, op: Operation) -> Decision | None:
        if isinstance(op, Message):
            return None
        if isinstance(op, Shell):
            return self.policy.check_command(op.command, dict(op.env))
        return self.policy.check_path(op.type.value, op.path)

    def _execute(self, op: Operation) -> Event:
        """The operation's event; a failure is data (success false), never an exception."""
        try:
            return self._perform(op)
        except (WorkspaceError, OSError, UnicodeError) as exc:  # Unicode: a lone surrogate
            fields = (
                {"command": op.command}
                if isinstance(op, Shell)
                else {"path": getattr(op, "path", None)}
            )
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            kind = EventType(op.type.value)
            return event(kind, op.id, self._now(), **fields, success=False, error=why)
        except Exception as exc:  # a fault of the runtime itself: reported, and the batch goes on
            return error(ErrorCategory.SYSTEM, f"{type(exc).__name__}: {exc}", self._now(), op.id)

    def _perform(self, op: Operation) -> Event:
        kind = EventType(op.type.value)
        if isinstance(op, Message):
            return event(kind, op.id, self._now(), success=True)
        if isinstance(op, CreateFile):
            written = self.workspace.write(op.path, op.data, overwrite=op.overwrite)
            return event(kind, op.id, self._now(), path=op.path, success=True, bytesWritten=written)
        if isinstance(op, ReadFile):
            data = self.workspace.read(op.path)
            if op.encoding is Encoding.BASE64:
                content = base64.b64encode(data).decode("ascii")
            else:
                try:
                    content = data.decode("utf-8")
                except UnicodeDecodeError:
                    raise WorkspaceError(
                        f"{op.path} is not UTF-8 text; read it with encoding base64"
                    ) from None
            return event(
                kind,
                op.id,
                self._now(),
                path=op.path,
                success=True,
                content=content,
                encoding=op.encoding.value,
                size=len(data),
            )
        if isinstance(op, EditFile):
            applied = self._edit(op)
            return event(kind, op.id, self._now(), path=op.path, success=True, editsApplied=applied)
        if isinstance(op, DeleteFile):
            self.workspace.delete(op.path)
            return event(kind, op.id, self._now(), path=op.path, success=True)
        cwd = self.workspace.folder(op.cwd or "")
        result = run_shell(
            op.command, cwd, op.timeout_ms, {**self.environment, **dict(op.env)},
            Bwrap(self.workspace.root) if self.settings.sandbox is Sandbox.BWRAP else None,
            self.settings.shell, self.paths.folder,
        )  # fmt: skip
        return event(
            kind, op.id, self._now(), command=op.command,
            success=result.exit_code == 0 and not result.timed_out and result.error is None,
            exitCode=result.exit_code, stdout=result.stdout, stderr=result.stderr,
            durationMs=result.duration_ms, error=result.error, timedOut=result.timed_out or None,
            sandbox=self.settings.sandbox_line or None,
        )  # fmt: skip

    def _edit(self, op: EditFile) -> int:
        """Apply every edit in order, each to its first occurrence, or none of them."""
        try:
            text = self.workspace.read(op.path).decode("utf-8")
        except UnicodeDecodeError:
            raise WorkspaceError(f"{op.path} is not UTF-8 text; it cannot be edited") from None
        for n, edit in enumerate(op.edits, 1):
            where = f"edit {n} of {len(op.edits)}"
            if not edit.old:
                raise WorkspaceError(f"{where}: oldContent is empty; say what to replace")
            at = text.find(edit.old)
            if at < 0:
                raise WorkspaceError(f"{where}: oldContent not found; no edit was applied")
            text = text[:at] + edit.new + text[at + len(edit.old) :]
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (\ud800) in a newContent
            raise WorkspaceError("newContent is not valid Unicode; no edit was applied") from None
        self.workspace.write(op.path, data, overwrite=True)
        return len(op.edits)

    def _record(self, value: object) -> None:
        try:
            line = json.dumps({"timestamp": self._now(), "message": value})
        except (TypeError, ValueError, RecursionError) as exc:
            line = json.dumps(
                {"timestamp": self._now(), "unrecorded": f"{type(exc).__name__}: {exc}"}
            )
        runfolder.append_line(self.paths.operations, line)

    def _reply(self, status: Status, events: list[Event]) -> EventsMessage:
        return EventsMessage(self.run_id, status, tuple(events))

    def _now(self) -> str:
        return iso(self._clock())


def _refuse_inside(workspace: Path, folder: Path) -> None:
    """Refuse a run folder inside its workspace: the operations write anywhere in it, so they
    could rewrite ops.json (their own workspace and policy) or forge a pending approval."""
    if runfolder.within(workspace, folder):
        raise UsageError(
            f"the run folder {folder} is inside the workspace {workspace}, where the operations "
            "could rewrite it; keep the runs root out of the workspace"
        )


def _line(sandbox: Sandbox) -> str:
    return SANDBOXED if sandbox is Sandbox.BWRAP else InForce.of(Sandbox.NONE, Path()).line


def _meant_for(answer: Answer, waiting: Pending) -> bool:
    if answer.operation_id is not None and answer.operation_id != waiting.operation_id:
        return False
    return answer.digest is None or answer.digest == waiting.digest


def _subject(op: Operation) -> dict[str, str]:
    """What an approvalRequired event's details name: the command, or the path."""
    if isinstance(op, Shell):
        return {"command": op.command}
    if isinstance(op, Message):
        return {}
    return {"path": op.path}


def find_run(root: Path, run_id: str) -> Path:
    """The folder of the operations run `run_id` under the runs root, in whichever task it is."""
    for project in runfolder.project_ids(root):
        bounds = runfolder.fence(root, project)
        for task in runfolder.task_ids(root, project):
            folder = runfolder.TaskPaths(root, project, task).run_folder(run_id)
            if runfolder.is_file_in(bounds, RunPaths(folder).ops_settings):  # none linked in
                return folder
    raise NotFoundError(f"no operations run {run_id!r} under {root}")
