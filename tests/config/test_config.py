"""config.yaml: typed settings, and errors that name the key path and the bad value."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import pytest

from runagent.config.file import (
    default_runs_dir,
    find_config,
    load_config,
    parse_config,
    refuse_config_inside,
    refuse_root_inside,
    user_config_file,
)
from runagent.config.settings import AgentConfig, Config, NotifyEvent, Overlap, Permissions, Until
from runagent.duration import parse_duration
from runagent.errors import ConfigError, UsageError

BACKENDS = ["command", "claude"]


def parse(text: str, tmp_path: Path) -> object:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return load_config(path, BACKENDS, tmp_path)


def error(text: str, tmp_path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        parse(text, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_without_a_file(tmp_path: Path) -> None:
    config = load_config(None, BACKENDS, tmp_path, {"HOME": str(tmp_path / "home")})
    assert config.runs_dir == tmp_path / "home/.local/share/run-agent/runs"  # not the cwd's
    data = load_config(None, BACKENDS, tmp_path, {"XDG_DATA_HOME": str(tmp_path / "data")})
    assert data.runs_dir == tmp_path / "data/run-agent/runs"
    d = config.defaults
    assert d.max_restarts == 5 and d.non_retryable_exit_codes == {2, 3, 126, 127}
    assert d.until is Until.EXIT and d.agent is None


def test_a_full_config_is_typed(tmp_path: Path) -> None:
    config = parse(
        """
agents:
  mine:
    type: command
    command: [python3, agent.py, "{prompt_file}"]
    args: [--fast]
    env: {LEVEL: 3, DEBUG: true}
    model: m1
  claude: {model: opus}
defaults:
  agent: mine
  max_restarts: 2
  restart_delay: 500ms
  restart_delay_max: 1m
  timeout: 1h30m
  idle_timeout: off
  kill_grace: 3
  non_retryable_exit_codes: [2, 9]
  until: done-file
storage:
  runs_dir: ../elsewhere
