"""Finding and reading config.yaml into a Config; every error names the key path and the value."""

from __future__ import annotations

import dataclasses
import enum
import os
import pwd
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import fields
from datetime import datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_type_hints

from runagent.config import parsed
from runagent.config.section import Section, did_you_mean
from runagent.config.settings import (
    CRON_ALIASES,
    DEFAULT_MAX_TURNS,
    AgentConfig,
    AgentSandbox,
    Budget,
    BudgetSettings,
    Config,
    ExecutorSettings,
    ExecutorType,
    IssueSettings,
    LimitsSettings,
    LoopSettings,
    MergeMode,
    MetricsSettings,
    Mode,
    NotifyConfig,
    NotifyEvent,
    OpsSettings,
    Overlap,
    PasteSettings,
    Permissions,
    ScheduleConfig,
    ScheduleIssue,
    ScheduleKeep,
    ServerSettings,
    Session,
    Until,
    check_words,
)
from runagent.errors import ConfigError, UsageError, shown
from runagent.ops import Approvals
from runagent.store.credentials import scrub_urls
from runagent.store.race import RaceSpec
from runagent.store.runfolder import within

CONFIG_NAME = "config.yaml"


def config_loader(base: type[Any]) -> type[Any]:
    """`base` (a safe loader) reading YAML as config.yaml is written: only true and false are
    booleans (as in YAML 1.2), so a key such as `on:` (notify's events) stays the word it reads
    as, not True."""
    loader: type[Any] = type("ConfigLoader", (base,), {})
    loader.yaml_implicit_resolvers = {
        first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in base.yaml_implicit_resolvers.items()
    }
    loader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    return loader


def fast_loader() -> type[Any]:
    """The config loader on libyaml's parser where PyYAML has it (imported on first use)."""
    global _FAST
    if _FAST is None:
        import yaml

        _FAST = config_loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return _FAST


_FAST: type[Any] | None = None
# The keys of `defaults:` are LoopSettings' fields, so a new setting needs no second list.
LOOP_KEYS = tuple(f.name for f in fields(LoopSettings))


def user_home(env: Mapping[str, str]) -> Path:
    """$HOME, else the user's home in the password database: a cocode host drops HOME from its
    agent's environment, and the user's own config must still be found then."""
    return Path(env.get("HOME") or pwd.getpwuid(os.getuid()).pw_dir)


def user_config_file(env: Mapping[str, str]) -> Path:
    """The user's own config: $XDG_CONFIG_HOME/run-agent/config.yaml (~/.config/...)."""
    folder = env.get("XDG_CONFIG_HOME") or str(user_home(env) / ".config")
    return Path(folder) / "run-agent" / CONFIG_NAME


def find_config(explicit: Path | None, cwd: Path, env: Mapping[str, str]) -> Path | None:
    """`--config`, then $RUN_AGENT_CONFIG, then ./config.yaml, then the user's config folder."""
    if explicit is not None:
        if not explicit.is_file():
            raise ConfigError(
                f"config file {str(explicit)!r} {_not_a_file(explicit)}; check --config"
            )
        return explicit
    if env.get("RUN_AGENT_CONFIG"):
        path = Path(env["RUN_AGENT_CONFIG"])
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} (from RUN_AGENT_CONFIG) {_not_a_file(path)}; "
                "fix or unset it"
            )
        return path
    for candidate in (cwd / CONFIG_NAME, user_config_file(env)):
        if candidate.is_file():
            return candidate
    return None


def _not_a_file(path: Path) -> str:
    return "is a folder, not a file" if path.is_dir() else "does not exist"


