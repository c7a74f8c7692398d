"""The one door through which work starts and stops: start, resume, stop, delete and a schedule's
firing, with the same checks in the same order and the same leftovers whatever starts a task.

The command line, the scheduler, the server and the loop an executor starts all come through
here. A start is admitted in one order (the prompt, TASK.md's rule, a completed task, the agent),
TASK.md is claimed, the loop is started on the executor, and a task folder that the start made is
discarded when the start is refused. What the next issues put in front of a start (a concurrency
cap with its queue, dependencies, budgets) belongs in `admit` and `start`, so every face gets it.
The agent check needs the backends, which the core never imports: it is handed in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import field, replace
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from runagent import listing, python
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import (
    AgentConfig,
    AgentSandbox,
    Config,
    ExecutorSettings,
    ExecutorType,
    LimitsSettings,
    LoopSettings,
    MergeMode,
    NotifyEvent,
    ServerSettings,
    Until,
)
from runagent.errors import (
    AlreadyRunningError,
    BlockedError,
    BudgetError,
    DamagedRecordError,
    ForbiddenError,
    MissingDependencyError,
    NotFoundError,
    RunAgentError,
    UsageError,
)
from runagent.loop.context import validate_id, validate_prompt
from runagent.record import record
from runagent.store import credentials, race, runfolder, steering, taskfolder, tasks
from runagent.store.race import RaceSpec
from runagent.store.runfolder import TaskPaths
from runagent.store.runinfo import Reason
from runagent.store.steering import Message

if TYPE_CHECKING:  # the executors are imported when a loop is started or stopped, not before
    from subprocess import Popen

    from runagent.executors.control import ClusterSlot
    from runagent.executors.local import Started
    from runagent.fleet.overview import Overview
    from runagent.fleet.queue import QueueHold, Turn, Waiting
    from runagent.issues.rebasing import Rebased
    from runagent.loop.attempt import StopSignal
    from runagent.loop.backend import Backend
    from runagent.loop.check import Result as CheckResult
    from runagent.loop.notify import Notifier
    from runagent.schedule import Firing
    from runagent.store.cleanup import Doomed
    from runagent.store.lock import Holder

# Raises a RunAgentError (MissingDependencyError, UsageError) unless the agent NAME of CONFIG
# (None: its default) can run here; WHO begins the message. The command line hands in the
# backends' check, which returns the agent and its backend.
AgentCheck = Callable[[Config, str | None, str], "tuple[AgentConfig, Backend]"]


class Command(StrEnum):
    """What the started loop does first: run the task's prompt, or resume from TASK.md."""

    RUN = "run"
    RESUME = "resume"
    JOB = "job"  # one run, no restarts


# Why an issue run is not handed to a cluster: its worktree is made from the repository here.
ISSUE_ON_CLUSTER = (
    "an issue run cannot go to the Ray cluster: its worktree is a git worktree of the "
    "repository on this machine, and the loop would run on another host; run it with "
    "--executor local"
)


def sandbox_lowered(floor: LoopSettings, asked: LoopSettings) -> str | None:
    """What `asked` lowers of the sandbox `floor` sets, as a start would say it (`sandbox
    none`, `network true`); None when it is as confined or more."""
    if floor.sandbox is not AgentSandbox.BWRAP:
        return None
    if asked.sandbox is not AgentSandbox.BWRAP:
        return f"sandbox {asked.sandbox}"
    if not floor.network and asked.network:
        return "network true"
    return None


@record
class StartRequest:
    """One start of a task's loop, whatever face asked for it."""

    task: TaskPaths
    prompt: str | None = None  # RUN: the prompt (None: TASK.md's); RESUME: always TASK.md's
    command: Command = Command.RUN
    overrides: LoopOverrides = field(default_factory=LoopOverrides)
    again: bool = False  # a completed task runs again only when asked in so many words
    schedule: str | None = None  # the schedule that fired it
    conflict_hint: str = "resume it, or start a new task"  # what to do about another prompt
    after: tuple[str, ...] = ()  # P/T of tasks that must complete first (as given: checked here)
    priority: int = 0  # its place in the queue among those that wait (higher first)
    issue_run: bool = False  # an issue run: its worktree comes from the issue's repository
    issue: IssueStart | None = None  # a detached issue run (the page, the API, a schedule)
    # Asked by the config's owner (its command line, the api_key, an admin token): it alone
    # may run an agent with less sandbox than the config sets for it (`_refuse_lowering`).
    owner: bool = False
    # The loop of a start the door admitted where it began (the command line it started says
    # `--admitted`: executors.local.loop_argv): a start is admitted once, never again.
    admitted: bool = False
    # A race: several loops on the task's prompt at once, each a task of its own in a worktree
    # of its own; the first to complete wins (runagent/store/race.py, runagent/race.py).
    race: RaceSpec | None = None
    # A resume's message from a person, for the task's next attempt (store/steering.py); `now`
    # ends the attempt that runs so the next starts with it. `sender` names the face.
    message: str | None = None
    now: bool = False
    sender: str = ""


@record
class Admission:
    """A start the door let in: the prompt it runs, the overrides it runs with (the task's
    remembered ones, with the start's in their place), and its agent and backend as checked
    (None: a door with nothing to check them with); for a loop run in this process, since when
    it waited in the queue, when it did."""

    prompt: str
    remembered: LoopOverrides
    overrides: LoopOverrides
    agent: tuple[AgentConfig, Backend] | None = None
    waited: str | None = None
    # For a loop run in this process: how a limit its runs find pauses its agent across the
    # fleet, and how it waits the pause out without its slot (every such loop's Supervisor).
    pauser: FleetPause | None = field(default=None, compare=False)


@record
class RacerStart:
    """One racer's start, as the door admitted it."""

    racer: race.Racer
    request: StartRequest
    admission: Admission


# Why a worktree run (a race's racers are) goes to a cluster only when its hosts share the
# runs root: its worktree lies in the task's folder, made and used where the loop runs.
WORKTREE_ON_CLUSTER = (
    "a worktree run on the Ray cluster needs hosts that share the runs root (and the "
    "repository's folder) with this machine, and executor.shared_root is false; run it with "
    "--executor local"
)
# Seconds a race waits for its stopped racers beyond their kill_grace (as `stop` waits for one
# loop): each is waited for only until it ends, so a long margin costs only a loaded machine.
RACE_STOP_MARGIN = 15.0


@record
class IssueStart:
    """An issue a detached start works on: its worktree comes from `repo`'s default branch, its
    body is the prompt unless one is given, and it completes by the ready marker."""

    number: int
    repo: Path
    body: str = ""
    url: str = ""


