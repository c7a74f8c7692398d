"""A loop's overrides: typed once, applied to the config, and carried to a detached supervisor."""

from __future__ import annotations

from pathlib import Path

import pytest

from runagent.cli.loopargs import LoopArgs
from runagent.config.overrides import LoopOverrides
from runagent.config.settings import LoopSettings, Session, Until
from runagent.errors import RunAgentError
from runagent.executors import control
from runagent.store.runfolder import TaskPaths


def test_parsed_overrides_apply_over_the_config_and_zero_means_off() -> None:
    overrides = LoopOverrides.parse(
        {
            "agent": "fake",
            "max_restarts": "2",
            "restart_delay": "0",
            "timeout": "0",
            "idle_timeout": "5m",
            "until": "done-file",
            "quiet": True,
        }
    )
    base = LoopSettings(timeout=60.0, idle_timeout=10.0, restart_delay=3.0)
    applied = overrides.apply(base)
    assert applied.max_restarts == 2 and applied.restart_delay == 0.0
    assert applied.timeout is None and applied.idle_timeout == 300.0
    assert applied.until is Until.DONE_FILE and applied.kill_grace == base.kill_grace
    assert LoopOverrides().apply(base) == base  # nothing given changes nothing


def test_overrides_survive_the_trip_through_a_detached_command_line(tmp_path: Path) -> None:
    overrides = LoopOverrides(
        agent="fake", working_dir=tmp_path, max_restarts=1, restart_delay=0.5, timeout=0.0,
        idle_timeout=90.0, until=Until.DONE_FILE,
    )  # fmt: skip
    argv = control.loop_argv("run", TaskPaths(tmp_path, "p", "t"), overrides, None, "nightly")
    assert argv[:7] == ["run", "--project", "p", "--task", "t", "--root", str(tmp_path)]
    # runs there in the foreground, its words (event lines too) going to supervisor.log
    assert argv[-2:] == ["--executor", "local"] and "--schedule" in argv
    assert "--detach" not in argv and "--quiet" not in argv
    assert argv[-3] == "--admitted"  # the door that built it admitted it: never again there
    options = dict(zip(argv[9:-3:2], argv[10:-3:2], strict=True))
    back = LoopOverrides.parse(
        {
            "agent": options["--agent"],
            "working_dir": options["--cwd"],
            "max_restarts": options["--max-restarts"],
            "restart_delay": options["--restart-delay"],
            "timeout": options["--timeout"],
            "idle_timeout": options["--idle-timeout"],
            "until": options["--until"],
        }
    )
    assert back == overrides


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"timeout": "soon"}, "timeout"),
        ({"max_restarts": -1}, "max_restarts"),
        ({"max_restarts": "many"}, "max_restarts"),
        ({"max_restarts": True}, "max_restarts"),
        ({"until": "never"}, "until"),
        ({"agent": " "}, "agent"),
        ({"check": "pytest 'tests"}, "check"),
        ({"check": "  "}, "check"),
        ({"check": ["pytest"]}, "check"),
        ({"check": "a\0b"}, "check"),
        ({"check_timeout": "soon"}, "check_timeout"),
    ],
)
def test_a_bad_override_names_where_it_came_from(values: dict[str, object], named: str) -> None:
    with pytest.raises(RunAgentError, match=named):
        LoopOverrides.parse(values, where=lambda name: name)


def test_a_forms_empty_fields_change_nothing_but_an_empty_option_is_refused() -> None:
    assert LoopOverrides.parse({"timeout": "", "agent": ""}, blank_is_unset=True) == LoopOverrides()
    with pytest.raises(RunAgentError, match="--agent"):
        LoopOverrides.parse({"agent": ""})
    assert LoopArgs(LoopOverrides()).quiet is False


def test_a_check_is_parsed_once_applied_remembered_and_carried_to_a_detached_loop(
    tmp_path: Path,
) -> None:
    given = LoopOverrides.parse({"check": " pytest -q 'tests/a b' ", "check_timeout": "90s"})
    assert given == LoopOverrides(check="pytest -q 'tests/a b'", check_timeout=90.0)
    applied = given.apply(LoopSettings())
    assert (applied.check, applied.check_timeout) == ("pytest -q 'tests/a b'", 90.0)
    assert LoopOverrides(check_timeout=0.0).apply(applied).check_timeout is None  # 0: no bound
    assert LoopOverrides.parse(given.to_record()) == given  # task.yaml, read back by a resume
    argv = control.loop_argv("run", TaskPaths(tmp_path, "p", "t"), given, None)
    at = argv.index("--check")
    assert argv[at + 1] == "pytest -q 'tests/a b'" and argv[at + 2 : at + 4] == [
        "--check-timeout", "90"
    ]  # fmt: skip


def test_session_is_parsed_once_applied_remembered_and_carried_to_a_detached_loop(
    tmp_path: Path,
) -> None:
    assert LoopSettings().session is Session.CONTINUE  # the default
    given = LoopOverrides.parse({"session": "fresh"})
    assert given.apply(LoopSettings()).session is Session.FRESH
    assert LoopOverrides.parse(given.to_record()) == given  # task.yaml, read back by a resume
    argv = control.loop_argv("run", TaskPaths(tmp_path, "p", "t"), given, None)
    assert argv[argv.index("--session") + 1] == "fresh"
    with pytest.raises(RunAgentError, match=r"^session: 'sometimes' is not one of continue, fresh"):
        LoopOverrides.parse({"session": "sometimes"}, where=lambda name: name)


def test_an_agents_session_is_its_own_and_a_bad_one_is_named(tmp_path: Path) -> None:
    from runagent.config.file import load_config
    from runagent.errors import ConfigError

    path = tmp_path / "config.yaml"
    path.write_text("agents:\n  claude: {session: fresh}\n  other: {type: claude}\n"
                    "defaults: {session: continue}\n")  # fmt: skip
    config = load_config(path, ["claude"], tmp_path)
    assert config.defaults.session is Session.CONTINUE
    assert config.agents["claude"].loop_defaults(config.defaults).session is Session.FRESH
    assert config.agents["other"].loop_defaults(config.defaults).session is Session.CONTINUE
    path.write_text("agents:\n  claude: {session: sometimes}\n")
    with pytest.raises(ConfigError, match=r"agents.claude.session: .*sometimes.*continue, fresh"):
        load_config(path, ["claude"], tmp_path)


def test_fresh_travels_on_the_loops_command_line_and_is_never_remembered(tmp_path: Path) -> None:
    task = TaskPaths(tmp_path, "p", "t")
    given = LoopOverrides.parse({"fresh": True, "agent": "fake"})
    assert given.apply(LoopSettings()).session is Session.FRESH
    argv = control.loop_argv("resume", task, given, None)
    assert "--fresh" in argv and "--session" not in argv
    assert given.to_record() == {"agent": "fake"}  # task.yaml: never for the loops after it
    assert LoopOverrides.parse({"fresh": False}) == LoopOverrides()
    assert "--fresh" not in control.loop_argv("resume", task, LoopOverrides(), None)
    with pytest.raises(RunAgentError, match=r"^--fresh and --session continue contradict"):
        LoopOverrides.parse({"fresh": True, "session": "continue"})
