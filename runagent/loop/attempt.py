"""One run of an agent: its folder, context and prompt, its start, timeouts, verdict and record.

The loop (supervisor.py) makes an Attempt for each run and weighs what it `Ended` as; the attempt
does the rest: it creates the run folder and writes prompt.md, starts the agent, watches it for
both timeouts and a stop request, judges its end (the completion rule judges exit 0), asks the
backend why a failure failed, writes output.md, and records every step in run-info.yaml with
secrets redacted. A write that fails (a full disk) fails the run and says which file.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from runagent.config.settings import AgentSandbox
from runagent.errors import ExitCode, MissingDependencyError, RunAgentError
from runagent.loop.backend import Backend
from runagent.loop.budget import SHARED_EVERY, Spending
from runagent.loop.completion import CompletionRule, Verdict
from runagent.loop.context import LoopRequest, RunContext, agent_environment, new_run_id
from runagent.loop.events import Event, EventKind
from runagent.loop.failure import Diagnosis
from runagent.loop.prompt import compose
from runagent.loop.redaction import Redactor
from runagent.process import AgentProcess, LaunchSpec, SpawnError, start_reaper_early
from runagent.record import record
from runagent.store import runfolder, steering, taskfolder
from runagent.store.host import this_host
from runagent.store.runfolder import RunPaths, TaskPaths
from runagent.store.runinfo import Reason, RunInfo, RunStatus, Usage

if TYPE_CHECKING:
    from runagent.loop.sandbox import Reach

BUDGET_TICK = 0.2  # seconds between looks at a run's usage while a budget is set
LIVE_USAGE_EVERY = 1.0  # seconds between writes of a budgeted run's usage so far
DAILY_RECOUNT = 3.0  # seconds between reads of the day's other runs, under a daily budget
COPY_LIMIT = 1 << 20  # stdout up to this size is copied into output.md; beyond, hard-linked
# Failures a backend may explain from the agent's output (a rate limit, an API error, ...).
_EXPLICABLE = (Reason.EXIT_CODE, Reason.CRASH)


class StopSignal:
    """A stop request that wakes whoever waits for it at once: `request()` is safe in a signal
    handler, and `fileno()` becomes readable, so a select() over it returns."""

    def __init__(self) -> None:
        self.requested = False
        self._read, self._write = os.pipe()
        for fd in (self._read, self._write):
            os.set_blocking(fd, False)

    def request(self) -> None:
        self.requested = True
        if self._write >= 0:  # once closed, its number may be another file's
            with contextlib.suppress(OSError):
                os.write(self._write, b"s")

    def fileno(self) -> int:
        return self._read

    def drain(self) -> None:
        """Take the wake-ups out of the pipe, so the next select() waits again."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 1024)

    def wait(self, seconds: float) -> bool:
        """Wait `seconds` unless a stop comes first; True if it did."""
        deadline = time.monotonic() + seconds
        while not self.requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self._read], [], [], remaining)
            if ready:
                self.drain()
        return True

    def close(self) -> None:
        for fd in (self._read, self._write):
            if fd >= 0:
                os.close(fd)
        self._read = self._write = -1


class Start(Protocol):
    """How an agent process is started: `AgentProcess.start`, or a stand-in with its shape."""

    def __call__(
        self, spec: LaunchSpec, stdout: Path, stderr: Path, *, grace: float
    ) -> AgentProcess: ...


@record
class Supervision:
    """What a loop lends each of its attempts: the agent and its completion rule, and how a run
    is started, timed, stopped, reported and redacted."""

    request: LoopRequest
    backend: Backend
    rule: CompletionRule
    # Applied to all the agent's output run-agent copies: run-info and the next prompt.
    redactor: Redactor
    stop: StopSignal
    on_event: Callable[[Event], None]
    start: Start
    clock: Callable[[], float]
    tick: float  # how often a running agent's output is checked (and a TICK event sent)
    supervisor_pid: int
    supervisor_start: float | None


@record
class Ended:
    """What an attempt ended as, for the loop to weigh."""

    info: RunInfo
    duration: float  # seconds from its start, by the supervision's clock
    diagnosis: Diagnosis | None = None
    # Of a run told to resume a session its agent could not (gone, expired, refused): the
    # agent's words. The loop starts the next attempt fresh, spending no restart on it.
    refused: str = ""