def load_config(
    path: Path | None,
    backend_names: Collection[str],
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Read and check `path`. With no file, the built-in defaults, and runs kept in the user's
    data folder, so that where runs go does not depend on the folder a command is typed in."""
    if path is None:
        config = parse_config({}, base_dir=cwd, backend_names=backend_names)
        return dataclasses.replace(
            config,
            runs_dir=default_runs_dir(os.environ if env is None else env),
            runs_dir_from="the default, as no config.yaml was found",
        )
    env_now = os.environ if env is None else env
    try:
        text = path.read_text(encoding="utf-8")
        data = parsed.parsed(path, text, _parse_yaml, env_now)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
        ) from exc
    except _YAMLError as exc:
        said = _python_parser_error(text) or exc.__cause__ or exc
        where = getattr(said, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        problem = getattr(said, "problem", None)
        detail = f" ({problem})" if problem else ""
        raise ConfigError(f"{path}: not valid YAML{line}{detail}; fix the syntax") from said
    try:
        return parse_config(
            data or {}, base_dir=path.resolve().parent, backend_names=backend_names, source=path
        )
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from exc


class _YAMLError(ValueError):
    """config.yaml is not YAML; PyYAML's error is the cause."""


def _parse_yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=fast_loader())
    except yaml.YAMLError as exc:
        raise _YAMLError(str(exc)) from exc


def _python_parser_error(text: str) -> Exception | None:
    """PyYAML's own words for a syntax error, the same whether or not libyaml is there (whose
    words differ): a config with a mistake may take the slower parser."""
    import yaml

    try:
        yaml.load(text, Loader=config_loader(yaml.SafeLoader))
    except yaml.YAMLError as exc:
        return exc
    return None


def parse_config(
    data: Any, *, base_dir: Path, backend_names: Collection[str], source: Path | None = None
) -> Config:
    top = Section(data, "")
    top.only("agents", "defaults", "storage", "server", "schedules", "notify", "issues", "ops",
             "paste", "executor", "limits", "budgets", "metrics")  # fmt: skip
    ops = _ops(top.section("ops")) if top.has("ops") else OpsSettings()
    paste = _paste(top.section("paste"))
    agents = {
        name: _agent(name, section, backend_names, base_dir, ops, paste)
        for name, section in top.section("agents").items_as_sections()
    }
    defaults = _defaults(top.section("defaults"), agents, backend_names, base_dir)
    storage = top.section("storage")
    storage.only("runs_dir")
    given = storage.string("runs_dir")
    runs_dir = Path(given or "runs").expanduser()
    where = f"storage.runs_dir in {source}" if given else f"runs/ beside {source}"
    return Config(
        agents=MappingProxyType(agents),
        defaults=defaults,
        runs_dir=runs_dir if runs_dir.is_absolute() else base_dir / runs_dir,
        source=source,
        runs_dir_from=where,
        server=_server(top.section("server"), base_dir),
        schedules=MappingProxyType(
            {
                name: _schedule(name, section, agents, backend_names, base_dir)
                for name, section in top.section("schedules").items_as_sections()
            }
        ),
        notify=_notify(top.section("notify"), base_dir) if top.has("notify") else None,
        issues=_issues(top.section("issues")),
        ops=ops,
        executor=_executor(top.section("executor")),
        paste=paste,
        limits=_limits(top.section("limits")),
        budgets=_budgets(top.section("budgets")),
        metrics=_metrics(top.section("metrics")),
    )


def _metrics(s: Section) -> MetricsSettings:
    s.only("public")
    public = s.data.get("public", False)
    if not isinstance(public, bool):
        raise ConfigError(f"{s.key('public')}: {shown(public)} is not true or false")
    return MetricsSettings(public=public)


def _limits(s: Section) -> LimitsSettings:
    """Each limit LimitsSettings names: a cap, or caps by name (`projects: {web: 1}`)."""
    names = LimitsSettings.names()
    s.only(*(name for name, _ in names))

    def cap(section: Section, name: str) -> int | None:
        if section.data.get(name) is None:
            return None
        value = section.count(name, 0)
        if value == 0:
            raise ConfigError(
                f"{section.key(name)}: 0 would never start a task; give 1 or more, or leave it out"
            )
        return value

    def caps(name: str) -> dict[str, int]:
        section = s.section(name)
        return {key: value for key in map(str, section.data) if (value := cap(section, key))}

    found: dict[str, Any] = {name: MappingProxyType(caps(name)) if by_name else cap(s, name)
                             for name, by_name in names}  # fmt: skip
    return LimitsSettings(**found)


