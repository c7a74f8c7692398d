"""The typed, frozen settings every part of run-agent reads (config/file.py reads them)."""

from __future__ import annotations

import enum
import functools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import field, fields, replace
from pathlib import Path
from typing import Any

from runagent.errors import UsageError, shown
from runagent.ops import Approvals
from runagent.record import record
from runagent.store.race import RaceSpec


class Permissions(enum.StrEnum):
    """What a CLI agent may do without a person to approve it."""

    BYPASS = "bypass"  # edit files and run commands without asking (unattended runs)
    NONE = "none"  # no permission flags: the CLI's own defaults, or flags given in `args`


class Until(enum.StrEnum):
    """When a task counts as completed."""

    EXIT = "exit"  # the agent exits 0 (or writes DONE)
    DONE_FILE = "done-file"  # only when the agent has written DONE
    READY_MARKER = "ready-marker"  # only a commit since the loop's base carrying the marker


class Mode(enum.StrEnum):
    """What a chat-completions agent does with its turn."""

    ANSWER = "answer"  # one streamed answer, written to output.md
    AGENT = "agent"  # a conversation of operations messages, run in the working folder


DEFAULT_MAX_TURNS = 20


@record
class Budget:
    """What a task, or a project or the whole root in a day, may spend: a cost in USD and/or a
    number of tokens (read and written, summed). None: no bound on that."""

    usd: float | None = None
    tokens: int | None = None

    def crossed(self, tokens: int, cost: float | None, strict: bool = True) -> str:
        """How much of what was spent, once past the budget (with `strict`; else once at it:
        nothing is left to start another run with); '' while within it."""

        def past(used: float, limit: float) -> bool:
            return used > limit or (not strict and used >= limit)

        if self.usd is not None and cost is not None and past(cost, self.usd):
            return f"${cost:.2f} of ${self.usd:.2f}"
        if self.tokens is not None and past(tokens, self.tokens):
            return f"{tokens:,} of {self.tokens:,} tokens"
        return ""

    def words(self) -> str:
        parts = []
        if self.usd is not None:
            parts.append(f"${self.usd:.2f}")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        return " and ".join(parts) or "none"

    def to_args(self) -> list[str]:
        """As `--budget` values."""
        args = [] if self.usd is None else [f"{self.usd:g}usd"]
        return args + ([] if self.tokens is None else [f"{self.tokens}tokens"])


def parse_budget(values: Collection[object], where: str) -> Budget | None:
    """`--budget` values (`0.50usd`, `$0.50`, `200000tokens`, `200k-tokens`, `1.5m-tokens`), each
    a cost or a number of tokens; None for none. UsageError naming a value that is neither."""
    import re

    usd: float | None = None
    tokens: int | None = None
    for value in values:
        text = str(value).strip().lower().replace(" ", "")
        money = re.fullmatch(r"\$(\d+(?:\.\d+)?)|(\d+(?:\.\d+)?)(?:usd|\$)", text)
        count = re.fullmatch(r"(\d+(?:\.\d+)?)([km]?)-?tokens?", text)
        if money:
            usd = float(money.group(1) or money.group(2))
        elif count:
            scale = {"": 1, "k": 1_000, "m": 1_000_000}[count.group(2)]
            tokens = int(float(count.group(1)) * scale)
        else:
            raise UsageError(
                f"{where} {shown(value)} is not a budget; give a cost such as 0.50usd or a number "
                "of tokens such as 200k-tokens"
            )
    if usd is None and tokens is None:
        return None
    return Budget(usd, tokens)


def check_words(command: str, where: str) -> tuple[str, ...]:
    """The words of a check's command line (`--check`, `check:`), split as a shell splits them
    (quotes and backslashes; no variables, globs, pipes or `&&`: it runs without a shell, so
    `sh -c '...'` where one is wanted). UsageError naming `where` for one that holds a NUL
    byte, cannot be split, or is empty."""
    import shlex

    if "\0" in command:
        raise UsageError(f"{where} {shown(command)} holds a NUL byte")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise UsageError(f"{where} {shown(command)} cannot be split into words ({exc})") from None
    if not words:
        raise UsageError(f"{where} is empty; give a command such as 'pytest -q', or leave it out")
    return tuple(words)