@record
class Service:
    """The door, for one runs root. `config` is a snapshot (the command line's, with its options
    applied); without one, the config file is read afresh for each start, as the loop started
    will read it, with `backend_names` (a server is long-lived; its config file may change)."""

    root: Path
    check_agent: AgentCheck | None = None  # None: no agent is checked (nothing to check with)
    config: Config | None = None
    config_path: Path | None = None
    backend_names: Collection[str] = ()
    executor: ExecutorSettings | None = None  # None: this machine
    workdir: Path = field(default_factory=Path.cwd)  # where a loop works unless told otherwise
    env: Mapping[str, str] | None = None  # the started loop's environment (None: this one's)
    config_found: bool = False  # its config file was found in the current folder, not named

    def current_config(self) -> Config | None:
        """The config a loop started now runs with; None when this service cannot read one."""
        if self.config is not None:
            return self.config
        if not self.backend_names:
            return None
        from runagent.config.file import load_config

        return load_config(self.config_path, self.backend_names, self.workdir)

    def pinned(self) -> Service:
        """This door with its config read once, for one start: every check of it sees the same
        config, and the file is read once (a server reads it afresh for each start)."""
        config = self.current_config() if self.config is None else None
        return self if config is None else replace(self, config=config)

    def admit(self, request: StartRequest) -> Admission:
        """Check a start in the one order, before anything is created; what it runs.

        Raises UsageError or NotFoundError (no prompt), PromptConflictError (TASK.md holds
        another), AlreadyCompletedError (unless `again`), and what the agent check raises.
        """
        return self.pinned()._admit(request)

    def _admit(self, request: StartRequest) -> Admission:
        task = request.task
        self._check_message(request)
        prompt = request.prompt if request.command is not Command.RESUME else None
        if request.issue is not None:
            prompt = self._admit_issue(request.issue, prompt)
        if prompt is None:
            existing = taskfolder.read_task_prompt(task)
            if existing is None and request.command is Command.RESUME:
                raise NotFoundError(
                    f"task {task.label} has no TASK.md to resume from ({task.task_md})"
                )
            if existing is None:
                raise UsageError(
                    'no prompt: give it as an argument, "-" for stdin, or --prompt-file'
                )
            prompt = validate_prompt(existing, f"the task's prompt in {task.task_md}")
        taskfolder.check_task_prompt(task, prompt, request.conflict_hint)
        tasks.refuse_completed(listing.view(task), request.again)
        if request.after:  # the tasks exist, and are not this one
            from runagent.fleet import depends

            depends.parse_after(request.after, task)
        self._refuse_spent(task)
        remembered = LoopOverrides.remembered(task)
        merged = remembered.merged(request.overrides)
        agent = self.check(request, merged.agent)
        if not request.owner:
            self._refuse_lowering(merged)
        issue = request.issue_run or request.issue is not None
        if not issue:
            self._check_working_folder(merged)
        self._check_isolation(merged, request.overrides.base, issue)
        self._check_check(request, merged)
        self._check_config_origin(task, merged)
        if request.overrides.working_dir is not None:  # as asked now, not as remembered
            self._refuse_in_root(self.workdir / request.overrides.working_dir, "working folder")
        if request.issue is not None:
            self._refuse_in_root(self.workdir / request.issue.repo, "the issue's repository")
        if agent is not None:
            self._check_budget_usage(merged, *agent)
        return Admission(prompt, remembered, merged, agent)

    def steer(self, request: StartRequest) -> Message | None:
        """A person's message to a task (a resume's `message`): while its loop runs, kept for
        its next attempt (with `now`, the attempt that runs ends so the next starts with it)
        and returned; None when no loop of it runs, for the start that follows to keep once
        admitted. Raises UsageError for a message that cannot be one."""
        self._check_message(request)
        if request.message is None:
            return None
        from runagent.store.lock import live_holder

        if live_holder(request.task.lock) is None:
            return None
        if request.overrides != LoopOverrides() or request.after or request.priority:
            raise UsageError(
                f"task {request.task.label} is running: its loop goes on with its own options; "
                "send the message alone (or stop the task and resume it with them)"
            )
        return self._keep_message(request)

    def _check_message(self, request: StartRequest) -> None:
        """A message goes with a resume of a task that is no race's, as text of a sane size."""
        text = request.message
        if text is None:
            if request.now:
                raise UsageError("--now ends the running attempt for a message: give --message")
            return
        if request.command is not Command.RESUME:
            raise UsageError("a message goes to a task that exists: give it with resume")
        validate_prompt(text, "the message")
        if len(text) > steering.MAX_MESSAGE_CHARS:
            raise UsageError(
                f"the message is {len(text)} characters, over {steering.MAX_MESSAGE_CHARS}; "
                "put the long text in a file the task can read and say where"
            )
        if request.race is not None or race.is_race(request.task):
            raise UsageError(
                f"task {request.task.label} is a race: send the message to one of its racers"
            )

    def _keep_message(self, request: StartRequest) -> Message:
        assert request.message is not None
        runfolder.make_task_folder(request.task)
        return steering.add(request.task, request.message, now=request.now, by=request.sender)

    def _admitted(self, request: StartRequest) -> Admission:
        """What a loop the door admitted where it began runs with (`request.admitted`): its
        TASK.md, claimed there, and its agent, checked again here where it runs."""
        task = request.task
        prompt = taskfolder.read_task_prompt(task)
        if prompt is None:
            raise NotFoundError(f"task {task.label} has no TASK.md to run ({task.task_md})")
        remembered = LoopOverrides.remembered(task)
        merged = remembered.merged(request.overrides)
        return Admission(prompt, remembered, merged, self.check(request, merged.agent))

    def _check_working_folder(self, overrides: LoopOverrides) -> None:
        """The folder the agent is to work in (as asked, else as the task was started, else
        where the start was asked) exists."""
        folder = (self.workdir / (overrides.working_dir or ".")).resolve()
        if not folder.is_dir():
            raise UsageError(f"working folder {str(folder)!r} does not exist; check --cwd")

    def _check_budget_usage(
        self, overrides: LoopOverrides, agent: AgentConfig, backend: Backend
    ) -> None:  # fmt: skip
        """A budget is held to only by an agent whose backend reads its usage: a start with a
        budget for one that does not is refused, never run unbounded."""
        budget = self._settings(overrides).budget
        if budget is not None and not backend.reports_usage():
            raise UsageError(
                f"agent {agent.name} ({agent.type}) reports no usage, so a budget "
                f"({budget.words()}) could not be held to; run it without one"
            )

    def _refuse_in_root(self, folder: Path, what: str) -> None:
        """No agent is started to work among the run folders (another task's, the tokens, the
        queue): a folder asked for inside the runs root is a UsageError naming it. (A task's
        own worktree lies there, made by run-agent, never asked for.)"""
        where = folder.resolve()
        if where.is_relative_to(self.root.resolve()):
            raise UsageError(
                f"{what} {str(where)!r} is inside the runs root {str(self.root)!r}; an agent "
                "never works among the run folders: give a folder outside it"
            )

    def _check_config_origin(self, task: TaskPaths, overrides: LoopOverrides) -> None:
        """A task is not started again with a config file found in the current folder (not
        named with --config or RUN_AGENT_CONFIG) other than the one it last started with, when
        that file lies in the folder its agent writes: the agent could have put it there
        (ConfigError naming both, and what to do)."""
        recorded = taskfolder.recorded_config(task)
        if recorded is None or self.config_path is None or not self.config_found:
            return
        found = self.config_path.resolve()
        if found == recorded:  # (whatever the found config says of the sandbox: it may lie)
            return
        writable = (self.workdir / (overrides.working_dir or ".")).resolve()
        if found.is_relative_to(writable):
            from runagent.errors import ConfigError

            raise ConfigError(
                f"config file {str(found)!r} is not the one task {task.label} started with "
                f"({str(recorded)!r}), and lies in the folder its sandboxed agent writes, which "
                "may have put it there; read it, then name the one to use with --config"
            )

    def _admit_issue(self, issue: IssueStart, prompt: str | None) -> str:
        """An issue run from the page, the API or a schedule: its repository is one, holds
        neither the config nor the runs root (a repository never chooses what runs here), and
        it has a text to work from; the prompt (else the issue's body)."""
        from runagent.config.file import refuse_config_inside, refuse_root_inside
        from runagent.issues.worktree import working_trees

        if self.executor is not None and self.executor.type is ExecutorType.RAY:
            raise UsageError(ISSUE_ON_CLUSTER)
        trees = working_trees((self.workdir / issue.repo).resolve(), os.environ)  # not one: refused
        refuse_config_inside(self.config_path, trees, os.environ)
        refuse_root_inside(self.root, "--root or storage.runs_dir", trees)
        text = prompt or issue.body
        if not text.strip():
            raise UsageError(
                f"issue #{issue.number} has no text: give a prompt or the issue's body"
            )
        return validate_prompt(text, "the issue's text")

    def _settings(self, overrides: LoopOverrides) -> LoopSettings:
        """The loop settings a start will run with: its overrides over its agent's and the
        config's defaults."""
        return overrides.apply(self._defaults(overrides.agent)[1])

    def _defaults(self, agent: str | None) -> tuple[str, LoopSettings]:
        """The agent a start runs (named as the config names it) and its loop settings as the
        config alone sets them: the floor of its sandbox."""
        config = self.current_config()
        if config is None:
            return agent or "", LoopSettings()
        try:
            found = config.agent(agent, self.backend_names or config.agents)
        except RunAgentError:  # no agent to ask: as the defaults say
            return agent or config.defaults.agent or "", config.defaults
        return found.name, found.loop_defaults(config.defaults)

    def _refuse_lowering(self, overrides: LoopOverrides) -> None:
        """A start that is not the config's owner's runs its agent at least as confined as the
        config sets: under bubblewrap where it says `sandbox: bwrap`, without the network
        where it says `network: false` (else a ForbiddenError, before anything is made). A
        raise is anyone's; what the task's record says was made harmless by `remembered`."""
        name, floor = self._defaults(overrides.agent)
        asked = overrides.apply(floor)
        lowered = sandbox_lowered(floor, asked)
        if lowered is None:
            return
        network = "" if floor.network else ", network: false"
        raise ForbiddenError(
            f"{lowered}: the config runs agent {name} under sandbox: bwrap{network}, and only "
            "the config's owner lowers it (its command line, the api_key or an admin token); "
            "leave it out"
        )

    def _check_isolation(self, overrides: LoopOverrides, base: str | None, issue: bool) -> None:
        """What a loop's isolation needs is there before it starts: bubblewrap that works here
        for a sandboxed agent (else MissingDependencyError, never an unsandboxed run), and for
        a worktree of its own (not an issue run's) a repository and base (_check_worktree)."""
        settings = self._settings(overrides)
        if settings.sandbox is AgentSandbox.BWRAP:
            from runagent.loop import sandbox

            sandbox.check(self.workdir)
            home = (self.env if self.env is not None else os.environ).get("HOME")
            if home and os.path.isdir(home):
                where = self.workdir / (overrides.working_dir or ".")
                sandbox.refuse_working_folder(where, Path(home).resolve())
        if not issue:
            self._check_worktree(overrides, base, settings.worktree)

    def _check_check(self, request: StartRequest, overrides: LoopOverrides) -> None:
        """The task's check (as asked, as remembered, or as the config says) can start here:
        else a MissingDependencyError naming the command, before any agent starts. A check is
        a command run where the agent runs: one sent by other than the config's owner is
        refused unless the agent runs sandboxed (the check then runs in its sandbox); the
        config's own (`check:`, a schedule's) and the task's as remembered are the owner's."""
        settings = self._settings(overrides)
        if settings.check is None:
            return
        asked = request.overrides.check is not None and request.schedule is None
        if asked and not request.owner and settings.sandbox is not AgentSandbox.BWRAP:
            raise ForbiddenError(
                f"check `{settings.check}`: the agent runs unsandboxed, so its check would run "
                "on this machine as you, which only the config's owner decides (its command "
                "line, the api_key or an admin token); leave it out, or run the agent under "
                "sandbox: bwrap"
            )
        from runagent.loop import check

        if request.issue is not None:
            folder = self.workdir / request.issue.repo
        else:
            folder = self.workdir / (overrides.working_dir or ".")
        env = self.env if self.env is not None else os.environ
        check.refuse_unrunnable(settings.check, folder.resolve(), env)

    def recheck(self, task: TaskPaths) -> CheckResult:
        """Run the task's check again on its current tree without starting its agent: in its
        working folder (its worktree where it has one), under its agent's sandbox when it runs
        in one, its output in the task's check.txt, holding the task meanwhile. UsageError when
        the task has no check; AlreadyRunningError while its loop runs (which checks itself)."""
        return self.pinned()._recheck(task)

    def _recheck(self, task: TaskPaths) -> CheckResult:
        from runagent.loop import check
        from runagent.store.lock import TaskLock

        remembered = LoopOverrides.remembered(task)
        settings = self._settings(remembered)
        if settings.check is None:
            raise UsageError(
                f"task {task.label} has no check: start it with --check CMD, or set check: in "
                "config.yaml (per agent, or under defaults:)"
            )
        base = self.env if self.env is not None else os.environ
        config = self.current_config()
        key_variable = (config.server if config is not None else ServerSettings()).api_key_env
        env = {**credentials.scrub(base, key_variable), "TASK_FOLDER": str(task.folder),
               "JRUN_PROJECT_ID": task.project_id, "JRUN_TASK_ID": task.task_id,
               "JRUN_RUNS_DIR": str(task.root)}  # fmt: skip
        lock = TaskLock(runfolder.confine(task).lock, task.label)
        lock.acquire()  # AlreadyRunningError while a loop holds it
        try:
            folder = self._tree_of(task, remembered, settings.worktree, env)
            reach = None
            if settings.sandbox is AgentSandbox.BWRAP:  # as its agent runs: never on the host
                from runagent.loop import sandbox

                control = (self.config_path,) if self.config_path is not None else ()
                reach = sandbox.Reach(task, None, control=control, network=settings.network)
            task.check.unlink(missing_ok=True)
            given = check.Check(settings.check, settings.check_timeout, settings.kill_grace)
            result = check.run(given, cwd=folder, env=env, output=task.check, reach=reach)
            if reach is not None:
                for line in sandbox.after_check(reach, folder, "check"):
                    runfolder.append_line(task.check, f"run-agent: {line}")
        finally:
            lock.release()
        return result

    def _tree_of(
        self, task: TaskPaths, remembered: LoopOverrides, worktree: bool,
        env: Mapping[str, str],
    ) -> Path:  # fmt: skip
        """The folder a task's agent works in, as its last start recorded it: in its worktree
        where it has one (an issue run records the worktree itself)."""
        folder = (self.workdir / (remembered.working_dir or ".")).resolve()
        if worktree and not folder.is_relative_to(task.worktree.resolve()):
            from runagent.issues import worktree as worktrees

            folder = worktrees.work_folder(task, folder, env)
        if not folder.is_dir():
            raise UsageError(
                f"task {task.label}'s working folder {str(folder)!r} is not there any more; "
                "resume the task, which makes it again"
            )
        return folder

    def _check_worktree_on_cluster(self) -> None:
        """A loop in a worktree of its own goes to the Ray cluster only where its hosts share the
        runs root: the worktree lies in the task's folder, and is made where the loop runs,
        from the repository at the same path (a shared filesystem), its branch brought back
        there after each run."""
        on_ray = self.executor is not None and self.executor.type is ExecutorType.RAY
        if on_ray and self.executor is not None and not self.executor.shared_root:
            raise UsageError(WORKTREE_ON_CLUSTER)

    def _check_worktree(self, overrides: LoopOverrides, base: str | None, wanted: bool) -> None:
        """A loop that is to work in a worktree of its own (as asked, as the task was started,
        or as its agent's config says) starts from a repository and a base that exist, with
        the runs root outside it; `--base` without a worktree is refused."""
        if wanted:
            self._check_worktree_on_cluster()
        if not wanted:
            if base is not None:
                raise UsageError(
                    f"--base {base!r} goes with --worktree: without a worktree of its own the "
                    "agent works in the folder as it is"
                )
            return
        from runagent.issues import worktree

        folder = (self.workdir / (overrides.working_dir or ".")).resolve()
        worktree.check_tree(folder, overrides.base, self.root, os.environ)

    def _refuse_spent(self, task: TaskPaths) -> None:
        """BudgetError when the task's project or the whole root has spent its budget for
        today (config `budgets:`): a new start would only be stopped at once."""
        config = self.current_config()
        budgets = config.budgets if config is not None else None
        if budgets is None or (budgets.daily is None and task.project_id not in budgets.projects):
            return
        from runagent.loop.budget import Spending

        spending = Spending.before_attempt(task, None, budgets)
        spent = spending.crossed(None, strict=False) if spending is not None else ""
        if spent:
            raise BudgetError(
                f"not starting {task.label}: the budget is spent ({spent}); raise it under "
                "budgets: in config.yaml, or wait for tomorrow (UTC)"
            )

    def check(
        self, request: StartRequest, agent: str | None
    ) -> tuple[AgentConfig, Backend] | None:  # fmt: skip
        """The agent the loop will run (as given, else as the task was started before) exists
        and can run here: it and its backend (None: nothing to check it with)."""
        config = self.current_config() if self.check_agent is not None else None
        if self.check_agent is None or config is None:
            return None
        who = f"schedule {request.schedule}: " if request.schedule is not None else ""
        return self.check_agent(config, agent, who)

    def start(self, request: StartRequest) -> Started:
        """Start the task's loop on the executor as a detached supervisor, once admitted; a task
        folder this start made is gone again when the executor refuses it. A race starts its
        racers and its watcher (`_start_race`)."""
        request = self.raced(request)
        if request.race is not None:
            return self.pinned()._start_race(request)
        return self.pinned()._start(request)

    def raced(self, request: StartRequest) -> StartRequest:
        """A resume of a race's task that names no race races it again as it was started
        (each racer resuming its own loop); any other start as it is."""
        if request.race is not None or request.command is not Command.RESUME:
            return request
        try:
            found = race.read(request.task)
        except ValueError as exc:
            raise DamagedRecordError(str(exc)) from None
        return replace(request, race=found.spec) if found is not None else request

    def _start(self, request: StartRequest, admission: Admission | None = None) -> Started:
        from runagent.executors import control

        if admission is None:
            admission = self._admitted(request) if request.admitted else self._admit(request)
        prompt = admission.prompt
        task = request.task
        created = not task.folder.exists()
        if not request.admitted:
            taskfolder.claim_task_prompt(task, prompt, request.conflict_hint)
        if request.message is not None:  # admitted: its first attempt starts with it
            self._keep_message(request)
        overrides = request.overrides
        if request.issue is not None:  # its loop takes the issue up as a resume of it does
            overrides = self._issue_task(task, request.issue, prompt, overrides)
            request = replace(request, command=Command.RESUME)
        if overrides.working_dir is not None:  # as meant here, wherever the loop starts
            overrides = replace(
                overrides, working_dir=(self.workdir / overrides.working_dir).resolve()
            )
        gated = False
        try:
            on_ray = self.executor is not None and self.executor.type is ExecutorType.RAY
            config = self.current_config()
            env = self.started_env(config)
            limits = config.limits if config is not None else LimitsSettings()
            after = self._after(request)
            # On a cluster the cap is the hosts' agent_slot and the queue is Ray's: the gate
            # holds a start there only for the tasks it runs after, then hands it to Ray.
            if on_ray:
                limits = LimitsSettings()
            if self._gated(task, limits, after, self._agent_name(request, config)):
                from runagent.fleet import gate

                argv = control.loop_argv(
                    request.command.value, task, overrides, self.config_path, request.schedule,
                    request.again, on="ray" if on_ray else "local",
                )  # fmt: skip
                # On disk: the names of its secret variables, never their values (whoever
                # starts it takes them from its own environment: executors/keeper.py).
                values, withheld = credentials.withhold(env, _secret_variables(config))
                start = {"argv": argv, "cwd": str(self.workdir.resolve()), "env": values,
                         "withheld": list(withheld)}  # fmt: skip
                turn = gate.submit(
                    task, limits, self._agent_name(request, config), priority=request.priority,
                    after=after, start=start,
                )  # fmt: skip
                if not turn.go:
                    gate.ensure_keeper(self.root, env)
                    if turn.blocked:  # for good, when what it runs after will not complete
                        self.tell_blocked(task=task, schedule=request.schedule)
                    return control.Started(0, None, turn)
                gated = True
            return control.start_detached(
                task, request.command.value, overrides,
                config_path=self.config_path, cwd=self.workdir.resolve(), env=env,
                schedule=request.schedule, again=request.again, executor=self.executor,
                # A firing is made under the schedules' lock, which holds every other firing
                # and `run now`: it waits START_WAIT, as the keeper does, not a person's wait.
                wait=control.START_WAIT if request.schedule is not None else None,
            )  # fmt: skip
        except BaseException:  # refused, or failed in a way of its own: nothing half-made
            if gated:  # the slot taken for it
                self.release(task)
            if created:  # a refused start leaves no task behind
                taskfolder.discard_new_task(task)
            raise

    def _issue_task(
        self, task: TaskPaths, issue: IssueStart, prompt: str, overrides: LoopOverrides
    ) -> LoopOverrides:  # fmt: skip
        """Write down the issue a detached issue run works on (issue.yaml, ISSUE.md), where
        its loop finds it; its overrides, under the issue runs' defaults."""
        from runagent.issues.issue import ISSUE_TIMEOUT
        from runagent.issues.worktree import main_repository

        repo = main_repository((self.workdir / issue.repo).resolve(), os.environ)
        runfolder.atomic_write(task.issue_body, issue.body or prompt)
        if not taskfolder.read_worktree_record(task).get("branch"):  # no worktree made yet
            taskfolder.write_worktree_record(
                task, {"issue": issue.number, "url": issue.url, "repo": str(repo)}
            )
        defaults = LoopOverrides(until=Until.READY_MARKER, timeout=ISSUE_TIMEOUT)
        return replace(defaults.merged(overrides), working_dir=None)

    @contextmanager
    def enter(self, request: StartRequest, tell: Callable[[Turn], None]) -> Iterator[Admission]:
        """A start whose loop runs in this process, for as long as the block lasts: admitted
        (once: a loop the door started elsewhere was admitted there), TASK.md claimed, and its
        turn taken, waiting here if it must for a slot under `limits:` or for the tasks it
        runs after (`tell` says so, once). A task this start made is gone again when it is
        refused on the way (not when it is left blocked or unreadable, for `resume`); its slot
        is free again when the block ends."""
        with self.pinned()._enter(request, tell) as admission:
            yield admission

    @contextmanager
    def _enter(self, request: StartRequest, tell: Callable[[Turn], None]) -> Iterator[Admission]:
        task = request.task
        admission = self._admitted(request) if request.admitted else self._admit(request)
        created = not task.folder.exists()
        try:
            if not request.admitted:
                taskfolder.claim_task_prompt(task, admission.prompt, request.conflict_hint)
            if request.message is not None:  # admitted: its first attempt starts with it
                self._keep_message(request)
            agent = admission.agent[0].name if admission.agent else admission.overrides.agent
            agent = agent or self._defaults(None)[0]
            waited = self.take_turn(request, agent, tell)
            pauser = self.pauser(request, agent)
            pauser.take_slot()  # a loop started again on a cluster host while paused
            yield replace(admission, waited=waited, pauser=pauser)
        except BlockedError:
            self.tell_blocked(task=task, schedule=request.schedule)
            raise  # the task stays blocked, for `resume`
        except DamagedRecordError:
            raise  # the task stays unreadable, for `resume`
        except BaseException:
            if created:  # a task refused before it ever ran leaves nothing behind
                taskfolder.discard_new_task(task)
            raise
        finally:
            self.release(task)

    # A race (runagent/store/race.py): its racers are tasks of their own beside the race's, each
    # started through this door as a detached loop in a worktree of its own (so the fleet's caps
    # count each like any loop); its watcher (runagent/race.py) holds the race's task, judges
    # the racers and stops the losers through `stop_all`.

    def admit_race(self, request: StartRequest) -> tuple[Admission, tuple[RacerStart, ...]]:
        """Check a race's start in the one order before anything is made: the race's own task
        as any start (its prompt, TASK.md's rule, a completed race unless asked again), its
        check (a race needs one), then each racer's start as any detached loop's (its agent,
        its worktree's repository and base). The race's admission, and each racer's start."""
        return self.pinned()._admit_race(request)

    def _admit_race(self, request: StartRequest) -> tuple[Admission, tuple[RacerStart, ...]]:
        spec, task = request.race, request.task
        assert spec is not None
        if request.issue is not None or request.issue_run:
            raise UsageError(
                "a race does not go with an issue run: race a task in a worktree of its own "
                "(each racer gets one), or run the issue as one loop"
            )
        if request.command is Command.JOB:
            raise UsageError("a race is of loops, and `job` runs the agent once; use run --race")
        self._check_worktree_on_cluster()
        remembered = LoopOverrides.remembered(task)
        racers = spec.racers(task.task_id, remembered.merged(request.overrides).agent)
        # The race's own task is admitted as a worktree run of its first racer's agent would be.
        first = racers[0].agent or request.overrides.agent
        own = replace(request, race=None,
                      overrides=replace(request.overrides, agent=first, worktree=True))  # fmt: skip
        admission = self._admit(own)
        starts = []
        for racer in racers:
            overrides = replace(
                admission.overrides, agent=racer.agent or admission.overrides.agent, worktree=True
            )
            self._refuse_race_without_check(overrides, racer.agent)
            start = StartRequest(
                TaskPaths(task.root, task.project_id, racer.task_id), admission.prompt,
                overrides=overrides, again=request.again, schedule=request.schedule,
                conflict_hint=f"it is a racer of another race; give race {task.label} another id",
                after=request.after, priority=request.priority, owner=request.owner,
            )  # fmt: skip
            starts.append(RacerStart(racer, start, self._admit(start)))
        return admission, tuple(starts)

    def _refuse_race_without_check(self, overrides: LoopOverrides, agent: str | None) -> None:
        """A race needs a check for each racer (`--check`, `check:` under `defaults:` or in the
        racer's agent's entry): the first racer whose check passes wins, and without one there
        is nothing to judge by (UsageError, naming the agent of `--agents` that has none)."""
        if self._settings(overrides).check is not None:
            return
        whose = f" (agent {agent} has none)" if agent is not None else ""
        raise UsageError(
            f"a race needs a check{whose}: the first racer whose check passes wins, and without "
            "one there is nothing to judge by; give --check CMD (or check: in config.yaml)"
        )

    def start_race(self, request: StartRequest) -> Started:
        """A race started detached: its racers, then its watcher (`python -m runagent.race`),
        which holds the race's task until the race is over; the watcher's pid."""
        return self.pinned()._start_race(request)

    def _start_race(self, request: StartRequest) -> Started:
        import subprocess

        task = request.task
        with self._race(request):
            config = self.current_config()
            env = self.started_env(config)
            with open(runfolder.supervisor_log_path(task), "ab", opener=runfolder.private) as out:
                watcher = subprocess.Popen(
                    python(*race.watcher_argv(task)),
                    cwd=self.workdir.resolve(), env=dict(env), stdin=subprocess.DEVNULL,
                    stdout=out, stderr=out, start_new_session=True,
                )  # fmt: skip
        # Let go of the race's task only now: its watcher, waiting for it, takes it at once.
        return self._await_watcher(task, watcher)

    def _await_watcher(self, task: TaskPaths, watcher: Popen[bytes]) -> Started:
        """The watcher holding the race's task; if it ends first, its racers are stopped and
        its last word is the error."""
        import time

        from runagent.executors.local import LOCK_WAIT, Started
        from runagent.store.lock import live_holder

        deadline = time.monotonic() + LOCK_WAIT  # while it lives: a loaded machine is slow
        while time.monotonic() < deadline:
            holder = live_holder(task.lock)
            if holder is not None and holder.pid == watcher.pid:
                return Started(watcher.pid, holder, process=watcher)
            if watcher.poll() is not None:
                break
            time.sleep(0.02)
        watcher.kill()
        watcher.wait()
        found = race.read(task)
        if found is not None:
            self.stop_all(found.tasks(task), found.stop_wait, Reason.STOPPED, "")
            race.end(task, race.Ending.FAILED, "its watcher did not start")
        tail = runfolder.tail(runfolder.supervisor_log_path(task), 600).strip().splitlines()
        why = tail[-1].removeprefix("run-agent: ") if tail else f"exit code {watcher.returncode}"
        raise RunAgentError(f"race {task.label}: its watcher did not start: {why}")

    @contextmanager
    def begin_race(self, request: StartRequest) -> Iterator[race.Race]:
        """A race started here: admitted, its task held for the block (the command line that
        follows it in the foreground watches it in the block) and its racers started; a start
        that fails on the way leaves no racer running."""
        with self.pinned()._race(request) as record:
            yield record

    @contextmanager
    def _race(self, request: StartRequest) -> Iterator[race.Race]:
        from runagent.store.lock import TaskLock

        admission, starts = self._admit_race(request)
        spec, task = request.race, request.task
        assert spec is not None
        created = not task.folder.exists()
        lock = TaskLock(runfolder.make_task_folder(task).lock, task.label)
        lock.acquire()  # AlreadyRunningError while a race of it runs
        started: list[TaskPaths] = []
        record = None
        try:
            taskfolder.claim_task_prompt(task, admission.prompt, request.conflict_hint)
            remembered = admission.remembered.merged(request.overrides)
            said = {"agents": ",".join(spec.agents)} if spec.agents else spec.to_record()
            taskfolder.write_task_settings(task, {**remembered.to_record(), **said})
            if request.again:  # the race runs again: an earlier win is the record's no longer
                task.done.unlink(missing_ok=True)
            budget = self._settings(admission.overrides).budget
            config = self.current_config()
            grace = (config.defaults if config is not None else LoopSettings()).kill_grace
            record = race.begin(
                task, spec, [s.racer for s in starts], budget.to_args() if budget else (),
                stop_wait=grace + RACE_STOP_MARGIN,
            )  # fmt: skip
            for start in starts:
                self._start(start.request, start.admission)
                started.append(start.request.task)
            yield record
        except BaseException as exc:
            if started:  # nothing is left racing for a race that did not start
                self.stop_all(started, record.stop_wait if record else 0.0,
                              Reason.STOPPED, "")  # fmt: skip
                interrupted = isinstance(exc, KeyboardInterrupt)
                race.end(
                    task, race.Ending.STOPPED if interrupted else race.Ending.FAILED,
                    f"race {task.label} stopped" if interrupted
                    else f"race {task.label} could not start all its racers: {exc}",
                )  # fmt: skip
            elif created:
                for path in (task.race, task.race_lock, task.folder / runfolder.TASK_SETTINGS):
                    path.unlink(missing_ok=True)
                lock.release()
                taskfolder.discard_new_task(task)
            raise
        finally:
            lock.release()

    def stop_all(
        self, stopped: list[TaskPaths], wait: float, reason: Reason, message: str
    ) -> list[TaskPaths]:
        """Stop several loops at once (a race's racers): each is asked to stop (taken out of the
        queue where it waits), then all are waited for together, up to `wait` seconds; the run
        each was stopped in says `reason` and `message` (`lost_race`, `budget`) rather than
        `stopped`. The tasks that were running or queued."""
        import time

        from runagent.store.lock import Holder

        asked: list[tuple[TaskPaths, Holder | None]] = []
        since = runfolder.timestamp()
        for task in stopped:
            try:
                held = self.stop(task, None)
            except RunAgentError:  # on a host this one cannot reach: it is judged as it ends
                continue
            if held is not None:
                asked.append((task, held if isinstance(held, Holder) else None))
        deadline = time.monotonic() + wait
        for _, holder in asked:
            while holder is not None and holder.alive() and time.monotonic() < deadline:
                time.sleep(0.02)
        if reason is not Reason.STOPPED:
            for task, _ in asked:
                race.mark_stopped_run(task, since, reason, message)
        return [task for task, _ in asked]

    def started_env(self, config: Config | None) -> dict[str, str]:
        """The environment what this door starts runs with: its own (this process's), less
        the variable holding the server's API key and the keeper's ticket."""
        from runagent.loop.context import START_TICKET

        key_variable = (config.server if config is not None else ServerSettings()).api_key_env
        env = credentials.scrub(self.env if self.env is not None else os.environ, key_variable)
        env.pop(START_TICKET, None)  # the keeper's ticket is the loop's own, never handed on
        return env

    def keep_queue(self) -> bool:
        """Start the queue's keeper if detached starts wait and none runs (it was killed):
        `serve` looks every few seconds. Whether it started one."""
        from runagent.fleet import gate

        if not gate.keeper_wanted(self.root):
            return False
        gate.ensure_keeper(self.root, self.started_env(self.current_config()))
        return True

    def take_turn(
        self, request: StartRequest, agent: str, tell: Callable[[Turn], None]
    ) -> str | None:
        """Before a loop runs in this process: wait here, if it must, for a slot under
        `limits:` or for the tasks it runs after (gate.take_turn); `tell` says so once. When
        it waited, since when."""
        config = self.current_config()
        limits = config.limits if config is not None else LimitsSettings()
        after = self._after(request)
        if not self._gated(request.task, limits, after, agent):
            return None
        from runagent.fleet import gate

        return gate.take_turn(
            request.task, limits, agent, priority=request.priority, after=after, tell=tell,
        )  # fmt: skip

    def pauser(self, request: StartRequest, agent: str) -> FleetPause:
        """How a loop this process runs pauses its agent across the fleet when its provider
        says it is limited, and waits the pause out without its slot (loop.supervisor.Pauser)."""
        return FleetPause(self, request, agent)

    def unpause(self, agent: str) -> str | None:
        """Lift `agent`'s pause (`fleet unpause`, the API, MCP): the pause it lifted, in words;
        None if the agent was not paused."""
        from runagent.executors import control
        from runagent.fleet import gate

        # On a cluster whose hosts keep runs roots of their own: lifted on every host first, so
        # that a start here meanwhile (the keeper's, as this root's pause goes) brings back no
        # pause from the cluster; then here.
        elsewhere = control.unpause(self.executor, agent)
        lifted = gate.unpause(self.root, agent) or elsewhere
        return lifted.words() if lifted is not None else None

    def hold_queue(self, by: str) -> tuple[QueueHold, bool]:
        """Hold the whole queue (`fleet hold`, the API, the page): no queued task starts until
        it is released; the loops that run go on. The hold in force, and whether this made it."""
        from runagent.fleet import gate

        return gate.hold_queue(self.root, by)

    def release_queue(self, only: QueueHold | None = None) -> QueueHold | None:
        """Release the queue (or only the hold `only`): the hold released, None if none was."""
        if not self._queue_exists():
            return None
        from runagent.fleet import gate

        return gate.release_queue(self.root, only)

    def stop_everything(
        self, wait: float, project: str | None = None, projects: frozenset[str] | None = None
    ) -> Everything:
        """Stop every loop (`stop --all`), or `project`'s, or those of `projects` (a token's
        reach), and take every task of theirs out of the queue, never started: the queue is held
        meanwhile, so a slot one frees does not start the next, and released after unless it
        was held before. Loops are asked at once, then waited for up to `wait` seconds; a look
        again catches one a keeper was starting as the hold came."""
        import time

        from runagent.fleet.queue import Waiting

        def reached(view: tasks.TaskView) -> bool:
            mine = view.paths.project_id
            return (project is None or mine == project) and (projects is None or mine in projects)

        from runagent.fleet import gate

        claimed = gate.claimed(self.root) if self._queue_exists() else set()

        def stoppable(view: tasks.TaskView) -> bool:  # a start a keeper is making too
            return _stoppable(view) or view.label in claimed

        if not any(reached(v) and stoppable(v) for v in listing.all_tasks(self.root, project)):
            return Everything((), (), self._queue_exists() and self._held())
        hold, made = self.hold_queue("stop --all")
        stopped: list[str] = []
        left: list[str] = []
        try:
            for _ in range(2):
                asked: list[Holder] = []
                for view in listing.all_tasks(self.root, project):
                    if not reached(view) or not stoppable(view):
                        continue
                    try:
                        held = self.stop(view.paths, None)
                    except RunAgentError:  # on a host this one cannot reach
                        continue
                    if isinstance(held, Waiting):
                        left.append(view.label)
                    elif held is not None:
                        stopped.append(view.label)
                        asked.append(held)
                deadline = time.monotonic() + wait
                for holder in asked:
                    while holder.alive() and time.monotonic() < deadline:
                        time.sleep(0.02)
        finally:
            if made:
                self.release_queue(hold)
        return Everything(tuple(sorted(set(stopped))), tuple(sorted(set(left) - set(stopped))),
                          not made)  # fmt: skip

    def _held(self) -> bool:
        from runagent.fleet.queue import Fleet

        return Fleet(self.root).queue_hold() is not None

    def _cluster_pauses(self) -> None:
        """Bring the agents paused on the hosts of a cluster that keep runs roots of their own
        into this root (control.sync_pauses); nothing elsewhere (the cluster's code is not
        even loaded then)."""
        if self.executor is None or not self.executor.apart:
            return
        from runagent.executors import control

        control.sync_pauses(self.root, self.executor)

    def limits(self) -> LimitsSettings:
        config = self.current_config()
        return config.limits if config is not None else LimitsSettings()

    def release(self, task: TaskPaths) -> None:
        """The loop this process ran has ended: its slot is free for the next in the queue."""
        if self._queue_exists():
            from runagent.fleet import gate

            gate.release(task)

    def _queue_exists(self) -> bool:
        return (self.root / runfolder.FLEET).is_dir()

    def _gated(
        self, task: TaskPaths, limits: LimitsSettings, after: tuple[str, ...], agent: str
    ) -> bool:
        """Whether a start passes the fleet's gate (the fleet's code loads only then). On a
        cluster whose hosts keep runs roots of their own, the agents paused on any of them are
        brought into this root first: a start of one waits here, as on a shared root."""
        self._cluster_pauses()
        if not (limits.active or after or self._queue_exists()):
            return False
        from runagent.fleet import gate

        return gate.needed(task, limits, after, agent)

    def _after(self, request: StartRequest) -> tuple[str, ...]:
        """The tasks a start waits for: as given, else (a resume of a blocked task) those its
        place in the queue names."""
        if request.after:
            from runagent.fleet import depends

            return depends.parse_after(request.after, request.task)
        if not self._queue_exists():
            return ()
        from runagent.fleet.queue import Fleet

        record = Fleet(self.root).record_of(request.task)
        return record.after if record is not None else ()

    def _agent_name(self, request: StartRequest, config: Config | None) -> str:
        """The agent the loop will run, for the caps that count per agent."""
        name = LoopOverrides.remembered(request.task).merged(request.overrides).agent
        return name or (config.defaults.agent if config is not None else None) or ""

    def fire(self, firing: Firing) -> int:
        """Start a schedule's firing (the scheduler's launch); its supervisor's pid."""
        config = firing.schedule
        if config.prompt_file is not None:
            try:
                prompt = config.prompt_file.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(
                    f"schedules.{config.name}.prompt_file {str(config.prompt_file)!r} cannot be "
                    f"read as text ({exc}); fix the path"
                ) from exc
        else:
            prompt = config.prompt or ""
        validate_prompt(prompt, f"the prompt of schedules.{config.name}")
        task = TaskPaths(self.root, validate_id("project", config.project), firing.task_id)
        overrides = LoopOverrides(
            agent=config.agent, max_restarts=config.max_restarts, timeout=config.timeout,
            until=config.until, stuck_after=config.stuck_after, budget=config.budget,
            worktree=config.worktree, base=config.base, working_dir=config.cwd,
            check=config.check, check_timeout=config.check_timeout, session=config.session,
        )  # fmt: skip
        issue = config.issue
        request = StartRequest(
            task, prompt, overrides=overrides, schedule=config.name,
            again=True,  # a firing of a task it fired before runs it again
            conflict_hint="use {datetime} in the schedule's task",
            after=config.after, priority=config.priority,
            issue=IssueStart(issue.number, issue.repo, prompt, issue.url) if issue else None,
            race=config.race,
        )  # fmt: skip
        return self.start(request).pid

    def stop(self, task: TaskPaths, wait: float | None) -> Holder | Waiting | None:
        """Take the task out of the queue (its record), else stop its loop wherever it runs
        (control.stop: the holder asked); None if it was neither queued nor running. A race's
        task: its watcher is asked, which stops every racer (`_stop_race`)."""
        from runagent.executors import control

        if race.is_race(task):
            return self._stop_race(task, wait)
        if self._queue_exists():
            from runagent.fleet import gate

            def settle() -> None:
                if not task.run_ids():  # it never ran: say what became of it
                    said = {"at": runfolder.timestamp(), "left": "stopped before it started"}
                    runfolder.atomic_write(runfolder.confine(task).left_queue,
                                           runfolder.dump_yaml(said))  # fmt: skip

            left = gate.dequeue(task, settle)
            if left is not None and not self._paused_loop(task, left):
                self.tell_blocked(task)  # the tasks that ran after it never start now
                return left
        withdrawn = control.withdraw(task, self.executor)  # from the cluster's queue
        if withdrawn is not None:
            return withdrawn
        return control.stop(task, wait, self.executor)

    def tell_blocked(
        self, on: TaskPaths | None = None, *, task: TaskPaths | None = None,
        notifier: Notifier | None = None, schedule: str | None = None,
    ) -> None:  # fmt: skip
        """Tell a person (the notifiers' `needs_input`) of each task blocked for good, not told
        yet: of those that run after `on` (a loop of it ended without completing, it was
        deleted), or of `task` itself (a start found it blocked). Each blocking is told once,
        by whoever finds it first (fleet.depends.untold). With no `notifier` (a loop's), the
        config's (or `schedule`'s) is used, and waited for."""
        if not self._queue_exists():
            return
        from runagent.loop import notify

        own = notifier is None
        if notifier is None:
            from runagent.loop.redaction import Redactor

            config = self.current_config()
            if config is None:
                return
            notifier = notify.loop_notifier(config, schedule, lambda line: None, Redactor())
        if notifier is None or not notifier.wants(NotifyEvent.NEEDS_INPUT):
            return
        from runagent.fleet import depends

        label = task.label if task is not None else None
        try:
            found = depends.untold(self.root, on=on.label if on else None, label=label)
        except (RunAgentError, OSError) as exc:  # telling is never why a loop or a start fails
            notifier.log(f"could not look for blocked tasks to tell of: {exc}")
            found = []
        for need in found:
            notifier.tell_need(need, schedule)
        if own:
            notifier.drain(notify.DRAIN)

    def _paused_loop(self, task: TaskPaths, left: Waiting) -> bool:
        """Whether a record taken out of the queue was a loop's that waits out its agent's
        pause holding its task: that loop is stopped too."""
        from runagent.store.lock import live_holder

        holder = live_holder(task.lock)
        return left.waiter is not None and holder is not None

    def _stop_race(self, task: TaskPaths, wait: float | None) -> Holder | None:
        """Stop a race: its watcher (detached, or the command line that follows it) stops its
        racers and says the race was stopped; with no watcher alive, its racers are stopped
        here."""
        from runagent.executors import control
        from runagent.store.host import is_here
        from runagent.store.lock import live_holder

        try:
            found = race.read(task)
        except ValueError:
            found = None
        holder = live_holder(task.lock)
        if holder is not None and holder.pid == os.getpid() and is_here(holder.host):
            # This process holds it while it starts the race's racers (the page's start of
            # it): signalled, it would be this server that stopped.
            raise AlreadyRunningError(  # 409: the task is not in a state to take it yet
                f"race {task.label} is still starting its racers; stop it once it has started"
            )
        if holder is not None:  # its watcher waits for its racers to stop
            extra = found.stop_wait if found is not None and wait is not None else 0.0
            return control.stop(task, None if wait is None else wait + extra, self.executor)
        if found is None:
            return None
        self.stop_all(found.tasks(task), wait or 0.0, Reason.STOPPED, "")
        return None

    def delete(
        self, task: TaskPaths, force: bool = False, confirm: Callable[[Doomed], None] | None = None
    ) -> tuple[Doomed, int]:
        """Remove a task that is not running, with all its runs (after `confirm`, which may
        raise to refuse); what was removed and the bytes freed."""
        from runagent.store import cleanup

        doomed = cleanup.delete_plan(task, force)  # AlreadyRunningError while its loop runs
        # A race's task goes with its racers (none of them running), as one.
        plans = [doomed, *(cleanup.delete_plan(r, force) for r in self._racers(task))]
        doomed = replace(doomed, size=sum(plan.size for plan in plans))
        if confirm is not None:
            confirm(doomed)
        from runagent.executors import control

        for plan in plans:
            if self._queue_exists():  # a queued task is never started once deleted
                from runagent.fleet import gate

                gate.dequeue(plan.task)
            control.withdraw(plan.task, self.executor)  # nor once its actor waits in Ray's queue
        freed = cleanup.carry_out(plans, self.root)
        for plan in plans:  # the tasks that ran after it are blocked for good
            self.tell_blocked(plan.task)
        return doomed, freed

    def _racers(self, task: TaskPaths) -> list[TaskPaths]:
        """The racers' tasks of a race's task; none for any other task (or a race whose record
        cannot be read: its racers are deleted one by one)."""
        try:
            found = race.read(task)
        except ValueError:
            return []
        return found.tasks(task) if found is not None else []

    def merge(
        self, task: TaskPaths, *, push: str | None = None, into: str | None = None,
        force: bool = False,
    ) -> str:  # fmt: skip
        """Bring a task's worktree branch back: merged into the branch it started from (as
        `issues.merge` says), or pushed to `push`; what was done, in words."""
        from runagent.issues import merging

        task = self.winner_of(task)
        if push is not None:
            if into is not None:
                raise UsageError("--push and --into do not go together: push, or merge")
            return merging.push(task, push, os.environ, force=force)
        config = self.current_config()
        mode = config.issues.merge if config is not None else MergeMode.FF
        return merging.merge(task, mode, os.environ, into=into, force=force).words(task.label)

    def rebase(
        self, task: TaskPaths, *, onto: str | None = None, abort: bool = False,
        owner: bool = False, sender: str = "",
    ) -> Rebased:  # fmt: skip
        """Bring the branch a task's worktree work merges into (or `onto`) into its worktree
        (runagent/issues/rebasing.py), by a merge run where its agent runs (under its sandbox
        when it has one), holding the task meanwhile. Merged cleanly, the task's check (if it
        has one) judges the result; conflicts, or a check that fails on it, are its agent's
        to resolve: its loop is resumed, and completes only once they are. `abort` undoes a
        merge stopped on conflicts."""
        return self.pinned()._rebase(self.winner_of(task), onto, abort, owner, sender)

    def _rebase(
        self, task: TaskPaths, onto: str | None, abort: bool, owner: bool, sender: str
    ) -> Rebased:
        from runagent.issues import rebasing
        from runagent.store.lock import TaskLock

        remembered = LoopOverrides.remembered(task)
        settings = self._settings(remembered)
        env = dict(self.env if self.env is not None else os.environ)
        lock = TaskLock(runfolder.confine(task).lock, task.label)
        lock.acquire()  # AlreadyRunningError while a loop holds it
        try:
            if abort:
                if rebasing.pending(task) is None:
                    raise UsageError(f"task {task.label} has no rebase waiting to be undone")
                self._in_tree(task, rebasing.abort_argv(task), env, settings)
                return rebasing.aborted(task, env)
            planned = rebasing.plan(task, env, onto)
            if isinstance(planned, rebasing.Rebased):
                return planned
            argv, merge_env = rebasing.merge_argv(planned), rebasing.merge_env(planned, env)
            code, said = self._in_tree(task, argv, merge_env, settings)
            done = rebasing.conclude(planned, code, said, env)
        finally:
            lock.release()
        if done.how == "merged" and settings.check is not None:
            checked = self._recheck(task)
            if not checked.passed:
                rebasing.keep(task, rebasing.Rebase(done.onto, done.commit, rebasing.CHECK_FAILED,
                                                    check=settings.check))  # fmt: skip
                done = replace(done, how="check failed")
        if rebasing.pending(task) is not None:  # its agent's to finish: its loop goes on
            self.start(StartRequest(task, command=Command.RESUME, again=True, owner=owner,
                                    sender=sender or "rebase"))  # fmt: skip
            done = replace(done, resumed=True)
        return done

    def _in_tree(
        self, task: TaskPaths, argv: list[str], env: Mapping[str, str], settings: LoopSettings
    ) -> tuple[int, str]:
        """Run run-agent's `argv` in the task's worktree where its agent runs (under its
        sandbox when it has one: the worktree's git folder is the agent's to write); its exit
        code and output (also in the task's rebase.txt)."""
        from runagent.loop import check

        output = runfolder.confine(task).folder / "rebase.txt"
        output.unlink(missing_ok=True)
        reach = None
        if settings.sandbox is AgentSandbox.BWRAP:
            from runagent.loop import sandbox

            control = (self.config_path,) if self.config_path is not None else ()
            reach = sandbox.Reach(task, None, control=control, network=False)
        given = check.Check(argv[0], 600.0, settings.kill_grace, words=tuple(argv))
        result = check.run(given, cwd=task.worktree, env=env, output=output, reach=reach)
        if reach is not None:
            for line in sandbox.after_check(reach, task.worktree, "rebase"):
                runfolder.append_line(output, f"run-agent: {line}")
        if result.unstarted:
            raise MissingDependencyError(f"git cannot run in {task.worktree}: {result.unstarted}")
        return result.exit_code, runfolder.tail(output, 4000)

    def winner_of(self, task: TaskPaths) -> TaskPaths:
        """The task whose branch is `task`'s to merge: a race's winner (its branch is the race's
        branch), else the task itself. A race not won has no branch to merge (UsageError)."""
        try:
            found = race.read(task)
        except ValueError as exc:
            raise DamagedRecordError(str(exc)) from None
        if found is None:
            return task
        if found.winner is None:
            raise UsageError(
                f"race {task.label} has no winner ({found.outcome or 'it is still running'}), so "
                "no branch to bring back; merge one of its racers by its own id"
            )
        return TaskPaths(task.root, task.project_id, found.winner)

    def hold_scheduler(self) -> bool:
        """Whether this process may fire schedules (on a cluster, only one does)."""
        from runagent.executors import control

        return control.hold_scheduler(self.executor)

    def fleet(self, projects: frozenset[str] | None = None) -> Overview:
        """The fleet at a glance (runagent.fleet.overview), under the config's limits and
        budgets as a start now would see them; only `projects`' part of it, if given."""
        from runagent.fleet.overview import overview

        self._cluster_pauses()
        config = self.current_config()
        if config is None:
            return overview(self.root, projects=projects)
        return overview(self.root, config.limits, config.budgets, projects)

    def agent_choices(self) -> dict[str, object]:
        """The config's agents as a start form offers them: each one's name, backend and model,
        and the default; and `paste`, which needs no config (a person carries the text)."""
        config = self.current_config()
        if config is None:
            return {"default": None, "agents": []}
        agents: list[dict[str, object]] = [
            {"name": a.name, "type": a.type, "model": a.model} for a in config.agents.values()
        ]
        if "paste" not in config.agents:
            agents.append({"name": "paste", "type": "paste", "model": None})
        return {"default": config.defaults.agent, "agents": agents}