def _ops(s: Section) -> OpsSettings:
    import json

    from runagent.ops.policy import Policy  # only a config with an `ops:` section pays for it
    from runagent.ops.sandbox import Sandbox

    s.only("policy", "rules", "approvals", "sandbox")
    rules = s.data.get("rules") or {}
    if not isinstance(rules, dict):
        raise ConfigError(
            f"{s.key('rules')}: {shown(rules)} is not a mapping such as {{deny: [sudo]}}"
        )
    try:
        json.dumps(rules)  # handed to the agent process as JSON
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{s.key('rules')}: {shown(rules)} holds a value that is not plain"
        ) from exc
    policy = s.string("policy") or "standard"
    Policy.from_config({"policy": policy, "rules": rules})  # its errors name ops.policy/ops.rules
    return OpsSettings(
        policy=policy,
        rules=MappingProxyType(rules),
        approvals=s.choice("approvals", Approvals, Approvals.DENY),
        sandbox=s.choice("sandbox", Sandbox, Sandbox.AUTO).value,
    )


def _executor(s: Section) -> ExecutorSettings:
    s.only("type", "address", "namespace", "resources", "max_restarts", "shared_root")
    address = s.string("address") or "auto"
    if address != "auto" and not re.fullmatch(r"(ray://)?[A-Za-z0-9.:\[\]-]+:\d{1,5}", address):
        raise ConfigError(f"{s.key('address')}: {shown(address)} is not auto or HOST:PORT")
    namespace = s.string("namespace") or "run-agent"
    resources = s.data.get("resources", {"agent_slot": 1})
    if (
        not isinstance(resources, dict)
        or not resources
        or not all(
            isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
            for k, v in resources.items()
        )
    ):
        raise ConfigError(
            f"{s.key('resources')}: {shown(resources)} is not a mapping of resource names to "
            "amounts > 0, such as {agent_slot: 1}"
        )
    return ExecutorSettings(
        type=s.choice("type", ExecutorType, ExecutorType.LOCAL),
        address=address,
        namespace=namespace,
        resources=MappingProxyType({k: float(v) for k, v in resources.items()}),
        max_restarts=s.count("max_restarts", 3),
        shared_root=s.flag("shared_root", True),
    )


def _paste(s: Section) -> PasteSettings:
    s.only("wait", "clipboard")
    return PasteSettings(wait=s.duration("wait", None), clipboard=s.flag("clipboard", True))


def _issues(s: Section) -> IssueSettings:
    s.only("setup", "merge")
    return IssueSettings(setup=s.argv("setup"), merge=s.choice("merge", MergeMode, MergeMode.FF))