@record
class OpsSettings:
    """The `ops:` section: the policy agent-mode runs act under, and who answers approvals."""

    policy: str = "standard"  # a preset: restrictive, standard, permissive
    rules: Mapping[str, object] = field(default_factory=dict)  # as Policy.from_config takes
    approvals: Approvals = Approvals.DENY
    sandbox: str = "auto"  # where shell operations run: auto (bwrap where it works), bwrap, none

    def to_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "rules": dict(self.rules),
            "approvals": self.approvals.value,
            "sandbox": self.sandbox,
        }


@record
class PasteSettings:
    """The `paste:` section: how the copy-paste channel waits for a person."""

    wait: float | None = None  # seconds to wait for one reply before the run fails; None: forever
    clipboard: bool = True  # copy each outbox to the clipboard where there is one

    def to_dict(self) -> dict[str, object]:
        return {"wait": self.wait, "clipboard": self.clipboard}


class AgentSandbox(enum.StrEnum):
    """Where an agent's process runs: as the user (`none`), or under bubblewrap (`bwrap`): its
    folders writable, its CLI's own login folders too, the rest read-only, the home hidden."""

    NONE = "none"
    BWRAP = "bwrap"


class Session(enum.StrEnum):
    """Whether an attempt after another continues the agent's own session (`session:`)."""

    CONTINUE = "continue"  # resume the previous run's session by its id, told the failure's tail
    FRESH = "fresh"  # start a new session, told the task again and the failure's tail


@record
class AgentConfig:
    """One entry of `agents:`; `type` is the backend that runs it."""

    name: str
    type: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    model: str | None = None
    base_url: str | None = None
    token: str | None = None
    token_file: Path | None = None
    token_env: str | None = None
    permissions: Permissions = Permissions.BYPASS
    pass_env: tuple[str, ...] = ()
    mode: Mode = Mode.ANSWER
    max_turns: int = DEFAULT_MAX_TURNS  # agent mode: model replies before the run fails
    ops: OpsSettings = field(default_factory=OpsSettings)  # the config's `ops:` section
    paste: PasteSettings = field(default_factory=PasteSettings)  # the config's `paste:` section
    stuck_after: int | None = None  # this agent's own (None: as defaults.stuck_after says)
    budget: Budget | None = None  # what a task run by this agent may spend, unless told else
    worktree: bool | None = None  # its tasks work in worktrees of their own (None: as defaults)
    sandbox: AgentSandbox | None = None  # its process under bubblewrap (None: as defaults)
    network: bool | None = None  # whether it reaches the network when sandboxed (None: as defaults)
    check: str | None = None  # the command that judges its runs that say they are done
    check_timeout: float | None = None  # how long that may take (0: no bound; None: as defaults)
    session: Session | None = None  # continue or fresh (None: as defaults)

    def loop_defaults(self, defaults: LoopSettings) -> LoopSettings:
        """The config's loop defaults with what this agent sets for itself in their place."""
        if self.stuck_after is not None:
            defaults = replace(defaults, stuck_after=self.stuck_after)
        if self.budget is not None:
            defaults = replace(defaults, budget=self.budget)
        if self.worktree is not None:
            defaults = replace(defaults, worktree=self.worktree)
        if self.sandbox is not None:
            defaults = replace(defaults, sandbox=self.sandbox)
        if self.network is not None:
            defaults = replace(defaults, network=self.network)
        if self.check is not None:
            defaults = replace(defaults, check=self.check)
        if self.check_timeout is not None:
            defaults = replace(defaults, check_timeout=self.check_timeout or None)
        if self.session is not None:
            defaults = replace(defaults, session=self.session)
        return defaults


@record
class LoopSettings:
    """The `defaults:` section: how a task's loop runs unless a command-line option says else."""

    agent: str | None = None
    max_restarts: int = 5
    restart_delay: float = 2.0
    restart_delay_max: float = 60.0
    timeout: float | None = None
    idle_timeout: float | None = 1800.0
    kill_grace: float = 5.0
    non_retryable_exit_codes: frozenset[int] = frozenset({2, 3, 126, 127})
    crash_loop_runs: int = 3
    crash_loop_seconds: float = 5.0
    until: Until = Until.EXIT
    rate_limit_wait: float = 900.0  # when a rate limit gives no reset time
    rate_limit_max_wait: float = 21600.0  # never wait longer than this for one limit
    max_rate_limit_waits: int = 10  # rate-limited runs in a row before giving up
    budget: Budget | None = None  # what the task may spend over all its runs (None: no bound)
    stuck_after: int = 3  # attempts in a row without progress before the loop stops (0: never)
    worktree: bool = False  # each task's loop works in a git worktree of its own
    sandbox: AgentSandbox = AgentSandbox.NONE  # the agent's process under bubblewrap, or not
    network: bool = True  # a sandboxed agent reaches the network (false: its own, empty one)
    # A command that judges a run that says it is done (runagent/loop/check.py): exit 0 passes.
    check: str | None = None
    check_timeout: float | None = 600.0  # how long the check may run (None: no bound)
    # Whether the next attempt resumes the previous run's session where the agent's CLI can.
    session: Session = Session.CONTINUE