class _LiveUsage:
    """A budgeted run's usage so far, written into its run-info.yaml at most once a second, so
    `status`, the page's spend of the day and the daily budgets of runs started meanwhile count
    it before the run ends."""

    def __init__(self, attempt: Attempt, now: float) -> None:
        self.attempt = attempt
        self.written_at = self.counted_at = now
        self.used: Usage | None = None
        self.pending: Usage | None = None

    def seen(self, used: Usage | None) -> None:
        self.used = used
        if used is not None and used != self.attempt.info.usage:
            self.pending = used

    def recount(self, now: float) -> bool:
        """Whether the day's other runs (every DAILY_RECOUNT seconds, under a daily budget) or
        the fellow racers' (every SHARED_EVERY, under a race's) were read again: what they
        spent meanwhile counts."""
        spending = self.attempt.spending
        if spending is None or not (spending.daily or spending.shared):
            return False
        if now - self.counted_at < (SHARED_EVERY if spending.shared else DAILY_RECOUNT):
            return False
        self.counted_at = now
        self.attempt.spending = spending.counted(self.attempt.info.run_id)
        return True

    def publish(self, now: float) -> None:
        spending = self.attempt.spending
        every = SHARED_EVERY if spending is not None and spending.shared else LIVE_USAGE_EVERY
        if self.pending is None or now - self.written_at < every:
            return
        attempt, used = self.attempt, self.pending
        attempt.info = attempt.info.replace(
            tokens_in=used.tokens_in, tokens_out=used.tokens_out, cost_usd=used.cost_usd
        )
        self.pending, self.written_at = None, now
        with contextlib.suppress(OSError):  # the run goes on; its end says what it used
            attempt._record()