def _schedule(
    name: str,
    s: Section,
    agents: Mapping[str, AgentConfig],
    backend_names: Collection[str],
    base_dir: Path,
) -> ScheduleConfig:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    from cronsim import CronSim, CronSimError

    s.only("cron", "timezone", "project", "task", "agent", "prompt", "prompt_file", "overlap",
           "max_restarts", "timeout", "until", "enabled", "catch_up", "notify",
           "keep", "after", "priority", "stuck_after", "budget", "worktree", "base",
           "cwd", "issue", "check", "check_timeout", "race", "agents", "session")  # fmt: skip
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", name):
        raise ConfigError(f"{s.path}: schedule name {name!r} must be 1-64 letters, digits, . _ -")
    cron = s.string("cron")
    if not cron:
        raise ConfigError(f"{s.key('cron')}: missing; give five fields, e.g. '0 2 * * *'")
    expression = CRON_ALIASES.get(cron.strip(), cron.strip())
    timezone = s.string("timezone") or "UTC"
    try:
        zone = ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(
            f"{s.key('timezone')}: {timezone!r} is not a time zone; use a name like Europe/Berlin"
        ) from exc
    try:
        next(iter(CronSim(expression, datetime.now(zone))))
    except (CronSimError, StopIteration) as exc:
        raise ConfigError(f"{s.key('cron')}: {cron!r} is not a cron expression: {exc}") from exc
    project = s.string("project")
    if not project:
        raise ConfigError(f"{s.key('project')}: missing; say which project the runs belong to")
    prompt, prompt_file = s.string("prompt"), s.string("prompt_file")
    if bool(prompt) == bool(prompt_file):
        raise ConfigError(f"{s.path}: give exactly one of prompt and prompt_file")
    agent = s.string("agent")
    if agent is not None and agent not in agents and agent not in backend_names:
        raise ConfigError(f"{s.key('agent')}: unknown agent {agent!r}")
    overlap = s.choice("overlap", Overlap, Overlap.SKIP)
    race = _race(s, agents, backend_names)
    path = Path(prompt_file).expanduser() if prompt_file else None
    return ScheduleConfig(
        name=name,
        cron=expression,
        timezone=timezone,
        project=project,
        task=s.string("task") or "{name}-{datetime}",
        prompt=prompt,
        prompt_file=(path if path.is_absolute() else base_dir / path) if path else None,
        agent=agent,
        overlap=overlap,
        max_restarts=s.count("max_restarts", -1) if s.has("max_restarts") else None,
        timeout=s.duration("timeout", None),
        until=s.choice("until", Until, Until.EXIT) if s.has("until") else None,
        enabled=s.flag("enabled", True),
        catch_up=s.flag("catch_up", False),
        notify=_notify(s.section("notify"), base_dir) if s.has("notify") else None,
        keep=_keep(s.section("keep")) if s.has("keep") else None,
        after=s.argv("after"),
        priority=_priority(s),
        stuck_after=s.count("stuck_after", 0) if s.has("stuck_after") else None,
        budget=_budget(s, "budget") if s.has("budget") else None,
        worktree=s.flag("worktree", False) if s.has("worktree") else None,
        base=s.string("base"),
        cwd=_folder(s, "cwd", base_dir),
        issue=_schedule_issue(s.section("issue"), base_dir) if s.has("issue") else None,
        check=_command(s, "check", base_dir),
        check_timeout=_off_or_duration(s, "check_timeout"),
        race=race,
        session=s.choice("session", Session, Session.CONTINUE) if s.has("session") else None,
    )


def _race(
    s: Section, agents: Mapping[str, AgentConfig], backend_names: Collection[str]
) -> RaceSpec | None:
    """A schedule's race: `race: N` loops of its agent, or one loop of each of `agents:`."""
    try:
        race = RaceSpec.parse(s.get("race", None), s.get("agents", None),
                              (s.key("race"), s.key("agents")))  # fmt: skip
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    for name in race.agents if race is not None else ():
        if name not in agents and name not in backend_names:
            raise ConfigError(f"{s.key('agents')}: unknown agent {name!r}")
    if race is not None and s.has("issue"):
        raise ConfigError(f"{s.path}: a race does not go with issue: race a worktree task instead")
    return race


def _schedule_issue(s: Section, base_dir: Path) -> ScheduleIssue:
    s.only("number", "repo", "url")
    number = s.get("number", None)
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ConfigError(f"{s.key('number')}: {shown(number)} is not an issue number (1 or more)")
    repo = _folder(s, "repo", base_dir)
    if repo is None:
        raise ConfigError(f"{s.key('repo')}: missing; name the issue's repository folder")
    return ScheduleIssue(number, repo, s.string("url") or "")


def _folder(s: Section, name: str, base_dir: Path) -> Path | None:
    """A folder named in the config, relative to the config file's folder."""
    given = s.string(name)
    if not given:
        return None
    path = Path(given).expanduser()
    return path if path.is_absolute() else base_dir / path


def _priority(s: Section) -> int:
    value = s.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{s.key('priority')}: {shown(value)} is not a whole number")
    return value