class Overlap(enum.StrEnum):
    """What a schedule does when it fires while its previous firing still runs."""

    SKIP = "skip"  # log it and do not fire
    QUEUE = "queue"  # fire as soon as the previous one ends (one waits at most)
    ALLOW = "allow"  # fire anyway


class NotifyEvent(enum.StrEnum):
    """What a notification can be sent for (`notify.on`)."""

    COMPLETED = "completed"  # the task completed
    FAILED = "failed"  # a run failed (the loop may go on)
    GAVE_UP = "gave_up"  # the loop ended without completing the task
    NEEDS_INPUT = "needs_input"  # a person must answer: an approval, a paste reply, a stuck loop


@record
class NotifyConfig:
    """Hooks for when runs complete, fail or give up: a command and/or a webhook."""

    command: tuple[str, ...] = ()
    webhook: str | None = None
    secret_env: str | None = None  # the variable holding the HMAC key for the webhook
    events: frozenset[NotifyEvent] = frozenset(NotifyEvent)


CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@record
class ScheduleKeep:
    """A schedule's own retention (`keep:`): its finished firings' tasks beyond the newest `last`
    and older than `older_than` seconds go; with `failed`, those that did not complete stay."""

    last: int = 0
    older_than: float | None = None
    failed: bool = False


@record
class ScheduleConfig:
    """One entry of `schedules:`."""

    name: str
    cron: str  # five fields (aliases expanded)
    timezone: str
    project: str
    task: str  # template: {name} {date} {time} {datetime}
    prompt: str | None = None
    prompt_file: Path | None = None
    agent: str | None = None
    overlap: Overlap = Overlap.SKIP
    max_restarts: int | None = None
    timeout: float | None = None
    until: Until | None = None  # None: as defaults.until says
    enabled: bool = True
    catch_up: bool = False
    notify: NotifyConfig | None = None
    keep: ScheduleKeep | None = None  # None: its tasks stay until `gc` or `delete`
    after: tuple[str, ...] = ()  # P/T of tasks each firing waits for (`--after`)
    stuck_after: int | None = None  # each firing's stuck detection (None: as its agent's)
    budget: Budget | None = None  # what each firing may spend
    priority: int = 0  # each firing's place in the queue under `limits:`
    worktree: bool | None = None  # each firing works in a worktree of its own (None: as its agent)
    base: str | None = None  # the revision such a worktree starts from (None: HEAD)
    cwd: Path | None = None  # the folder (repository) its agent works in (None: serve's folder)
    issue: ScheduleIssue | None = None  # each firing an issue run on this issue
    check: str | None = None  # what judges each firing's runs (None: as its agent's)
    check_timeout: float | None = None  # how long that may take (0: no bound; None: as its agent)
    race: RaceSpec | None = None  # each firing a race (`race: N` or `agents: [a, b]`)
    session: Session | None = None  # continue the agent's session or not (None: as its agent)


@record
class ScheduleIssue:
    """A schedule's `issue:`: each firing works on it in a fresh worktree (an issue run)."""

    number: int
    repo: Path
    url: str = ""


@record
class ServerSettings:
    """The `server:` section: where `run-agent serve` listens and which key it requires."""

    host: str = "127.0.0.1"
    port: int = 14355
    api_key_env: str = "RUN_AGENT_API_KEY"
    # Host names (beside loopback and the listening address) that requests may name: the names
    # the server is reached by. Anything else is refused, so a rebound DNS name gets nothing.
    allowed_hosts: tuple[str, ...] = ()
    # Folders an operations run created over the API may act in (its workspace must be inside
    # one); empty: the folder `run-agent serve` was started in.
    ops_workspaces: tuple[Path, ...] = ()

    def api_key(self, env: Mapping[str, str]) -> str | None:
        return env.get(self.api_key_env) or None

    def page(self, host: str | None = None, port: int | None = None) -> str:
        """The page's address for a browser: `serve`'s host (a name it is reached by, where it
        listens on every address) and port, or these settings' own."""
        host = host or self.host
        if host in ("0.0.0.0", "::", ""):  # every address: the first name given, else loopback
            host = self.allowed_hosts[0] if self.allowed_hosts else "127.0.0.1"
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{shown}:{port or self.port}/"