class Attempt:
    """One run: `Attempt.prepare(...)` makes its folder, prompt and context; `run()` runs it once.

    `info` is the run's record as last written to run-info.yaml.
    """

    def __init__(self, lent: Supervision, ctx: RunContext, info: RunInfo) -> None:
        self.lent = lent
        self.ctx = ctx
        self.info = info
        self.spending: Spending | None = None  # the budgets it runs under (loop/budget.py)
        self.over_budget = ""  # which budget stopped it, in words
        self.reach: Reach | None = None  # what it may touch, when it runs sandboxed
        # Its agent's version, once its --version (asked beside its start) said it.
        self._version: Callable[[float | None], str | None] = lambda wait: None

    @property
    def folder(self) -> Path:
        return self.ctx.run_folder

    @classmethod
    def prepare(
        cls, lent: Supervision, number: int, previous: RunInfo | None, first: int = 1,
        spare: int = 0, session: str | None = None,
    ) -> Attempt:  # fmt: skip
        """Attempt `number` of the task, after `previous` (the task's run before it, if any), in
        a loop whose first attempt was number `first`, where `spare` runs spent no restart (a
        person's --now ended them): its last attempt comes that much later. It resumes the
        agent's `session` (that of `previous`), told only what became of its run, or else
        starts a new session."""
        req = lent.request
        run_id, paths = _new_run_folder(req.task)
        session = session if previous is not None else None
        messages = steering.pending(req.task)  # a person's words since the last attempt
        prompt = compose(
            req, lent.rule, lent.redactor, run_id=run_id, attempt=number, previous=previous,
            first_attempt=first, messages=messages, spare=spare, continued=session is not None,
        )  # fmt: skip
        runfolder.atomic_write(paths.prompt, prompt)
        steering.hand(req.task, run_id, messages)
        env = agent_environment(
            base=req.base_env,
            agent_env=lent.backend.config.env,
            loop_env={**req.loop_env, **lent.rule.environment()},
            task=req.task,
            paths=paths,
            run_id=run_id,
            parent_run_id=req.parent_run_id,
            executable_dir=req.executable_dir,
        )
        if req.settings.idle_timeout:  # what a child that waits quietly must beat (heartbeats)
            env["RUN_AGENT_IDLE_TIMEOUT"] = f"{req.settings.idle_timeout:g}"
        ctx = RunContext(run_id, req.task, prompt, req.working_dir, paths, env, session)
        info = RunInfo(
            run_id=ctx.run_id,
            project_id=ctx.project_id,
            task_id=ctx.task_id,
            attempt=number,
            last_attempt=first + req.settings.max_restarts + spare,
            agent=req.agent_name,
            backend=lent.backend.name,
            start_time=runfolder.timestamp(),
            cwd=str(ctx.working_dir),
            previous_run_id=previous.run_id if previous else None,
            resumed_run_id=previous.run_id if previous is not None and session else None,
            parent_run_id=req.parent_run_id,
            supervisor_pid=lent.supervisor_pid,
            supervisor_start=lent.supervisor_start,
            host=this_host(),
        )
        if number == first and req.queued_since is not None:
            waited = runfolder.seconds_between(req.queued_since, info.start_time)
            info = info.replace(queued_seconds=None if waited is None else round(waited, 3))
        checkout = lent.rule.checkout or req.checkout
        if checkout is not None:
            info = info.replace(
                repo=str(checkout.repo or checkout.folder),
                branch=checkout.branch,
                base_commit=checkout.base,
            )
        return cls(lent, ctx, info)

    def run(self) -> Ended:
        """Start the agent, wait for its end, and record it; a start that fails fails the run."""
        clock = self.lent.clock
        started = clock()
        try:
            process = self._start()
        except RunAgentError as exc:
            code, reason = _spawn_failure(exc)
            _note(self.ctx.paths, str(exc))
            self._finish(code, Verdict(RunStatus.FAILED, reason, str(exc)))
            return Ended(self.info, clock() - started)
        try:
            code, stopped_by = self._watch(process, started)
        finally:
            process.close()
            if self.reach is not None:  # it ran sandboxed
                from runagent.loop import sandbox

                for line in sandbox.after_run(self.reach, self.ctx.working_dir, self.ctx.run_id):
                    _note(self.ctx.paths, line)
            removed = runfolder.disarm(self.folder)  # before anything reads the run's files
            if removed:
                _note(self.ctx.paths, f"removed what was no regular file: {', '.join(removed)}")
        if stopped_by is None and self.spending is not None:
            # Judged as the watch would have: what it reported while it worked crossed a
            # budget, though it ended before the watch read it (its closing report never does).
            self.over_budget = self.spending.crossed(self._working())
            stopped_by = Reason.BUDGET if self.over_budget else None
        verdict, diagnosis = self._judge(code, stopped_by)
        if stopped_by not in (Reason.STOPPED, Reason.STEERED):
            verdict = self._checked(self._unconflicted(verdict))
        refused = self._refused(code) if verdict.status is RunStatus.FAILED else ""
        if refused:
            _note(self.ctx.paths, f"session {self.ctx.session} could not be resumed: {refused}")
        self._finish(code, verdict)
        return Ended(self.info, clock() - started, diagnosis, self.lent.redactor(refused))

    def _start(self) -> AgentProcess:
        backend = self.lent.backend
        spec = backend.launch(self.ctx)
        self._version = backend.version_soon()
        self.info = self.info.replace(
            commandline=backend.commandline(spec), agent_version=self._version(0)
        )
        settings = self.lent.request.settings
        if settings.sandbox is AgentSandbox.BWRAP:  # the agent's process under bubblewrap
            from runagent.loop import sandbox

            reach = sandbox.Reach(
                self.ctx.task, self.folder, tuple(backend.own_files(spec.env)),
                self.lent.request.control, settings.network,
                tuple(backend.login_files(spec.env)), tuple(backend.settings_files(spec.env)),
                backend.login_renamed,
            )  # fmt: skip
            spec = sandbox.wrap(spec, reach)
            self.reach = reach
        self._record()
        self.lent.on_event(Event(EventKind.RUN_STARTED, run=self.info, run_folder=self.folder))
        grace = self.lent.request.settings.kill_grace
        process = self.lent.start(spec, self.ctx.stdout_path, self.ctx.stderr_path, grace=grace)
        if settings.check is not None:  # the check's reaper boots while the agent works
            start_reaper_early()
        self.info = self.info.replace(pid=process.pid, pgid=process.pgid)
        with contextlib.suppress(OSError):  # the run goes on; its end is written, or said unwritten
            self._record()
        return process

    def _watch(self, process: AgentProcess, started: float) -> tuple[int, Reason | None]:
        """Wait for the agent, enforcing both timeouts and stop requests."""
        s, clock, stop = self.lent.request.settings, self.lent.clock, self.lent.stop
        tick = min(self.lent.tick, s.idle_timeout / 5) if s.idle_timeout else self.lent.tick
        if self.spending is not None:  # a crossed budget stops the tree well within a second
            tick = min(tick, BUDGET_TICK)
        deadline = started + s.timeout if s.timeout else None
        last_output = started
        sizes = (0, 0)
        live = _LiveUsage(self, started)
        steered: tuple[int, int] | None = (-1, -1)  # a message sent with --now ends it
        while True:
            now = clock()
            wait = tick if deadline is None else min(tick, deadline - now)
            ready, _, _ = select.select([process.fileno(), stop.fileno()], [], [], max(0.0, wait))
            if stop.fileno() in ready:
                stop.drain()
            if process.fileno() in ready:
                code = process.wait(0)
                if code is not None:
                    return code, None
            if stop.requested:
                return process.stop(s.kill_grace), Reason.STOPPED
            now = clock()
            current = (_size(self.ctx.stdout_path), _size(self.ctx.stderr_path))
            grew = current != sizes
            if grew:
                sizes, last_output = current, now
            if deadline is not None and now >= deadline:
                return process.stop(s.kill_grace), Reason.TIMEOUT
            if s.idle_timeout and now - last_output >= s.idle_timeout:
                return process.stop(s.kill_grace), Reason.IDLE_TIMEOUT
            recounted = live.recount(now)  # also while the output keeps growing
            if self.spending is not None and (grew or recounted):
                if grew:  # what it reported can only change so
                    live.seen(self._usage())
                self.over_budget = self.spending.crossed(self._working())
                if self.over_budget:
                    return process.stop(s.kill_grace), Reason.BUDGET
            live.publish(now)
            sent = steering.stamp(self.ctx.task)
            if sent != steered:
                steered = sent
                if steering.now_waiting(self.ctx.task) is not None:
                    return process.stop(s.kill_grace), Reason.STEERED
            self.lent.on_event(
                Event(EventKind.TICK, run=self.info, run_folder=self.folder, elapsed=now - started)
            )

    def _judge(self, code: int, stopped_by: Reason | None) -> tuple[Verdict, Diagnosis | None]:
        """The verdict on the run's end; a failure the backend can explain takes its reason."""
        verdict = self._verdict(code, stopped_by)
        failed = verdict.status is RunStatus.FAILED
        diagnosis = self._diagnose(code) if failed and verdict.reason in _EXPLICABLE else None
        if diagnosis is None:
            return verdict, None
        message = f"{diagnosis.message} (exit code {code})"
        return Verdict(verdict.status, diagnosis.reason, message), diagnosis

    def _verdict(self, code: int, stopped_by: Reason | None) -> Verdict:
        s = self.lent.request.settings
        if stopped_by is Reason.STOPPED:
            return Verdict(RunStatus.STOPPED, Reason.STOPPED, "stopped on request")
        if stopped_by is Reason.STEERED:
            return Verdict(
                RunStatus.STOPPED, Reason.STEERED,
                "ended for a person's message (--now); the next attempt starts with it",
            )  # fmt: skip
        if stopped_by is Reason.TIMEOUT:
            return Verdict(
                RunStatus.TIMED_OUT, Reason.TIMEOUT, f"ran longer than timeout {s.timeout:g}s"
            )
        if stopped_by is Reason.BUDGET:
            return Verdict(RunStatus.FAILED, Reason.BUDGET, f"budget: {self.over_budget}")
        if stopped_by is Reason.IDLE_TIMEOUT:
            return Verdict(
                RunStatus.TIMED_OUT,
                Reason.IDLE_TIMEOUT,
                f"no output for idle_timeout {s.idle_timeout:g}s",
            )
        if code == 0:
            return self.lent.rule.exit_zero(self.ctx.task)
        if code > 128:
            return Verdict(RunStatus.FAILED, Reason.CRASH, f"killed by signal {code - 128}")
        return Verdict(RunStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code}")

    def _unconflicted(self, verdict: Verdict) -> Verdict:
        """A run that says it is done while the conflicts of a `run-agent rebase` of its
        worktree are not resolved (a conflict marker left, the merge not committed) fails
        (`unresolved_conflict`), and a DONE it left is moved into its folder."""
        req = self.lent.request
        if req.worktree is None or verdict.reason is Reason.WRITE_ERROR:
            return verdict
        said = self.info.replace(status=verdict.status, reason=verdict.reason)
        if not self.lent.rule.is_done(req.task, said):
            return verdict
        from runagent.issues import rebasing

        checkout = self.lent.rule.checkout or req.checkout
        why = rebasing.unresolved(req.task, self.ctx.working_dir,
                                  checkout.dirs if checkout is not None else None)  # fmt: skip
        if not why:
            return verdict
        with contextlib.suppress(OSError):
            runfolder.archive_done(req.task, self.ctx.run_id)
        return Verdict(RunStatus.FAILED, Reason.UNRESOLVED_CONFLICT,
                       f"{why} (the agent {verdict.message})")  # fmt: skip

    def _checked(self, verdict: Verdict) -> Verdict:
        """A run that says it is done (by its completion rule), judged by the task's check when
        it has one: passed, the verdict stands; failed, the run fails (`check_failed`) and a
        DONE it left is moved into its folder, so the next attempt must say so again; a check
        whose program cannot start fails it as a missing program (the loop gives up)."""
        req = self.lent.request
        settings = req.settings
        if settings.check is None or verdict.reason in (
            Reason.WRITE_ERROR,
            Reason.UNRESOLVED_CONFLICT,
        ):
            return verdict
        said = self.info.replace(status=verdict.status, reason=verdict.reason)
        if not self.lent.rule.is_done(req.task, said):
            return verdict
        from runagent.loop import check

        self.lent.on_event(Event(EventKind.CHECKING, run=self.info, run_folder=self.folder,
                                 message=settings.check))  # fmt: skip
        env = agent_environment(
            base=req.base_env, agent_env={},
            loop_env={**req.loop_env, **self.lent.rule.environment()}, task=req.task,
            paths=self.ctx.paths, run_id=self.ctx.run_id, parent_run_id=req.parent_run_id,
            executable_dir=req.executable_dir,
        )  # fmt: skip
        reach = None
        if settings.sandbox is AgentSandbox.BWRAP:  # the agent's sandbox, never the host
            from runagent.loop import sandbox

            reach = sandbox.Reach(req.task, None, control=req.control, network=settings.network)
        given = check.Check(settings.check, settings.check_timeout, settings.kill_grace)
        result = check.run(given, cwd=self.ctx.working_dir, env=env, output=self.ctx.paths.check,
                           stop=self.lent.stop, reach=reach, start=self.lent.start,
                           clock=self.lent.clock)  # fmt: skip
        if reach is not None:
            for line in sandbox.after_check(reach, self.ctx.working_dir, self.ctx.run_id):
                _note(self.ctx.paths, line)
        self.info = self.info.replace(check_command=settings.check,
                                      check_exit_code=result.exit_code,
                                      check_seconds=round(result.seconds, 3))  # fmt: skip
        words = result.words(settings.check_timeout)
        if result.passed:
            return Verdict(verdict.status, verdict.reason, f"{verdict.message}; {words}")
        if result.stopped:
            return Verdict(RunStatus.STOPPED, Reason.STOPPED, f"{words} ({verdict.message})")
        with contextlib.suppress(OSError):  # (one left: the loop judges by the check, not it)
            runfolder.archive_done(req.task, self.ctx.run_id)
        reason = Reason.MISSING_BINARY if result.unstarted else Reason.CHECK_FAILED
        return Verdict(RunStatus.FAILED, reason, f"{words} (the agent {verdict.message})")

    def _diagnose(self, code: int) -> Diagnosis | None:
        try:
            return self.lent.backend.diagnose(self.ctx, code)
        except Exception as exc:  # a parser bug must not lose the run
            _note(self.ctx.paths, f"could not diagnose the failure ({type(exc).__name__}: {exc})")
            return None

    def _refused(self, code: int) -> str:
        if self.ctx.session is None or self.info.pid is None:  # none asked for, or never started
            return ""
        try:
            return self.lent.backend.session_refused(self.ctx, code) or ""
        except Exception as exc:  # a parser bug must not lose the run
            _note(self.ctx.paths, f"could not read the session ({type(exc).__name__}: {exc})")
            return ""

    def _session(self) -> str | None:
        try:
            return self.lent.backend.session_id(self.ctx)
        except Exception as exc:  # a parser bug must not lose the run
            _note(self.ctx.paths, f"could not read the session ({type(exc).__name__}: {exc})")
            return None

    def _usage(self) -> Usage | None:
        return self._read_usage(self.lent.backend.usage)

    def _working(self) -> Usage | None:
        """What it reported while it worked, its closing report left out (Backend)."""
        return self._read_usage(self.lent.backend.working_usage)

    def _read_usage(self, read: Callable[[RunContext], Usage | None]) -> Usage | None:
        try:
            return read(self.ctx)
        except Exception as exc:  # a parser bug must not lose the run
            _note(self.ctx.paths, f"could not read the usage ({type(exc).__name__}: {exc})")
            return None

    def _finish(self, code: int, verdict: Verdict) -> None:
        """Write output.md and the run's end. A write that fails (a full disk) fails the run,
        saying which file and why; if run-info.yaml itself cannot be written, word is left."""
        runfolder.withdraw_approval(self.folder)
        try:
            write_output(self.ctx, self.lent.backend)
        except OSError as exc:  # the error may name agent-stdout.txt, the file copied from
            state = "is truncated" if self.ctx.paths.output.exists() else "was not written"
            verdict = Verdict(
                RunStatus.FAILED,
                Reason.WRITE_ERROR,
                f"{exc.strerror or exc} writing {runfolder.OUTPUT}; {runfolder.OUTPUT} {state} "
                f"(the run ended: {verdict.message})",
            )
        used = self._usage()
        if used is not None:
            with contextlib.suppress(OSError):  # a sum not kept is not a run lost
                taskfolder.add_task_usage(self.ctx.task, used)
        checkout = self.lent.rule.checkout or self.lent.request.checkout
        self.info = self.info.replace(
            head_commit=checkout.head() if checkout is not None else None,
            end_time=runfolder.timestamp(),
            exit_code=code,
            reason=verdict.reason,
            status=verdict.status,
            message=verdict.message,
            tokens_in=used.tokens_in if used else None,
            tokens_out=used.tokens_out if used else None,
            cost_usd=used.cost_usd if used else None,
            session_id=self._session(),
            agent_version=self.info.agent_version or self._version(None),
        )
        try:
            self._record()
        except OSError as exc:
            runfolder.mark_unrecorded(self.folder, exc)
            redactor = self.lent.redactor
            self.info = self._redacted().replace(
                status=RunStatus.FAILED,
                reason=Reason.WRITE_ERROR,
                message=redactor(f"{runfolder.unrecorded_message(exc)}; {verdict.message}"),
            )
        self.lent.on_event(Event(EventKind.RUN_ENDED, run=self.info, run_folder=self.folder))

    def _record(self) -> None:
        """Write run-info with no secret in the text that may quote the agent, and keep what was
        written as `info`."""
        info = self._redacted()
        runfolder.write_run_info(self.folder, info)
        self.info = info

    def _redacted(self) -> RunInfo:
        info, redactor = self.info, self.lent.redactor
        return info.replace(
            message=redactor(info.message) if info.message else info.message,
            commandline=redactor(info.commandline) if info.commandline else info.commandline,
            check_command=redactor(info.check_command) if info.check_command else None,
        )