def _keep(s: Section) -> ScheduleKeep:
    s.only("last", "older_than", "failed")
    keep = ScheduleKeep(
        last=s.count("last", 0),
        older_than=s.duration("older_than", None),
        failed=s.flag("failed", False),
    )
    if not keep.last and keep.older_than is None:
        raise ConfigError(
            f"{s.path}: say what to keep: last: N (the newest firings) and/or older_than: 30d"
        )
    return keep


def _notify(s: Section, base_dir: Path) -> NotifyConfig:
    s.only("command", "webhook", "secret_env", "on")
    webhook = s.string("webhook")
    if webhook is not None and not re.match(r"https?://", webhook):
        raise ConfigError(f"{s.key('webhook')}: {scrub_urls(webhook)!r} is not an http(s) URL")
    return NotifyConfig(
        command=in_config_dir(s.argv("command"), base_dir),
        webhook=webhook,
        secret_env=s.string("secret_env"),
        events=frozenset(s.choices("on", NotifyEvent) or NotifyEvent),
    )


HOST_NAME = re.compile(r"\*|\[?[A-Za-z0-9][A-Za-z0-9.:-]{0,252}\]?")


def _server(s: Section, base_dir: Path) -> ServerSettings:
    base = ServerSettings()
    s.only("host", "port", "api_key_env", "allowed_hosts", "ops_workspaces")
    given = s.data.get("ops_workspaces") or []
    if not isinstance(given, list) or not all(isinstance(f, str) and f for f in given):
        raise ConfigError(
            f"{s.key('ops_workspaces')}: {shown(given)} is not a list of folders; write e.g. "
            "['~/projects/demo']"
        )
    folders = [Path(f).expanduser() for f in given]
    port = s.count("port", base.port)
    if not 0 < port < 65536:
        raise ConfigError(f"{s.key('port')}: {port} is not a TCP port (1-65535)")
    hosts = s.data.get("allowed_hosts") or []
    if isinstance(hosts, str):
        hosts = [hosts]
    for host in hosts if isinstance(hosts, list) else [hosts]:
        if not isinstance(host, str) or not HOST_NAME.fullmatch(host):
            raise ConfigError(
                f"{s.key('allowed_hosts')}: {shown(host)} is not a host name; write names such as "
                "'runs.example.org' or '192.0.2.7', without a scheme or port"
            )
    return ServerSettings(
        host=s.string("host") or base.host,
        port=port,
        api_key_env=s.string("api_key_env") or base.api_key_env,
        allowed_hosts=tuple(hosts),
        ops_workspaces=tuple(f if f.is_absolute() else base_dir / f for f in folders),
    )


def _agent(
    name: str, s: Section, backend_names: Collection[str], base_dir: Path, ops: OpsSettings,
    paste: PasteSettings,
) -> AgentConfig:  # fmt: skip
    s.only("type", "command", "args", "env", "model", "base_url", "token", "token_file",
           "token_env", "permissions", "pass_env", "mode", "max_turns", "stuck_after",
           "budget", "worktree", "sandbox", "network", "check", "check_timeout",
           "session")  # fmt: skip
    kind = s.string("type") or name
    if kind not in backend_names:
        key = "type" if s.has("type") else ""
        hint = did_you_mean(kind, backend_names) or f"one of: {', '.join(sorted(backend_names))}"
        raise ConfigError(
            f"{s.key(key) if key else s.path}: unknown backend {kind!r}; {hint}"
            + ("" if key else " (set `type:` to say which backend runs this agent)")
        )
    token_file = s.string("token_file")
    return AgentConfig(
        name=name,
        type=kind,
        command=in_config_dir(s.argv("command"), base_dir),
        args=in_config_dir(s.argv("args"), base_dir),
        env=MappingProxyType(s.string_map("env")),
        model=s.string("model"),
        base_url=s.string("base_url"),
        token=s.string("token"),
        token_file=Path(token_file).expanduser() if token_file else None,
        token_env=s.string("token_env"),
        permissions=s.choice("permissions", Permissions, Permissions.BYPASS),
        pass_env=s.argv("pass_env"),
        mode=s.choice("mode", Mode, Mode.ANSWER),
        max_turns=_max_turns(s),
        ops=ops,
        paste=paste,
        stuck_after=s.count("stuck_after", 0) if s.has("stuck_after") else None,
        budget=_budget(s, "budget") if s.has("budget") else None,
        worktree=s.flag("worktree", False) if s.has("worktree") else None,
        sandbox=s.choice("sandbox", AgentSandbox, AgentSandbox.NONE) if s.has("sandbox") else None,
        network=s.flag("network", True) if s.has("network") else None,
        check=_command(s, "check", base_dir),
        check_timeout=_off_or_duration(s, "check_timeout"),
        session=s.choice("session", Session, Session.CONTINUE) if s.has("session") else None,
    )