class MergeMode(enum.StrEnum):
    """How `run-agent merge` brings a task's branch back (`issues.merge`)."""

    FF = "ff"  # a fast-forward where it can be one, else a merge commit
    FF_ONLY = "ff-only"  # a fast-forward, or nothing
    NO_FF = "no-ff"  # always a merge commit


@record
class IssueSettings:
    """The `issues:` section: how a task's new worktree (an issue or --worktree run) is made
    ready, and how `merge` brings its branch back."""

    # Run in a new worktree before its first agent (ignored files such as .env or
    # node_modules are not in a fresh checkout).
    setup: tuple[str, ...] = ()
    merge: MergeMode = MergeMode.FF


class ExecutorType(enum.StrEnum):
    """What runs a task's loop: this machine, or a Ray cluster."""

    LOCAL = "local"  # a detached supervisor on this machine (nothing to install)
    RAY = "ray"  # a named actor on a Ray cluster (pip install 'run-agent[ray]')


@record
class ExecutorSettings:
    """The `executor:` section: where task loops run (`--executor` picks the type)."""

    type: ExecutorType = ExecutorType.LOCAL
    address: str = "auto"  # the Ray cluster: auto (the one this host joined) or HOST:PORT
    namespace: str = "run-agent"  # Ray namespace the task actors are named in
    # What one task's loop takes of a host; hosts offer `agent_slot` when they join.
    resources: Mapping[str, float] = field(default_factory=lambda: {"agent_slot": 1.0})
    max_restarts: int = 3  # times a loop is restarted on another host after its host died
    # The run root is mounted at the same path on every host: the server reads run folders
    # directly. Otherwise each host writes under its own root and the server reads through Ray.
    shared_root: bool = True

    @property
    def apart(self) -> bool:
        """Whether loops run on a Ray cluster whose hosts keep runs roots of their own."""
        return self.type is ExecutorType.RAY and not self.shared_root


@record
class LimitsSettings:
    """The `limits:` section: how many task loops run at once under the runs root. A start over
    a cap waits in the queue (runagent/fleet/) instead of failing. None: no cap.

    The one owner of the limits' names: config.yaml's keys (`names`, which config/file.py
    reads by), a queue record's (`to_record`, `from_record`: a detached start's record carries
    the limits to the keeper, which reads no config), and the fleet's listing (the overview
    hands on `to_record`). A limit is a whole number or None, or whole numbers by name; adding
    one is a field here and what it caps in `full_cap` (docs/architecture.md)."""

    max_running: int | None = None  # all tasks under the runs root
    per_project: int | None = None  # each project, unless `projects` names it
    projects: Mapping[str, int] = field(default_factory=dict)  # a project's own cap
    agents: Mapping[str, int] = field(default_factory=dict)  # an agent's (a provider's limit)

    @staticmethod
    def names() -> tuple[tuple[str, bool], ...]:
        """Each limit's name, in order, and whether it holds caps by name (`projects: {web:
        1}`) rather than one cap (`max_running: 4`)."""
        return _limit_names()

    @property
    def active(self) -> bool:
        return any(getattr(self, name) if by_name else getattr(self, name) is not None
                   for name, by_name in self.names())  # fmt: skip

    def full_cap(self, project: str, agent: str, running: Sequence[tuple[str, str]]) -> str:
        """The first cap a task of `project` run by `agent` would exceed, `running` (the project
        and agent of each task holding a slot) holding slots, in words (`max_running 4`,
        `project web's limit of 1`); '' if none."""
        return self.full_cap_counted(
            project, agent, len(running), sum(p == project for p, _ in running),
            sum(a == agent for _, a in running),
        )  # fmt: skip

    def full_cap_counted(
        self, project: str, agent: str, running: int, of_project: int, of_agent: int
    ) -> str:  # fmt: skip
        """`full_cap` with the slots held counted already: all of them, `project`'s and
        `agent`'s (the queue keeps counts as it goes down its order, rather than a list)."""
        if self.all_taken(running):
            return f"max_running {self.max_running}"
        per_project = self.projects.get(project, self.per_project)
        if per_project is not None and of_project >= per_project:
            return f"project {project}'s limit of {per_project}"
        per_agent = self.agents.get(agent)
        if per_agent is not None and of_agent >= per_agent:
            return f"agent {agent}'s limit of {per_agent}"
        return ""

    def all_taken(self, running: int) -> bool:
        """Whether `running` slots held fill the cap on all tasks (no task fits, whatever its
        project or agent: the queue looks no further down its order)."""
        return self.max_running is not None and running >= self.max_running

    def to_record(self) -> dict[str, Any]:
        """The limits as JSON: in a queue record, and in the fleet's listing (the API, the
        page)."""
        return {name: dict(getattr(self, name)) if by_name else getattr(self, name)
                for name, by_name in self.names()}  # fmt: skip

    @classmethod
    def from_record(cls, value: object, where: str = "limits") -> LimitsSettings:
        """The limits `to_record` gave; ValueError naming the first field (`where.NAME`) that
        is not what it should be, in one line. A limit the record lacks is not set."""
        data = _record_object(value, where)
        found: dict[str, Any] = {}
        for name, by_name in cls.names():
            given, key = data.get(name), f"{where}.{name}"
            if by_name:
                caps = _record_object(given or {}, key).items()
                found[name] = {k: _record_whole(cap, f"{key}.{k}") for k, cap in caps}
            else:
                found[name] = None if given is None else _record_whole(given, key)
        return cls(**found)


