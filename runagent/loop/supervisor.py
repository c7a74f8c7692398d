"""The Ralph loop for one task: attempts, backoff, rate-limit waits, give-up rules, and the lock.

Like uvicorn's Multiprocess beside its Process, the loop only decides; each run is an Attempt
(attempt.py), which starts, watches, judges and records it. After a run the loop ends (the task
is done, the run was stopped, or a file could not be written), gives up (a failure a retry cannot
fix, a crash loop, the restart budget spent, too many rate limits in a row), or waits and starts
the next attempt.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from runagent.config.settings import Session
from runagent.errors import ExitCode, RunAgentError
from runagent.loop import budget, completion, stuck
from runagent.loop.attempt import Attempt, Ended, Start, StopSignal, Supervision
from runagent.loop.backend import Backend, session_token
from runagent.loop.budget import Spending
from runagent.loop.context import LoopRequest
from runagent.loop.events import Event, EventKind, LoopResult, Outcome
from runagent.loop.failure import Diagnosis
from runagent.loop.redaction import Redactor
from runagent.process import AgentProcess, drop_reaper_early
from runagent.store import runfolder, taskfolder
from runagent.store.lock import TaskLock
from runagent.store.pids import process_start_time
from runagent.store.runinfo import Reason, RunInfo, RunStatus

if TYPE_CHECKING:  # loops in a worktree import its handling when one starts
    from runagent.issues.repository import Checkout, GitDirs

_DOCTOR = "`run-agent doctor` checks what is missing"
_Ending = tuple[Outcome, str]  # how the loop ends, and the message that says why


@dataclass
class _Tally:
    """What the loop counts between runs."""

    delay: float  # the next backoff; doubles after each failure, up to restart_delay_max
    failures: int = 0  # failed runs, which spend the restart budget
    quick: int = 0  # failed runs in a row that ended within crash_loop_seconds
    rate_limited: int = 0  # rate-limited runs in a row, which do not
    first: int = 1  # the loop's first attempt number (numbers go on across a task's loops)
    same_failure: int = 0  # runs in a row that failed the same way (stuck.signature)
    failure: str | None = None  # that failure's signature
    unchanged: int = 0  # runs in a row that changed nothing in the working folder
    steered: int = 0  # runs a person's --now message ended: no restart spent, the last one later


class Pauser(Protocol):
    """How a loop's agent is paused across the fleet when its provider says it is limited, the
    door's to hand in (the fleet stands above the loop): `pause` records it (for `seconds`,
    saying `why`) and says it in words, `wait_out` gives the loop's slot back and waits, not
    holding one, until the pause lifts and the loop's turn comes again (False: stopped)."""

    def pause(self, seconds: float, why: str) -> str: ...

    def wait_out(self, stop: StopSignal) -> bool: ...