CONFIG_DIR = "{config_dir}"


def in_config_dir(words: tuple[str, ...], base_dir: Path) -> tuple[str, ...]:
    """Command words (an agent's `command:` and `args:`, for every backend, and `notify.command`)
    with `{config_dir}` made the config file's folder, in every word, the executable too."""
    return tuple(word.replace(CONFIG_DIR, str(base_dir)) for word in words)


def _command(s: Section, name: str, base_dir: Path) -> str | None:
    """A command line (`check:`): a string split as a shell splits words, or a list of words
    (kept as the command line that splits back into them); None when not given. `{config_dir}`
    in a word is the config file's folder (the line is then written again from its words)."""
    import shlex

    value = s.data.get(name)
    if value is None:
        return None
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = shlex.join(value)
    if not isinstance(value, str):
        raise ConfigError(
            f"{s.key(name)}: {shown(value)} is not a command line such as 'pytest -q'"
        )
    try:
        words = check_words(value, s.key(name))
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    if CONFIG_DIR in value:
        value = shlex.join(in_config_dir(words, base_dir))
    return value.strip()


def _off_or_duration(s: Section, name: str) -> float | None:
    """A duration a setting of its own may turn off (0.0) where None means "as the defaults"."""
    return (s.duration(name, None) or 0.0) if s.has(name) else None


def _budget(s: Section, name: str) -> Budget | None:
    """A budget as config.yaml writes it: {usd: 0.5, tokens: 200000} (either or both)."""
    section = s.section(name)
    section.only("usd", "tokens")
    usd, tokens = section.data.get("usd"), section.data.get("tokens")
    if usd is not None and (isinstance(usd, bool) or not isinstance(usd, int | float) or usd <= 0):
        raise ConfigError(f"{section.key('usd')}: {shown(usd)} is not a cost in USD above 0")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens <= 0):  # fmt: skip
        raise ConfigError(
            f"{section.key('tokens')}: {shown(tokens)} is not a number of tokens above 0"
        )
    if usd is None and tokens is None:
        return None
    return Budget(float(usd) if usd is not None else None, tokens)


def _budgets(s: Section) -> BudgetSettings:
    s.only("daily", "projects")
    projects = {
        name: budget
        for name, section in s.section("projects").items_as_sections()
        if (budget := _budget(s.section("projects"), name)) is not None
    }
    return BudgetSettings(
        daily=_budget(s, "daily") if s.has("daily") else None,
        projects=MappingProxyType(projects),
    )


def _max_turns(s: Section) -> int:
    turns = s.count("max_turns", DEFAULT_MAX_TURNS)
    if turns < 1:
        raise ConfigError(f"{s.key('max_turns')}: {turns} is not a whole number >= 1")
    return turns


def _defaults(
    s: Section, agents: Mapping[str, AgentConfig], backend_names: Collection[str], base_dir: Path
) -> LoopSettings:
    base = LoopSettings()
    s.only(*LOOP_KEYS)
    agent = s.string("agent")
    if agent is not None and agent not in agents and agent not in backend_names:
        choices = [*agents, *backend_names]
        hint = did_you_mean(agent, choices) or "name an agent under `agents:` or a backend"
        raise ConfigError(f"{s.key('agent')}: unknown agent {agent!r}; {hint}")
    values: dict[str, Any] = {"agent": agent, "non_retryable_exit_codes": _exit_codes(s, base)}
    for name, kind in get_type_hints(LoopSettings).items():
        if name not in values:
            values[name] = _loop_setting(s, name, kind, getattr(base, name), base_dir)
    return LoopSettings(**values)