def write_output(ctx: RunContext, backend: Backend) -> None:
    """output.md: the backend's parsed answer, else stdout (copied, or linked when large)."""
    target = ctx.paths.output
    try:
        text = backend.final_output(ctx)
    except Exception as exc:  # a parser bug must not lose the run
        text = None
        _note(ctx.paths, f"could not parse the output ({type(exc).__name__}: {exc})")
    if text is not None:
        runfolder.atomic_write(target, text)
        return
    target.unlink(missing_ok=True)
    if _size(ctx.stdout_path) <= COPY_LIMIT:
        with open(target, "wb", opener=runfolder.private) as out:
            out.write(ctx.stdout_path.read_bytes())
        return
    try:
        os.link(ctx.stdout_path, target)  # one file: stdout's mode
        return
    except OSError:
        pass
    import shutil  # a large output that cannot be linked is copied in chunks

    with open(ctx.stdout_path, "rb") as given, open(target, "wb", opener=runfolder.private) as out:
        shutil.copyfileobj(given, out)


def _new_run_folder(task: TaskPaths) -> tuple[str, RunPaths]:
    while True:
        run_id = new_run_id()
        try:
            return run_id, RunPaths(runfolder.create_run_folder(task, run_id))
        except FileExistsError:
            continue  # another process of the same pid, long ago; ids move on


def _spawn_failure(exc: RunAgentError) -> tuple[int, Reason]:
    """The exit code and reason recorded for a run that could not be started."""
    if isinstance(exc, SpawnError):
        return exc.code, Reason.MISSING_BINARY if exc.code == 127 else Reason.SPAWN_ERROR
    if isinstance(exc, MissingDependencyError):  # a token file or variable that is not there
        return int(ExitCode.MISSING_DEPENDENCY), Reason.AUTH
    return 126, Reason.SPAWN_ERROR


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _note(paths: RunPaths, text: str) -> None:
    """Add a line of run-agent's own to the run's stderr; best effort (the disk may be full)."""
    try:
        with open(paths.stderr, "a", encoding="utf-8") as f:
            f.write(f"run-agent: {text}\n")
    except OSError:
        pass