def _never_stopped(seconds: float) -> bool:
    """A wait a stop does not end (a stop signal ends the whole process then)."""
    import time

    time.sleep(seconds)
    return False


@record
class Everything:
    """What `stop --all` did: the loops it stopped, the tasks it took out of the queue (never
    started), and whether the queue was held before (and so is still)."""

    stopped: tuple[str, ...]
    left_queue: tuple[str, ...]
    held: bool

    def to_dict(self) -> dict[str, object]:
        return {"stopped": list(self.stopped), "left_queue": list(self.left_queue),
                "held": self.held}  # fmt: skip


def _stoppable(view: tasks.TaskView) -> bool:
    """What `stop --all` stops (a running loop) or takes out of the queue (any record)."""
    return view.status is tasks.TaskStatus.RUNNING or view.queue is not None


def _secret_variables(config: Config | None) -> tuple[str, ...]:
    """The variables a config names as holding a secret, whatever their names look like: its
    agents' `token_env`, the webhook's `secret_env`."""
    if config is None:
        return ()
    named = [agent.token_env for agent in config.agents.values()]
    named.append(config.notify.secret_env if config.notify is not None else None)
    return tuple(name for name in named if name)


class FleetPause:
    """A loop's Pauser (loop.supervisor): its agent paused under the runs root, its slot given
    back while the pause lasts, its turn taken again in the queue when it lifts."""

    def __init__(self, service: Service, request: StartRequest, agent: str) -> None:
        from runagent.executors.local import CLUSTER_ENV

        self.service, self.request, self.agent = service, request, agent
        # On a host of a Ray cluster: the loop's agent_slot there, given back meanwhile too
        # (the cluster's code is loaded only by a loop a host agent started).
        self.slot: ClusterSlot | None = None
        if os.environ.get(CLUSTER_ENV):
            from runagent.executors import control

            self.slot = control.cluster_slot(request.task)

    def pause(self, seconds: float, why: str) -> str:
        from runagent.fleet import gate

        return gate.pause(self.request.task, self.agent, seconds, why).words()

    def wait_out(self, stop: StopSignal) -> bool:
        from runagent.fleet import gate

        limits = self.service.limits()
        if self.service.executor is not None and self.service.executor.type is ExecutorType.RAY:
            limits = LimitsSettings()  # the cluster's agent_slot is its cap
        if self.slot is not None:
            self._cluster(self.slot.give_back)
        if not gate.wait_out(self.request.task, limits, self.agent, stop.wait,
                             priority=self.request.priority):  # fmt: skip
            return False
        if self.slot is None:
            return True
        slot = self.slot
        return self._cluster(lambda: slot.take_again(stop.wait), True)

    def take_slot(self) -> None:
        """Before its first attempt: a loop a cluster's host agent started again after its
        supervisor died while its agent was paused (its slot given back) takes the slot again
        on its host, waiting in Ray's queue for it; any other loop has nothing to take."""
        slot = self.slot
        if slot is not None and slot.bundle:
            self._cluster(lambda: slot.take_again(_never_stopped), True)

    def _cluster(self, call: Callable[[], bool], otherwise: bool = False) -> bool:
        """A call to the cluster about the loop's slot; a cluster that cannot be asked (or a
        host without Ray) leaves the slot as it was, said in the loop's log."""
        try:
            return call()
        except (RunAgentError, ImportError) as exc:
            print(f"run-agent: the loop's agent_slot on the cluster stays as it was: {exc}",
                  file=sys.stderr, flush=True)  # fmt: skip
            return otherwise