def _loop_setting(s: Section, name: str, kind: Any, default: Any, base_dir: Path) -> Any:
    """One key of `defaults:`, read by its LoopSettings field's type."""
    if kind is int:
        return s.count(name, default)
    if kind is float:  # a wait that cannot be "none": 0 (or off) is no wait at all
        return s.duration(name, default) or 0.0
    if kind == float | None:
        return s.duration(name, default)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return s.choice(name, kind, default)
    if kind == Budget | None:
        return _budget(s, name) if s.has(name) else default
    if kind == str | None:  # a command line (`check:`): the one text setting besides the agent
        return _command(s, name, base_dir)
    if kind is bool:
        return s.flag(name, default)
    raise TypeError(f"LoopSettings.{name}: no reader for a {kind}; add one to config/file.py")


def _exit_codes(s: Section, base: LoopSettings) -> frozenset[int]:
    codes = s.get("non_retryable_exit_codes", None)
    if codes is None:
        return base.non_retryable_exit_codes
    if isinstance(codes, list) and all(_is_exit_code(c) for c in codes):
        return frozenset(codes)
    raise ConfigError(
        f"{s.key('non_retryable_exit_codes')}: {shown(codes)} is not a list of exit codes "
        "(whole numbers 1-255, e.g. [2, 3, 126, 127])"
    )


def _is_exit_code(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 255


def default_runs_dir(env: Mapping[str, str]) -> Path:
    """Where runs go with no config file: $XDG_DATA_HOME/run-agent/runs (~/.local/share/...)."""
    data = env.get("XDG_DATA_HOME") or str(user_home(env) / ".local/share")
    return Path(data) / "run-agent" / "runs"


def runs_root(cli_root: Path | None, env: Mapping[str, str], config: Config) -> tuple[Path, str]:
    """--root, then $RUN_AGENT_ROOT, then the config's runs_dir; always absolute, with where it
    came from in words (said whenever it matters: nothing found there, a task not found)."""
    if cli_root is not None:
        return cli_root.expanduser().resolve(), "--root"
    if env.get("RUN_AGENT_ROOT"):
        return Path(env["RUN_AGENT_ROOT"]).expanduser().resolve(), "$RUN_AGENT_ROOT"
    return Path(os.path.abspath(config.runs_dir)), config.runs_dir_from


def refuse_config_inside(
    path: Path | None, folders: Sequence[Path], env: Mapping[str, str]
) -> None:
    """A task that works on a repository (an issue run, a cocode agent) never takes its config
    from inside it (any of its working trees, `folders`): the repository's content would choose
    the commands run on this machine, as whoever can push to it pleases."""
    inside = _holder(path, folders) if path is not None else None
    if inside is not None:
        raise ConfigError(
            f"config file {str(path)!r} is inside the repository {inside} this task works on, "
            "and a repository does not choose what runs here; give --config a file outside "
            f"it, or keep your config in {user_config_file(env)}"
        )


def refuse_root_inside(root: Path, root_from: str, folders: Sequence[Path]) -> None:
    """Nor its runs root: the run folders would be committed with the work, and the agent
    could rewrite its own records."""
    inside = _holder(root, folders)
    if inside is not None:
        raise ConfigError(
            f"runs root {str(root)!r} (from {root_from}) is inside the repository {inside} "
            "this task works on, where its run folders would be committed with the work; give "
            "--root (or storage.runs_dir) a folder outside it"
        )


def _holder(path: Path, folders: Sequence[Path]) -> Path | None:
    """The folder `path` lies in: as written (a link in the repository is the repository's
    choice, wherever it leads), or with its links resolved (a link into the repository)."""
    written = Path(os.path.abspath(path))
    return next(
        (f for f in folders if written.is_relative_to(f.resolve()) or within(f, path)), None
    )