class Supervisor:
    """Runs one task's loop. Construct, then `run()`; `request_stop()` is safe from a signal.

    `start` (how an agent process is started) and `clock` (what durations and timeouts are
    measured by) are seams: a test or another transport passes its own. With a `pauser`, a
    rate limit pauses the agent across the fleet and the loop waits it out without its slot;
    without one, it waits it out where it stands.
    """

    def __init__(
        self,
        request: LoopRequest,
        backend: Backend,
        *,
        on_event: Callable[[Event], None] | None = None,
        tick: float = 1.0,
        redactor: Redactor | None = None,
        start: Start = AgentProcess.start,
        clock: Callable[[], float] = time.monotonic,
        pauser: Pauser | None = None,
    ) -> None:
        self.request = request
        self.pauser = pauser
        self.settings = request.settings
        self.task = request.task
        self.on_event = on_event or (lambda event: None)
        self.stop_signal = StopSignal()
        self._plain_dirs: GitDirs | None = None  # a plain checkout's (for stuck detection)
        self._plain_looked = False
        pid = os.getpid()
        self._lent = Supervision(
            request=request,
            backend=backend,
            rule=completion.rule(request.settings.until),
            redactor=redactor or backend.redactor(request.base_env),
            stop=self.stop_signal,
            on_event=self.on_event,
            start=start,
            clock=clock,
            tick=tick,
            supervisor_pid=pid,
            supervisor_start=process_start_time(pid),
        )
        if request.worktree is None:  # a rule that cannot apply is refused before anything starts
            self._bind(request.checkout)

    @property
    def completion(self) -> completion.CompletionRule:
        return self._lent.rule

    def _bind(self, checkout: Checkout | None) -> None:
        """Fix the loop's checkout: the rule reads it, and its runs record it."""
        r = self.request
        rule = completion.rule(r.settings.until).for_loop(r.working_dir, r.base_env, checkout)
        request = r
        if r.worktree is not None and checkout is not None:  # its runs record the worktree's
            loop_env = dict(r.loop_env)
            if r.issue is not None:
                loop_env.update(r.issue.environment(checkout.folder, r.base_env))
            request = replace(r, checkout=checkout, loop_env=loop_env)
        self._lent = replace(self._lent, rule=rule, request=request)

    @property
    def label(self) -> str:
        return f"{self.task.project_id}/{self.task.task_id}"

    def request_stop(self) -> None:
        """Stop the loop: the current run's tree is stopped and nothing restarts."""
        self.stop_signal.request()

    def run(self) -> LoopResult:
        """Hold the task lock and run attempts until the task completes or the loop gives up."""
        lock = TaskLock(runfolder.confine(self.task).lock, self.label)
        lock.acquire()
        tree, env = self.request.worktree, self.request.base_env
        if tree is not None:  # a loop in a worktree imports its handling, no other loop does
            from runagent.issues import worktree
        try:
            if tree is not None:
                timeout = self.settings.timeout  # bounds the setup command too
                checkout = worktree.open_worktree(self.task, tree, env, timeout, self.request.issue)
                self._bind(checkout)
            result = self._loop()
        finally:
            if tree is not None:
                worktree.close_worktree(self.task, tree, env)
            drop_reaper_early()  # one started for a check that did not run
            lock.release()
            self.stop_signal.close()
        self.on_event(Event(EventKind.LOOP_ENDED, message=result.message, outcome=result.outcome))
        return result

    def _loop(self) -> LoopResult:
        previous = self._prepare()
        # Attempt numbers go on across the task's loops (a resume does not start again at 1).
        numbered = previous.attempt if previous is not None else 0
        runs: list[RunInfo] = []
        tally = _Tally(delay=self.settings.restart_delay, first=numbered + 1)
        session = self._session_of(previous)
        while not self.stop_signal.requested:  # a stop before an attempt began: do not begin it
            number = numbered + len(runs) + 1
            progress = self._progress()
            spending = Spending.before_attempt(self.task, self.settings.budget,
                                               self.request.budgets)  # fmt: skip
            spent = spending.crossed(None, strict=False) if spending is not None else ""
            if spent:  # nothing left to start another run with
                message = (f"task {self.label} has no budget left ({spent}); not starting "
                           f"attempt {number}")  # fmt: skip
                return LoopResult(Outcome.BUDGET, message, tuple(runs))
            attempt = Attempt.prepare(self._lent, number, previous, first=numbered + 1,
                                      spare=tally.steered, session=session)  # fmt: skip
            attempt.spending = spending
            ended = attempt.run()
            runs.append(ended.info)
            self._bring_back(ended)
            ending = self._end(ended.info, attempt=ended.info.attempt) or self._budget(
                ended,
                attempt.spending,  # as last counted while it ran
            )
            if ending is None and ended.refused:
                # The session is gone: a fresh one, told the task and the earlier run's tail
                # again (`previous` stays), no restart spent and no wait.
                self.on_event(Event(EventKind.WAITING, run=ended.info, message=(
                    f"run {ended.info.run_id} could not resume session {session} "
                    f"({ended.refused}): the next attempt starts a fresh session"
                )))  # fmt: skip
                session = None
                continue
            ending = ending or self._count(ended, tally) or self._stuck(ended, tally, progress)
            if ending is not None:
                return LoopResult(*ending, tuple(runs))
            wait, note = self._next_wait(ended, tally)
            if ended.info.reason is Reason.RATE_LIMIT and self.pauser is not None:
                # Its words go to a record every start reads: redacted as the run's own are.
                why = ended.diagnosis.message if ended.diagnosis else ended.info.message
                paused = self.pauser.pause(wait, self._lent.redactor(why or "rate limited"))
                note = f"rate limited: {paused}; its slot given back meanwhile (no restart spent)"
                self.on_event(Event(EventKind.WAITING, run=ended.info, delay=wait, message=note))
                if not self.pauser.wait_out(self.stop_signal):
                    break
                previous = ended.info
                continue
            self.on_event(Event(EventKind.WAITING, run=ended.info, delay=wait, message=note))
            if self.stop_signal.wait(wait):
                break
            previous = ended.info
            session = self._session_of(previous)
        return LoopResult(Outcome.STOPPED, f"task {self.label} stopped", tuple(runs))

    def _session_of(self, info: RunInfo | None) -> str | None:
        """The agent session the attempt after run `info` resumes: the one that run's agent
        said it had, where `session: continue`, the agent's CLI resumes sessions by id, and
        the run was of the same agent in the same folder (where its CLI keeps the session);
        else None, a new session."""
        backend = self._lent.backend
        if info is None or self.settings.session is not Session.CONTINUE:
            return None
        if not backend.resumes_sessions or info.backend != backend.name:
            return None
        if info.agent != self.request.agent_name or info.cwd != str(self.request.working_dir):
            return None
        return session_token(info.session_id)  # the record lies in the task's folder

    def _prepare(self) -> RunInfo | None:
        """Before the first attempt: write down runs whose supervisor died, move a DONE left by
        an earlier loop out of the way, and write TASK.md and how the loop was started. Returns
        the task's latest run."""
        previous = self._mark_lost_runs()
        archived = runfolder.archive_done(self.task, previous.run_id if previous else None)
        if archived is not None:
            self.on_event(Event(EventKind.DONE_ARCHIVED, message=f"stale DONE moved to {archived}"))
        taskfolder.write_task_prompt(self.task, self.request.prompt)
        if self.request.started_with:
            taskfolder.write_task_settings(self.task, self.request.started_with)
        return previous

    def _end(self, info: RunInfo, attempt: int) -> _Ending | None:
        """Whether the loop ends after this run whatever it counts for: a write that failed (a
        full disk fails the next run the same way), a stop, or the task done."""
        if info.reason is Reason.WRITE_ERROR:
            return Outcome.FAILED, f"run {info.run_id}: {info.message}; not restarting"
        if info.reason is Reason.STEERED:  # ended for a person's message: the next one has it
            return None
        if info.status is RunStatus.STOPPED:
            return Outcome.STOPPED, f"task {self.label} stopped"
        if not self._done(info):
            return None
        if not self.task.done.exists():  # the agent finished without saying so: say it for it
            runfolder.atomic_write(self.task.done, f"completed by run {info.run_id}\n")
        if self.request.worktree is not None:  # a rebase it had to finish is finished
            from runagent.issues import rebasing

            rebasing.settle(self.task)
        return (
            Outcome.COMPLETED,
            f"task {self.label} completed by run {info.run_id} (attempt {attempt})",
        )

    def _done(self, info: RunInfo) -> bool:
        """Whether the task is done after this run: its completion rule says so and, where the
        task has a check, the check passed on it (the attempt ran it: loop/check.py)."""
        if info.reason is Reason.UNRESOLVED_CONFLICT or not self.completion.is_done(
            self.task, info
        ):
            return False
        return self.settings.check is None or info.check_exit_code == 0

    def _count(self, ended: Ended, tally: _Tally) -> _Ending | None:
        """Count a run that did not complete the task; how the loop ends if it now gives up."""
        s, info = self.settings, ended.info
        if info.reason is Reason.STEERED:  # a person ended it: no failure of the agent's
            tally.steered += 1
            return None
        if info.reason is Reason.RATE_LIMIT:
            # Waiting out a limit is not a failure of the agent: no restart is spent on it.
            tally.rate_limited += 1
            if tally.rate_limited > s.max_rate_limit_waits:
                return Outcome.FAILED, (
                    f"run {info.run_id} {info.describe()}; rate limited "
                    f"{tally.rate_limited} times in a row (max_rate_limit_waits), giving up"
                )
            return None
        tally.rate_limited = 0
        tally.failures += 1
        tally.quick = tally.quick + 1 if ended.duration < s.crash_loop_seconds else 0
        return self._give_up(info, tally)

    def _give_up(self, info: RunInfo, tally: _Tally) -> _Ending | None:
        """Whether the loop ends after a failed run, and why; None to try again."""
        s = self.settings
        why = f"run {info.run_id} {info.describe()}"
        if info.reason in (Reason.MISSING_BINARY, Reason.AUTH):
            return Outcome.MISSING_DEPENDENCY, f"{why}; not restarting ({_DOCTOR})"
        if info.reason in (Reason.EXIT_CODE, Reason.SPAWN_ERROR) and (
            info.exit_code in s.non_retryable_exit_codes
        ):
            # The agent protocols' 3 is a missing dependency: say where to look.
            hint = f" ({_DOCTOR})" if info.exit_code == ExitCode.MISSING_DEPENDENCY else ""
            return Outcome.FAILED, f"{why}, which a retry cannot fix; not restarting{hint}"
        if s.crash_loop_runs and tally.quick >= s.crash_loop_runs:
            within = f"{tally.quick} runs in a row ended within {s.crash_loop_seconds:g}s"
            if info.reason in (Reason.NO_DONE_FILE, Reason.NO_READY_MARKER, Reason.CHECK_FAILED):
                # Clean exits that did not do the work: no crash, but no use repeating either.
                return (
                    Outcome.FAILED,
                    f"{why}; {within} without completing the task, not restarting",
                )
            return Outcome.FAILED, f"{why}; {within}: a crash loop, not restarting"
        if tally.failures > s.max_restarts:
            outcome = Outcome.TIMED_OUT if info.status is RunStatus.TIMED_OUT else Outcome.FAILED
            failed = f"{tally.failures} failed {'attempt' if tally.failures == 1 else 'attempts'}"
            if tally.first > 1:  # a resumed loop: its console counted from the task's attempts
                span = f"{tally.first}-{info.attempt}" if info.attempt > tally.first else ""
                failed += f" in this loop (attempt{'s' if span else ''} {span or info.attempt})"
            return outcome, f"{why}; gave up after {failed} (max_restarts {s.max_restarts})"
        return None

    def _budget(self, ended: Ended, spending: Spending | None) -> _Ending | None:
        """Whether the run crossed a budget (stopped for it, or found past it at its end, when
        its agent reports the cost last): the loop ends, and the run says which budget."""
        info = ended.info
        if spending is None:
            return None
        if info.reason is Reason.BUDGET:
            said = (info.message or "").removeprefix("budget: ")
        else:
            said = spending.crossed(info.usage)
            if not said:
                return None
            marked = info.replace(reason=Reason.BUDGET, message=f"budget: {said} ({info.message})")
            with contextlib.suppress(OSError):  # the loop ends either way
                runfolder.write_run_info(self.task.run_folder(info.run_id), marked)
        lifts = budget.lifts(said)
        return (
            Outcome.BUDGET,
            f"task {self.label} stopped by its budget: {said}; not restarting ({lifts})",
        )

    def _bring_back(self, ended: Ended) -> None:
        """After each run of a loop in a worktree of its own: its branch in the repository
        moved to the clone's (the page, `merge` and anyone's git see the work as it goes). A
        failure is not the run's (`merge` brings it back again, and says why it cannot), but
        it is said: a line of run-agent's in the run's stderr, and an event the console (and
        a detached loop's supervisor.log) prints."""
        if self.request.worktree is None:
            return
        from runagent.issues import worktree

        try:
            worktree.sync_branch(self.task, self.request.base_env)
        except (RunAgentError, OSError) as exc:
            said = " ".join(str(exc).split())
            with contextlib.suppress(OSError):
                runfolder.append_line(self.task.run(ended.info.run_id).stderr, f"run-agent: {said}")
            self.on_event(Event(EventKind.BRANCH_KEPT, run=ended.info, message=said))

    def _progress(self) -> stuck.Progress | None:
        """The working folder before an attempt, when stuck detection is on and can judge: a
        loop that may not restart (a `job`) never does, as a failed run ends it (`_give_up`) and
        a steered or rate-limited one is never judged, so it spends no look at git on it."""
        if not self.settings.stuck_after or self.settings.max_restarts == 0:
            return None
        r = self._lent.request
        checkout = r.checkout or getattr(self._lent.rule, "checkout", None)
        if checkout is not None:  # its git folders were named before any agent worked there
            return stuck.Progress.before(checkout.folder, r.base_env, (self.task.root,),
                                         checkout.dirs)  # fmt: skip
        if not self._plain_looked:  # found once, before this loop's first attempt
            from runagent import errors
            from runagent.issues.repository import GitDirs

            self._plain_looked = True
            with contextlib.suppress(errors.RunAgentError, OSError):
                self._plain_dirs = GitDirs.of(r.working_dir, r.base_env)
        return stuck.Progress.before(r.working_dir, r.base_env, (self.task.root,),
                                     self._plain_dirs)  # fmt: skip

    def _stuck(
        self, ended: Ended, tally: _Tally, progress: stuck.Progress | None
    ) -> _Ending | None:
        """Whether the loop stops as stuck after this run (which did not complete the task):
        `stuck_after` runs in a row failed the same way, or changed nothing."""
        info, n = ended.info, self.settings.stuck_after
        if progress is None or not n or info.reason in (Reason.RATE_LIMIT, Reason.STEERED):
            return None
        folder = self.task.run_folder(info.run_id)
        failure = stuck.signature(info, folder)
        key = failure[0] if failure is not None else None
        tally.same_failure = (
            tally.same_failure + 1 if key and key == tally.failure else int(bool(key))
        )
        tally.failure = key
        tally.unchanged = (
            0 if progress.changed(self._lent.request.base_env) else tally.unchanged + 1
        )
        if failure is not None and tally.same_failure >= n:
            code = f"exit {info.exit_code}" if info.exit_code is not None else str(info.reason)
            if info.reason is Reason.CHECK_FAILED:  # the agent said done: its check failed
                code = f"check `{info.check_command}` exit {info.check_exit_code}"
            saw = f"{n} attempts in a row failed the same way ({code}: {failure[1]!r})"
        elif tally.unchanged >= n:
            saw = f"{n} attempts in a row changed nothing in {progress.folder} ({progress.how()})"
        else:
            return None
        marked = info.replace(reason=Reason.STUCK, message=f"stuck: {saw}")
        with contextlib.suppress(OSError):  # the loop ends either way
            runfolder.write_run_info(folder, marked)
        return Outcome.STUCK, (
            f"task {self.label} is stuck: {saw}; not restarting (`run-agent resume` tries "
            "again; --no-stuck or stuck_after: 0 turns this off)"
        )

    def _next_wait(self, ended: Ended, tally: _Tally) -> tuple[float, str]:
        """How long to wait before the next attempt, and a note saying why when it is not a
        plain backoff."""
        s = self.settings
        if ended.info.reason is Reason.STEERED:
            return 0.0, "a person's message (--now): the next attempt starts with it"
        if ended.info.reason is Reason.RATE_LIMIT:
            note = "rate limited: waiting for the limit to lift (no restart spent)"
            return self._rate_limit_wait(ended.diagnosis), note
        wait = tally.delay
        tally.delay = min(tally.delay * 2, max(s.restart_delay_max, s.restart_delay))
        return wait, ""

    def _rate_limit_wait(self, diagnosis: Diagnosis | None) -> float:
        """Until the limit lifts (as the agent said, plus a second), else a long backoff; capped."""
        s = self.settings
        known = diagnosis.retry_after if diagnosis is not None else None
        wait = known + 1.0 if known is not None else s.rate_limit_wait
        return max(0.0, min(wait, s.rate_limit_max_wait))

    def _mark_lost_runs(self) -> RunInfo | None:
        """Write down runs whose supervisor is gone (`lost`, or failed if it left word why);
        return the task's latest run, if any. Called holding the task's lock."""
        latest = None
        for run_id in self.task.run_ids():
            folder = self.task.run_folder(run_id)
            info = runfolder.read_run_info(folder)
            if info is None:
                continue
            # This loop holds the task: any run still recorded as running, on whatever host,
            # belongs to a supervisor that is gone.
            if info.status is RunStatus.RUNNING:
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
