"""The Ralph loop for one task: attempts, timeouts, backoff, completion, stop, and the task lock."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runagent import completion, runfolder, tasks
from runagent.backend import Backend
from runagent.completion import CompletionRule
from runagent.context import LoopRequest, RunContext, agent_environment, new_run_id
from runagent.errors import ExitCode, MissingDependencyError, RunAgentError
from runagent.events import Event, EventKind, LoopResult, Outcome
from runagent.failure import Diagnosis
from runagent.lock import TaskLock
from runagent.process import AgentProcess, SpawnError, process_start_time
from runagent.prompt import compose
from runagent.redaction import Redactor
from runagent.runfolder import Reason, RunInfo, RunStatus

COPY_LIMIT = 1 << 20  # stdout up to this size is copied into output.md; beyond, hard-linked


@dataclass
class _Tally:
    """What the loop counts between runs."""

    failures: int = 0  # failed runs, which spend the restart budget
    quick: int = 0  # failed runs in a row that ended within crash_loop_seconds
    rate_limited: int = 0  # rate-limited runs in a row, which do not


class Supervisor:
    """Runs one task's loop. Construct, then `run()`; `request_stop()` is safe from a signal."""

    def __init__(
        self,
        request: LoopRequest,
        backend: Backend,
        *,
        on_event: Callable[[Event], None] | None = None,
        tick: float = 1.0,
        redactor: Redactor | None = None,
    ) -> None:
        self.request = request
        self.backend = backend
        # Applied to all the agent's output run-agent copies: run-info and the next prompt.
        self.redactor = redactor or backend.redactor(request.base_env)
        self.settings = request.settings
        self.task = request.task
        self.completion: CompletionRule = completion.rule(request.settings.until)
        self.on_event = on_event or (lambda event: None)
        self.tick = tick
        self.stop_requested = False
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        self._pid = os.getpid()
        self._process_start = process_start_time(self._pid)

    @property
    def label(self) -> str:
        return f"{self.task.project_id}/{self.task.task_id}"

    def request_stop(self) -> None:
        """Stop the loop: the current run's tree is stopped and nothing restarts."""
        self.stop_requested = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"s")

    def run(self) -> LoopResult:
        """Hold the task lock and run attempts until the task completes or the loop gives up."""
        lock = TaskLock(runfolder.confine(self.task).lock, self.label)
        lock.acquire()
        try:
            result = self._loop()
        finally:
            lock.release()
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
        self.on_event(Event(EventKind.LOOP_ENDED, message=result.message, outcome=result.outcome))
        return result

    # The loop -------------------------------------------------------------------------------

    def _loop(self) -> LoopResult:
        previous = self._mark_lost_runs()
        archived = runfolder.archive_done(self.task, previous.run_id if previous else None)
        if archived is not None:
            self.on_event(Event(EventKind.DONE_ARCHIVED, message=f"stale DONE moved to {archived}"))
        runfolder.write_task_prompt(self.task, self.request.prompt)
        s = self.settings
        runs: list[RunInfo] = []
        tally = _Tally()
        delay = s.restart_delay
        attempt = 0
        while True:
            if self.stop_requested:  # asked to stop before this attempt began: do not begin it
                return LoopResult(Outcome.STOPPED, f"task {self.label} stopped", tuple(runs))
            attempt += 1
            info, duration, diagnosis = self._run_once(attempt, previous)
            runs.append(info)
            if info.reason is Reason.WRITE_ERROR:  # a full disk: a restart would fail the same way
                return LoopResult(
                    Outcome.FAILED,
                    f"run {info.run_id}: {info.message}; not restarting",
                    tuple(runs),
                )
            if info.status is RunStatus.STOPPED:
                return LoopResult(Outcome.STOPPED, f"task {self.label} stopped", tuple(runs))
            if self.completion.is_done(self.task, info):
                if not self.task.done.exists():
                    runfolder.atomic_write(self.task.done, f"completed by run {info.run_id}\n")
                return LoopResult(
                    Outcome.COMPLETED,
                    f"task {self.label} completed by run {info.run_id} (attempt {attempt})",
                    tuple(runs),
                )
            if info.reason is Reason.RATE_LIMIT:
                # Waiting out a limit is not a failure of the agent: no restart is spent on it.
                tally.rate_limited += 1
                if tally.rate_limited > s.max_rate_limit_waits:
                    return LoopResult(
                        Outcome.FAILED,
                        f"run {info.run_id} {info.describe()}; rate limited "
                        f"{tally.rate_limited} times in a row (max_rate_limit_waits), giving up",
                        tuple(runs),
                    )
                wait = self._rate_limit_wait(diagnosis)
                note = "rate limited: waiting for the limit to lift (no restart spent)"
            else:
                tally.rate_limited = 0
                tally.failures += 1
                verdict = self._give_up(info, tally, duration)
                tally.quick = tally.quick + 1 if duration < s.crash_loop_seconds else 0
                if verdict is not None:
                    return LoopResult(verdict[0], verdict[1], tuple(runs))
                wait, note = delay, ""
                delay = min(delay * 2, max(s.restart_delay_max, s.restart_delay))
            self.on_event(Event(EventKind.WAITING, run=info, delay=wait, message=note))
            if self._sleep(wait):
                return LoopResult(Outcome.STOPPED, f"task {self.label} stopped", tuple(runs))
            previous = info

    def _rate_limit_wait(self, diagnosis: Diagnosis | None) -> float:
        """Until the limit lifts (as the agent said, plus a second), else a long backoff; capped."""
        s = self.settings
        known = diagnosis.retry_after if diagnosis is not None else None
        wait = known + 1.0 if known is not None else s.rate_limit_wait
        return max(0.0, min(wait, s.rate_limit_max_wait))

    def _give_up(self, info: RunInfo, tally: _Tally, duration: float) -> tuple[Outcome, str] | None:
        """Whether the loop ends after a failed run, and why; None to try again."""
        s = self.settings
        why = f"run {info.run_id} {info.describe()}"
        if info.reason in (Reason.MISSING_BINARY, Reason.AUTH):
            return Outcome.MISSING_DEPENDENCY, f"{why}; not restarting"
        if info.reason in (Reason.EXIT_CODE, Reason.SPAWN_ERROR) and (
            info.exit_code in s.non_retryable_exit_codes
        ):
            return Outcome.FAILED, f"{why}, which a retry cannot fix; not restarting"
        quick = duration < s.crash_loop_seconds
        if s.crash_loop_runs and quick and tally.quick + 1 >= s.crash_loop_runs:
            return Outcome.FAILED, (
                f"{why}; {tally.quick + 1} runs in a row ended within "
                f"{s.crash_loop_seconds:g}s: a crash loop, not restarting"
            )
        if tally.failures > s.max_restarts:
            outcome = Outcome.TIMED_OUT if info.status is RunStatus.TIMED_OUT else Outcome.FAILED
            return (
                outcome,
                f"{why}; gave up after {tally.failures} failed attempts "
                f"(max_restarts {s.max_restarts})",
            )
        return None

    def _sleep(self, seconds: float) -> bool:
        """Wait `seconds` unless a stop comes first; True if it did."""
        deadline = time.monotonic() + seconds
        while not self.stop_requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            ready, _, _ = select.select([self._wake_r], [], [], remaining)
            if ready:
                self._drain_wake()
        return True

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 1024)

    def _mark_lost_runs(self) -> RunInfo | None:
        """Write down runs whose supervisor is gone (`lost`, or failed if it left word why);
        return the task's latest run, if any."""
        latest = None
        for run_id in self.task.run_ids():
            folder = self.task.run_folder(run_id)
            info = runfolder.read_run_info(folder)
            if info is None:
                continue
            if tasks.is_lost(info):
                info = runfolder.mark_lost(folder, info)
                why = (
                    ""
                    if info.status is RunStatus.LOST
                    else f"run {info.run_id} failed: {info.message}"
                )
                self.on_event(
                    Event(EventKind.MARKED_LOST, run=info, run_folder=folder, message=why)
                )
            latest = info
        return latest

    # One run --------------------------------------------------------------------------------

    def _run_once(
        self, attempt: int, previous: RunInfo | None
    ) -> tuple[RunInfo, float, Diagnosis | None]:
        req = self.request
        run_id, folder = self._new_run_folder()
        paths = runfolder.RunPaths(folder)
        prompt = compose(
            req, self.completion, self.redactor, run_id=run_id, attempt=attempt, previous=previous
        )
        runfolder.atomic_write(paths.prompt, prompt)
        env = agent_environment(
            base=req.base_env,
            agent_env=self.backend.config.env,
            task=self.task,
            paths=paths,
            run_id=run_id,
            parent_run_id=req.parent_run_id,
            executable_dir=req.executable_dir,
        )
        ctx = RunContext(run_id, self.task, prompt, req.working_dir, paths, env)
        info = RunInfo(
            run_id=ctx.run_id,
            project_id=ctx.project_id,
            task_id=ctx.task_id,
            attempt=attempt,
            agent=req.agent_name,
            backend=self.backend.name,
            start_time=runfolder.timestamp(),
            cwd=str(req.working_dir),
            previous_run_id=previous.run_id if previous else None,
            parent_run_id=req.parent_run_id,
            supervisor_pid=self._pid,
            supervisor_start=self._process_start,
        )
        started = time.monotonic()
        try:
            spec = self.backend.launch(ctx)
            info = info.replace(
                commandline=self.backend.commandline(spec), agent_version=self.backend.version()
            )
            info = self._record(folder, info)
            self.on_event(Event(EventKind.RUN_STARTED, run=info, run_folder=folder))
            process = AgentProcess.start(
                spec, ctx.stdout_path, ctx.stderr_path, grace=self.settings.kill_grace
            )
        except RunAgentError as exc:
            code, reason = _spawn_failure(exc)
            _note(ctx, str(exc))
            info = self._finish(ctx, info, code, reason, RunStatus.FAILED, str(exc))
            return info, time.monotonic() - started, None
        info = info.replace(pid=process.pid, pgid=process.pgid)
        with contextlib.suppress(OSError):  # the run goes on; its end is written, or said unwritten
            info = self._record(folder, info)
        try:
            code, stopped_by = self._watch(process, info, folder, started)
        finally:
            process.close()
        status, reason, message = self._judge(code, stopped_by)
        diagnosis = None
        if status is RunStatus.FAILED and reason in (Reason.EXIT_CODE, Reason.CRASH):
            diagnosis = self._diagnose(ctx, code)
            if diagnosis is not None:
                reason = diagnosis.reason
                message = f"{diagnosis.message} (exit code {code})"
        info = self._finish(ctx, info, code, reason, status, message)
        return info, time.monotonic() - started, diagnosis

    def _diagnose(self, ctx: RunContext, code: int) -> Diagnosis | None:
        try:
            return self.backend.diagnose(ctx, code)
        except Exception as exc:  # a parser bug must not lose the run
            _note(ctx, f"could not diagnose the failure ({type(exc).__name__}: {exc})")
            return None

    def _new_run_folder(self) -> tuple[str, Path]:
        while True:
            run_id = new_run_id()
            try:
                return run_id, runfolder.create_run_folder(self.task, run_id)
            except FileExistsError:
                continue  # another process of the same pid, long ago; ids move on

    def _watch(
        self, process: AgentProcess, info: RunInfo, folder: Path, started: float
    ) -> tuple[int, Reason | None]:
        """Wait for the agent, enforcing both timeouts and stop requests."""
        s = self.settings
        tick = min(self.tick, s.idle_timeout / 5) if s.idle_timeout else self.tick
        deadline = started + s.timeout if s.timeout else None
        last_output = started
        sizes = (0, 0)
        paths = (runfolder.RunPaths(folder).stdout, runfolder.RunPaths(folder).stderr)
        while True:
            now = time.monotonic()
            wait = tick if deadline is None else min(tick, deadline - now)
            ready, _, _ = select.select([process.fileno(), self._wake_r], [], [], max(0.0, wait))
            if self._wake_r in ready:
                self._drain_wake()
            if process.fileno() in ready:
                code = process.wait(0)
                if code is not None:
                    return code, None
            if self.stop_requested:
                return process.stop(s.kill_grace), Reason.STOPPED
            now = time.monotonic()
            current = (_size(paths[0]), _size(paths[1]))
            if current != sizes:
                sizes, last_output = current, now
            if deadline is not None and now >= deadline:
                return process.stop(s.kill_grace), Reason.TIMEOUT
            if s.idle_timeout and now - last_output >= s.idle_timeout:
                return process.stop(s.kill_grace), Reason.IDLE_TIMEOUT
            self.on_event(Event(EventKind.TICK, run=info, run_folder=folder, elapsed=now - started))

    def _judge(self, code: int, stopped_by: Reason | None) -> tuple[RunStatus, Reason, str]:
        s = self.settings
        if stopped_by is Reason.STOPPED:
            return RunStatus.STOPPED, Reason.STOPPED, "stopped on request"
        if stopped_by is Reason.TIMEOUT:
            return RunStatus.TIMED_OUT, Reason.TIMEOUT, f"ran longer than timeout {s.timeout:g}s"
        if stopped_by is Reason.IDLE_TIMEOUT:
            return (
                RunStatus.TIMED_OUT,
                Reason.IDLE_TIMEOUT,
                f"no output for idle_timeout {s.idle_timeout:g}s",
            )
        if code == 0:
            verdict = self.completion.exit_zero(self.task)
            return verdict.status, verdict.reason, verdict.message
        if code > 128:
            return RunStatus.FAILED, Reason.CRASH, f"killed by signal {code - 128}"
        return RunStatus.FAILED, Reason.EXIT_CODE, f"exited with code {code}"

    def _finish(
        self,
        ctx: RunContext,
        info: RunInfo,
        code: int,
        reason: Reason,
        status: RunStatus,
        message: str,
    ) -> RunInfo:
        """Write output.md and the run's end. A write that fails (a full disk) fails the run,
        saying which file and why; if run-info.yaml itself cannot be written, word is left."""
        folder = ctx.run_folder
        try:
            write_output(ctx, self.backend)
        except OSError as exc:  # the error may name agent-stdout.txt, the file copied from
            state = "is truncated" if ctx.paths.output.exists() else "was not written"
            status, reason = RunStatus.FAILED, Reason.WRITE_ERROR
            message = (
                f"{exc.strerror or exc} writing {runfolder.OUTPUT}; {runfolder.OUTPUT} {state} "
                f"(the run ended: {message})"
            )
        info = info.replace(
            end_time=runfolder.timestamp(),
            exit_code=code,
            reason=reason,
            status=status,
            message=message,
        )
        try:
            info = self._record(folder, info)
        except OSError as exc:
            runfolder.mark_unrecorded(folder, exc)
            info = self._redacted(info).replace(
                status=RunStatus.FAILED,
                reason=Reason.WRITE_ERROR,
                message=self.redactor(f"{runfolder.unrecorded_message(exc)}; {message}"),
            )
        self.on_event(Event(EventKind.RUN_ENDED, run=info, run_folder=folder))
        return info

    def _record(self, folder: Path, info: RunInfo) -> RunInfo:
        """Write run-info with no secret in the text that may quote the agent; return what was
        written."""
        info = self._redacted(info)
        runfolder.write_run_info(folder, info)
        return info

    def _redacted(self, info: RunInfo) -> RunInfo:
        return info.replace(
            message=self.redactor(info.message) if info.message else info.message,
            commandline=self.redactor(info.commandline) if info.commandline else info.commandline,
        )


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


def _note(ctx: RunContext, text: str) -> None:
    """Add a line of run-agent's own to the run's stderr; best effort (the disk may be full)."""
    try:
        with open(ctx.stderr_path, "a", encoding="utf-8") as f:
            f.write(f"run-agent: {text}\n")
    except OSError:
        pass


def write_output(ctx: RunContext, backend: Backend) -> None:
    """output.md: the backend's parsed answer, else stdout (copied, or linked when large)."""
    target = ctx.paths.output
    try:
        text = backend.final_output(ctx)
    except Exception as exc:  # a parser bug must not lose the run
        text = None
        _note(ctx, f"could not parse the output ({type(exc).__name__}: {exc})")
    if text is not None:
        runfolder.atomic_write(target, text)
        return
    target.unlink(missing_ok=True)
    if _size(ctx.stdout_path) > COPY_LIMIT:
        try:
            os.link(ctx.stdout_path, target)
            return
        except OSError:
            pass
    shutil.copyfile(ctx.stdout_path, target)