""",
        tmp_path,
    )
    agent = config.agents["mine"]  # type: ignore[attr-defined]
    assert agent.type == "command" and agent.command == ("python3", "agent.py", "{prompt_file}")
    assert agent.args == ("--fast",) and dict(agent.env) == {"LEVEL": "3", "DEBUG": "true"}
    assert config.agents["claude"].type == "claude"  # type: ignore[attr-defined]
    d = config.defaults  # type: ignore[attr-defined]
    assert (d.max_restarts, d.restart_delay, d.restart_delay_max) == (2, 0.5, 60)
    assert (d.timeout, d.idle_timeout, d.kill_grace) == (5400, None, 3)
    assert d.non_retryable_exit_codes == {2, 9} and d.until is Until.DONE_FILE
    assert config.runs_dir == tmp_path / "../elsewhere"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "defaults:\n  max_restart: 3\n",
            "defaults.max_restart: unknown key; did you mean 'max_restarts'?",
        ),
        ("defauts: {}\n", "defauts: unknown key; did you mean 'defaults'?"),
        (
            "defaults:\n  max_restarts: five\n",
            "defaults.max_restarts: 'five' is not a whole number",
        ),
        ("defaults:\n  max_restarts: -1\n", "defaults.max_restarts: -1 is not a whole number"),
        ("defaults:\n  timeout: soon\n", "defaults.timeout: 'soon' is not a duration"),
        (
            "defaults:\n  until: forever\n",
            "defaults.until: 'forever' is not one of: exit, done-file, ready-marker",
        ),
        (
            "defaults:\n  non_retryable_exit_codes: [x]\n",
            "defaults.non_retryable_exit_codes: [x]",
        ),
        ("defaults:\n  agent: mystery\n", "defaults.agent: unknown agent 'mystery'"),
        (
            "agents:\n  a:\n    type: comand\n",
            "agents.a.type: unknown backend 'comand'; did you mean 'command'?",
        ),
        ("agents:\n  a:\n    command: [x]\n", "agents.a: unknown backend 'a'"),
        (
            "agents:\n  a:\n    type: command\n    command: python3 x.py\n",
            "agents.a.command: 'python3 x.py' is a string",
        ),
        (
            "agents:\n  a:\n    type: command\n    env: [A]\n",
            "agents.a.env: [A] is not a mapping",
        ),
        ("agents: [a, b]\n", "agents: expected a mapping"),
        ("defaults:\n  kill_grace: [1]\n", "defaults.kill_grace: [1] is not a duration"),
        ("defaults:\n  restart_delay: .inf\n", "defaults.restart_delay: .inf is not a duration"),
        ("defaults:\n  idle_timeout: .nan\n", "defaults.idle_timeout: .nan is not a duration"),
        ("defaults:\n  timeout: 1e400\n", "defaults.timeout: '1e400' is not a duration"),
        ("defaults:\n  timeout: -5m\n", "defaults.timeout: '-5m' is not a duration"),
        ("defaults:\n  rate_limit_wait: 400d\n", "'400d' is longer than 365 days"),
        ("defaults:\n  restart_delay: 1e12\n", "'1e12' is longer than 365 days"),
        ('defaults:\n  check: "pytest \'x"\n', 'defaults.check "pytest \'x" cannot be split'),
        ("defaults:\n  check: ' '\n", "defaults.check is empty; give a command"),
        ("defaults:\n  check: {a: 1}\n", "defaults.check: {a: 1} is not a command line"),
        ("agents:\n  a:\n    type: command\n    check: [1]\n", "agents.a.check: [1] is not"),
        ("defaults:\n  check_timeout: soon\n", "defaults.check_timeout: 'soon' is not a dur"),
        # Values are named as config.yaml writes them, never in Python's spelling.
        ("defaults:\n  until: true\n", "defaults.until: true is not a string"),
        ("budgets:\n  daily: {usd: true}\n", "budgets.daily.usd: true is not a cost"),
        ("agents:\n  a:\n    type: command\n    command: [sh, null]\n",
         "agents.a.command: [sh, null] is not a list of strings"),
        ('agents:\n  a:\n    type: command\n    command: sh -c "echo hi"\n',
         "agents.a.command: 'sh -c \"echo hi\"' is a string; write the command as a list, e.g. "
         '[sh, -c, "echo hi"]'),
        ("agents:\n  a:\n    type: command\n    command: 'python3 {config_dir}/x.py --fail 1'\n",
         'e.g. [python3, "{config_dir}/x.py", --fail, "1"]'),
    ],
)  # fmt: skip
def test_errors_name_the_key_path_and_value(tmp_path: Path, text: str, expected: str) -> None:
    message = error(text, tmp_path)
    assert expected in message
    assert message.startswith(str(tmp_path / "config.yaml"))


def test_yaml_syntax_errors_say_the_line(tmp_path: Path) -> None:
    message = error("defaults:\n  a: b: c\n", tmp_path)
    assert "not valid YAML at line 2 (mapping values are not allowed here)" in message


@pytest.mark.parametrize(
    "value, seconds",
    [(90, 90.0), (2.5, 2.5), ("500ms", 0.5), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
     ("2d", 172800.0), ("10", 10.0), (0, None), ("off", None), (None, None)],
)  # fmt: skip
def test_durations(value: object, seconds: float | None) -> None:
    assert parse_duration(value, "x") == seconds


def test_a_config_that_is_not_utf8_is_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes("agents: {caf\xe9: {}}\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_config(path, BACKENDS, tmp_path)
    assert str(caught.value) == (
        f"{path}: not UTF-8 text (invalid continuation byte at byte 12); save it as UTF-8"
    )


def test_config_search_order(tmp_path: Path) -> None:
    home = tmp_path / "xdg" / "run-agent"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("{}")
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert find_config(None, cwd, env) == home / "config.yaml"
    (cwd / "config.yaml").write_text("{}")
    assert find_config(None, cwd, env) == cwd / "config.yaml"
    explicit = tmp_path / "other.yaml"
    explicit.write_text("{}")
    assert find_config(explicit, cwd, env) == explicit
    with pytest.raises(ConfigError, match="does not exist"):
        find_config(tmp_path / "missing.yaml", cwd, env)
    with pytest.raises(ConfigError, match=r"RUN_AGENT_CONFIG\) is a folder, not a file"):
        find_config(None, cwd, {**env, "RUN_AGENT_CONFIG": str(cwd)})


def test_the_users_config_is_found_by_the_home_given_else_the_password_database(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    (home / ".config" / "run-agent").mkdir(parents=True)
    (home / ".config" / "run-agent" / "config.yaml").write_text("{}")
    found = find_config(None, tmp_path, {"HOME": str(home)})
    assert found == home / ".config" / "run-agent" / "config.yaml"
    # A cocode host drops HOME: the password database still names the user's home.
    real = Path(pwd.getpwuid(os.getuid()).pw_dir)
    assert user_config_file({}) == real / ".config" / "run-agent" / "config.yaml"
    assert default_runs_dir({}) == real / ".local" / "share" / "run-agent" / "runs"


def test_a_config_or_runs_root_inside_the_repository_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    repo, elsewhere = tmp_path / "repo", tmp_path / "mine"
    (repo / "sub").mkdir(parents=True)
    elsewhere.mkdir()
    (repo / "sub" / "config.yaml").write_text("{}")
    link = elsewhere / "linked.yaml"  # a link out of the user's folder into the repository
    link.symlink_to(repo / "sub" / "config.yaml")
    (elsewhere / "config.yaml").write_text("{}")
    out = repo / "out.yaml"  # a link the repository holds, to a config outside it
    out.symlink_to(elsewhere / "config.yaml")
    for path in (repo / "sub" / "config.yaml", link, out):
        with pytest.raises(ConfigError, match=f"config file '{path}' is inside the repository"):
            refuse_config_inside(path, [repo], {"HOME": str(tmp_path)})
    refuse_config_inside(elsewhere / "config.yaml", [repo], {})
    refuse_config_inside(None, [repo], {})
    with pytest.raises(ConfigError, match=rf"runs root '{repo}/runs' \(from --root\) is inside"):
        refuse_root_inside(repo / "runs", "--root", [elsewhere, repo])
    refuse_root_inside(tmp_path / "runs", "--root", [repo])


def test_parse_config_accepts_an_empty_document(tmp_path: Path) -> None:
    assert parse_config({}, base_dir=tmp_path, backend_names=BACKENDS).agents == {}


def test_an_agent_name_is_a_configured_agent_else_a_bare_backend(tmp_path: Path) -> None:
    config = parse("agents:\n  mine: {type: command, command: [x]}\n", tmp_path)
    assert isinstance(config, Config)
    assert config.agent("mine", BACKENDS).command == ("x",)
    assert config.agent("claude", BACKENDS) == AgentConfig(name="claude", type="claude")
    with pytest.raises(UsageError, match=r"no agent: pass --agent NAME .* \(configured: mine\)"):
        config.agent(None, BACKENDS)
    with pytest.raises(UsageError, match="--agent ' ' is empty"):
        config.agent(" ", BACKENDS)
    with pytest.raises(UsageError) as unknown:
        config.agent("nope", BACKENDS)
    assert str(unknown.value) == (
        "unknown agent 'nope'; configured agents and backends: mine, command, claude"
    )


@pytest.mark.parametrize(
    "text, expected",
    [
        ("agents:\n  c: {type: claude, permissions: ask}\n", "agents.c.permissions: 'ask' is not "
         "one of: bypass, none"),
        ("notify:\n  'on': [completed, done]\n", "notify.on: 'done' is not one of: completed, "
         "failed, gave_up, needs_input"),
        ("schedules:\n  s: {cron: '@daily', project: p, prompt: x, overlap: wait}\n",
         "schedules.s.overlap: 'wait' is not one of: skip, queue, allow"),
    ],
)  # fmt: skip
def test_every_enum_key_names_its_choices(tmp_path: Path, text: str, expected: str) -> None:
    assert error(text, tmp_path).endswith(expected)


def test_enum_keys_are_read_as_members(tmp_path: Path) -> None:
    config = parse(
        "agents:\n  c: {type: claude, permissions: none}\n"
        "notify:\n  'on': [gave_up]\n"
        "defaults:\n  until: ready-marker\n"
        "schedules:\n  s: {cron: '@daily', project: p, prompt: x, overlap: queue}\n"
        "  r: {cron: '@daily', project: p, prompt: x, until: ready-marker}\n",
        tmp_path,
    )
    assert isinstance(config, Config) and config.notify is not None
    assert config.defaults.until is Until.READY_MARKER
    assert config.schedules["s"].until is None  # as defaults.until says
    assert config.schedules["r"].until is Until.READY_MARKER
    assert config.agents["c"].permissions is Permissions.NONE
    assert config.notify.events == {NotifyEvent.GAVE_UP}
    assert config.schedules["s"].overlap is Overlap.QUEUE


def test_the_loop_settings_the_full_config_leaves_out_are_read_too(tmp_path: Path) -> None:
    text = (
        "defaults:\n  crash_loop_runs: 7\n  crash_loop_seconds: 9s\n  rate_limit_wait: 1m\n"
        "  rate_limit_max_wait: 2h\n  max_rate_limit_waits: 4\n  kill_grace: 0\n"
    )
    d = parse(text, tmp_path).defaults  # type: ignore[attr-defined]
    assert (d.crash_loop_runs, d.crash_loop_seconds, d.rate_limit_wait) == (7, 9.0, 60.0)
    assert (d.rate_limit_max_wait, d.max_rate_limit_waits, d.kill_grace) == (7200.0, 4, 0.0)


def test_a_check_is_set_under_defaults_per_agent_and_per_schedule(tmp_path: Path) -> None:
    text = (
        "agents:\n  a:\n    type: command\n    command: [x]\n    check: [make, test]\n"
        "    check_timeout: 0\n  b:\n    type: command\n    command: [x]\n"
        "defaults:\n  agent: a\n  check: pytest -q 'tests/a b'\n  check_timeout: 90s\n"
        "schedules:\n  nightly:\n    cron: '@daily'\n    project: p\n    prompt: go\n"
        "    check: ruff check .\n    check_timeout: 2m\n"
    )
    config = parse(text, tmp_path)
    d = config.defaults  # type: ignore[attr-defined]
    assert (d.check, d.check_timeout) == ("pytest -q 'tests/a b'", 90.0)
    a = config.agents["a"].loop_defaults(d)  # type: ignore[attr-defined]
    assert (a.check, a.check_timeout) == ("make test", None)  # 0: as long as it takes
    b = config.agents["b"].loop_defaults(d)  # type: ignore[attr-defined]
    assert (b.check, b.check_timeout) == (d.check, 90.0)
    nightly = config.schedules["nightly"]  # type: ignore[attr-defined]
    assert (nightly.check, nightly.check_timeout) == ("ruff check .", 120.0)
    assert parse("{}", tmp_path).defaults.check_timeout == 600.0  # type: ignore[attr-defined]


def test_ops_workspaces_are_folders_relative_to_the_config(tmp_path: Path) -> None:
    config = parse("server:\n  ops_workspaces: [work, /srv/abs]\n", tmp_path)
    assert isinstance(config, Config)
    assert config.server.ops_workspaces == (tmp_path / "work", Path("/srv/abs"))
    assert "server.ops_workspaces" in error("server:\n  ops_workspaces: work\n", tmp_path)


CHAT_BACKENDS = [*BACKENDS, "xai", "perplexity", "chat_completions"]


def test_agent_mode_and_the_ops_section_are_typed(tmp_path: Path) -> None:
    from runagent.config.settings import Mode
    from runagent.ops import Approvals

    path = tmp_path / "config.yaml"
    path.write_text(
        "agents:\n"
        "  grok: {type: xai, mode: agent, max_turns: 7}\n"
        "  plain: {type: perplexity}\n"
        "ops:\n"
        "  policy: restrictive\n"
        "  rules: {deny: [terraform destroy], read_only: false}\n"
        "  approvals: wait\n"
    )
    config = load_config(path, CHAT_BACKENDS, tmp_path)
    grok, plain = config.agents["grok"], config.agents["plain"]
    assert grok.mode is Mode.AGENT and grok.max_turns == 7
    assert plain.mode is Mode.ANSWER and plain.max_turns == 20
    assert grok.ops.policy == "restrictive" and grok.ops.approvals is Approvals.WAIT
    assert dict(grok.ops.rules) == {"deny": ["terraform destroy"], "read_only": False}
    assert config.agent("xai", CHAT_BACKENDS).ops == config.ops  # a bare backend gets it too
    default = load_config(None, CHAT_BACKENDS, tmp_path, {"HOME": str(tmp_path)})
    assert default.ops.policy == "standard" and default.ops.approvals is Approvals.DENY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "agents: {x: {type: xai, mode: agnt}}",
            "agents.x.mode: 'agnt' is not one of: answer, agent",
        ),
        (
            "agents: {x: {type: xai, max_turns: 0}}",
            "agents.x.max_turns: 0 is not a whole number >= 1",
        ),
        ("agents: {x: {type: xai, max_turns: many}}", "agents.x.max_turns: 'many' is not a whole"),
        ("ops: {policy: lax}", "ops.policy 'lax' is not a preset"),
        ("ops: {approvals: ask}", "ops.approvals: 'ask' is not one of: wait, deny"),
        ("ops: {rules: {dney: [x]}}", "ops.rules.dney is not a policy rule"),
        ("ops: {rules: [sudo]}", "ops.rules: [sudo] is not a mapping"),
        ("ops: {polcy: standard}", "ops.polcy: unknown key; did you mean 'policy'?"),
    ],
)
def test_agent_mode_errors_name_the_key_path_and_value(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, CHAT_BACKENDS, tmp_path)
    assert expected in str(info.value)


def test_agent_mode_is_refused_for_a_backend_that_acts_on_its_own() -> None:
    import backends
    from runagent.config.settings import Mode

    with pytest.raises(ConfigError, match=r"agents.c.mode: 'agent' is for the chat-completions"):
        backends.create(AgentConfig(name="c", type="claude", mode=Mode.AGENT))
    with pytest.raises(ConfigError, match=r"agents.g.base_url: missing"):
        backends.create(AgentConfig(name="g", type="chat_completions", model="m"))