_LIMIT_KINDS = {"int | None": False, "Mapping[str, int]": True}  # a field's type: by name?


@functools.cache
def _limit_names() -> tuple[tuple[str, bool], ...]:
    found = []
    for f in fields(LimitsSettings):
        if f.type not in _LIMIT_KINDS:
            raise TypeError(f"LimitsSettings.{f.name}: a limit is {' or '.join(_LIMIT_KINDS)}")
        found.append((f.name, _LIMIT_KINDS[str(f.type)]))
    return tuple(found)


def _record_object(value: object, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{name} {shown(value)} is not an object")
    return value


def _record_whole(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} {shown(value)} is not a whole number")
    return value


@record
class BudgetSettings:
    """The `budgets:` section: what may be spent in a (UTC) day, by the whole runs root and by
    each project; a start over either is refused, and a run that crosses one is stopped."""

    daily: Budget | None = None
    projects: Mapping[str, Budget] = field(default_factory=dict)


@record
class MetricsSettings:
    """The `metrics:` section: who may scrape `GET /metrics`."""

    public: bool = False  # true: without a key (the figures name projects, tasks and agents)


@record
class Config:
    """Everything config.yaml says; `source` is the file it came from (None: the defaults)."""

    agents: Mapping[str, AgentConfig]
    defaults: LoopSettings
    runs_dir: Path
    source: Path | None = None
    runs_dir_from: str = "the built-in default"  # where runs_dir came from, said when it matters
    server: ServerSettings = field(default_factory=ServerSettings)
    schedules: Mapping[str, ScheduleConfig] = field(default_factory=dict)
    notify: NotifyConfig | None = None
    issues: IssueSettings = field(default_factory=IssueSettings)
    ops: OpsSettings = field(default_factory=OpsSettings)
    executor: ExecutorSettings = field(default_factory=ExecutorSettings)
    paste: PasteSettings = field(default_factory=PasteSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)

    def agent(self, name: str | None, backend_names: Collection[str]) -> AgentConfig:
        """The agent `name` (else `defaults.agent`) means: a configured agent, else a bare
        backend of that name with its built-in settings."""
        if name is not None and not name.strip():
            raise UsageError(
                f"--agent {name!r} is empty; name an agent, or leave it out for the default"
            )
        name = name or self.defaults.agent
        if name is None:
            raise UsageError(
                "no agent: pass --agent NAME or set defaults.agent in config.yaml"
                + (f" (configured: {', '.join(self.agents)})" if self.agents else "")
            )
        if name in self.agents:
            return self.agents[name]
        if name in backend_names:
            return AgentConfig(name=name, type=name, ops=self.ops, paste=self.paste)
        import difflib  # only a mistake pays for it

        names = [*self.agents, *backend_names]
        close = difflib.get_close_matches(name, names, 1, 0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise UsageError(
            f"unknown agent {name!r}; {hint}configured agents and backends: {', '.join(names)}"
        )
