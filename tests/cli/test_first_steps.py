"""What a new user meets in the first steps (issue 37, 8 to 13): `{config_dir}` wherever a
command is given, the prompt guard, `doctor` naming the agents that are missing, `serve` with
tokens, values spelled as config.yaml and JSON spell them, and `token list`'s header."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from runagent.errors import ExitCode
from tests.conftest import Workspace, wait_for


def configure(ws: Workspace, kind: str, args: list[str], **extra: Any) -> None:
    """An agent `spender` of backend `kind` whose command is the fake agent run by python3."""
    ws.write_config([], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["spender"] = {"type": kind, "command": ws.agent_argv(["--ignore-unknown",
                                                                        *args])}  # fmt: skip
    data["defaults"]["agent"] = "spender"
    data.update(extra)
    ws.config.write_text(yaml.safe_dump(data))


# 12: Python spellings never reach a person ------------------------------------------------------


def test_values_are_shown_as_config_yaml_and_json_write_them() -> None:
    from runagent.config.settings import Until
    from runagent.errors import shown, spelled

    assert [shown(v) for v in (True, False, None, 3, 1.5, "x")] == [
        "true", "false", "null", "3", "1.5", "'x'"
    ]  # fmt: skip
    assert shown(["sh", "-c", "echo hi"]) == '[sh, -c, "echo hi"]'
    assert shown({"a": [1, None], "b": "yes"}) == '{a: [1, null], b: "yes"}'
    assert shown(["1.5", "0x1f", "true", "", "{config_dir}/x"]) == (
        '["1.5", "0x1f", "true", "", "{config_dir}/x"]'
    )
    assert yaml.safe_load(shown(["1.5", "-c", "a b", "true", "~"])) == ["1.5", "-c", "a b",
                                                                        "true", "~"]  # fmt: skip
    assert spelled(["0.5usd", "5000tokens"]) == "0.5usd 5000tokens" and spelled(True) == "true"
    assert [shown(v) for v in (300.0, 0.1234567, float("inf"), Until.EXIT)] == [
        "300", "0.1234567", ".inf", "'exit'"
    ]  # fmt: skip


def test_status_says_how_the_task_was_started_without_python_spellings(ws: Workspace) -> None:
    configure(ws, "codex", ["--codex-usage", "10", "--usage-lines", "1"])
    done = ws.cli("-p", "p", "-t", "t", "--budget", "5000tokens", "go")
    assert done.returncode == 0, done.stderr
    status = ws.cli("status", "-p", "p", "-t", "t").stdout
    (line,) = [row for row in status.splitlines() if row.startswith("started with")]
    assert "budget 5000tokens" in line and f"cwd {ws.path}" in line, line
    assert "[" not in line and "'" not in line and "True" not in line and "working_dir" not in line


def test_an_agent_run_by_an_interpreter_is_not_given_the_interpreters_version(
    ws: Workspace,
) -> None:
    configure(ws, "codex", ["--codex-usage", "10", "--usage-lines", "1"])
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 0
    (run,) = ws.runs()
    assert run.agent == "spender" and run.agent_version is None, run.agent_version


# A codex whose --version answers only once the test says so (a CLI that loads itself whole to
# say its version takes seconds, and far longer on a loaded machine).
SLOW_VERSION_CODEX = """#!/bin/sh
if [ "$1" = --version ]; then
  while [ ! -e "$0.go" ]; do sleep 0.05; done
  echo 'codex-cli 9.9.9'
  exit 0
fi
cat > /dev/null
echo '{"type": "thread.started", "thread_id": "0123456789abcdef"}'
echo '{"type": "item.completed", "item": {"type": "agent_message", "text": "done"}}'
"""


def test_an_agents_slow_version_holds_back_not_its_start_and_lands_in_its_record(
    ws: Workspace,
) -> None:
    exe = ws.path / "codex"
    exe.write_text(SLOW_VERSION_CODEX)
    exe.chmod(0o755)
    ws.write_config([], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["slow"] = {"type": "codex", "command": [str(exe)]}
    ws.config.write_text(yaml.safe_dump(data))
    proc = ws.start_cli("-p", "p", "-t", "t", "--agent", "slow", "go")
    try:  # the agent has run and said it is done while its --version still waits
        wait_for(lambda: ws.runs() and b"agent_message" in (
            ws.task().run_folder(ws.runs()[0].run_id) / "agent-stdout.txt").read_bytes(),
            what="the agent to run before its version is known")  # fmt: skip
        assert proc.poll() is None and ws.runs()[0].agent_version is None
        (ws.path / "codex.go").touch()
        proc.communicate(timeout=60)
    finally:
        (ws.path / "codex.go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0
    (run,) = ws.runs()
    assert run.agent_version == "codex-cli 9.9.9"


def test_a_string_command_is_refused_with_the_list_it_means(ws: Workspace) -> None:
    ws.config.write_text('agents:\n  a:\n    type: command\n    command: sh -c "echo hi"\n')
    proc = ws.invoke("list")
    assert proc.returncode == ExitCode.USAGE
    assert proc.stderr.rstrip().endswith('write the command as a list, e.g. [sh, -c, "echo hi"]')


# 8: {config_dir} wherever a command is given -----------------------------------------------------

# A codex of its own kept beside the config: it writes down its words, then says it is done.
FAKE_CODEX = """#!/bin/sh
printf '%s\\n' "$@" > "$0.argv"
cat > /dev/null
echo '{"type": "thread.started", "thread_id": "0123456789abcdef"}'
echo '{"type": "item.completed", "item": {"type": "agent_message", "text": "done"}}'
"""


def test_config_dir_is_the_configs_folder_in_every_word_of_every_command_given(
    ws: Workspace,
) -> None:
    beside = ws.path / "kept beside"  # a space in its name: each word stays one word
    beside.mkdir()
    for name in ("codex", "agent.sh"):
        (beside / name).write_text(FAKE_CODEX)
        (beside / name).chmod(0o755)
    (beside / "check.sh").write_text('touch "$0.ran"\n')
    config = beside / "config.yaml"
    config.write_text(yaml.safe_dump({
        "agents": {
            "mine": {"type": "command", "command": ["{config_dir}/agent.sh", "{config_dir}/in"],
                     "args": ["{prompt}"], "check": "sh {config_dir}/check.sh"},
            "cx": {"type": "codex", "command": ["{config_dir}/codex"],
                   "args": ["--note", "{config_dir}/notes"]},
        },
        "defaults": {"agent": "mine", "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip
    at = ["--config", str(config)]
    mine = ws.cli(*at, "-p", "p", "-t", "mine", "say {model} and {config_dir}")
    assert mine.returncode == 0, mine.stderr
    first, *prompt = (beside / "agent.sh.argv").read_text().splitlines()
    assert first == f"{beside}/in"
    assert "say {model} and {config_dir}" in prompt  # what is put in is not read again
    assert (beside / "check.sh.ran").exists()  # a check: is a command given too
    cx = ws.cli(*at, "-p", "p", "-t", "cx", "--agent", "cx", "go")
    assert cx.returncode == 0, cx.stderr
    words = (beside / "codex.argv").read_text().splitlines()
    assert words[0] == "exec" and words[words.index("--note") + 1] == f"{beside}/notes"
    for command in ("doctor", "backends"):
        said = ws.cli(*at, command).stdout
        assert f"codex found at {beside}/codex" in said and "{config_dir}" not in said, said


# 9: the prompt guard trips on the command names themselves ---------------------------------------


def test_a_one_word_prompt_of_a_named_task_runs_unless_it_is_a_commands_name(
    ws: Workspace,
) -> None:
    ws.write_config()
    for word in ("Release", "Lint", "lsit", "Restart"):  # close to resume, list, list, start
        proc = ws.invoke("-p", "p", "-t", word.lower(), word)
        assert proc.returncode == 0, proc.stderr
    for args in (["-p", "p", "-t", "x", "Status"], ["-p", "p", "Lint"], ["-t", "y", "Lint"]):
        proc = ws.invoke(*args)
        assert proc.returncode == ExitCode.USAGE and "looks like the command" in proc.stderr
    assert {t.name for t in (ws.root / "p").iterdir()} == {"release", "lint", "lsit", "restart"}


# 10: doctor says which agents are missing ---------------------------------------------------------


def test_doctor_names_the_agent_clis_that_are_missing_without_failing(ws: Workspace) -> None:
    ws.write_config()
    bin_dir = ws.path / "bin"
    bin_dir.mkdir()
    (bin_dir / "codex").write_text("#!/bin/sh\necho 'codex-cli 0.9.0'\n")
    (bin_dir / "codex").chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    if shutil.which("claude", path=path) or shutil.which("gemini", path=path):
        pytest.skip("claude or gemini is installed in /usr/bin here")
    proc = ws.cli("doctor", "--port", "0", env={"PATH": path})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert "note  backends no agent of the config uses (`--agent NAME` runs one that can)" in lines
    assert (
        "      ✗ claude: 'claude' not found on PATH — install it (npm install -g "
        "@anthropic-ai/claude-code), or set agents.claude.command"
    ) in lines
    assert f"      ✓ codex: codex found at {bin_dir}/codex" in lines
    last = lines[-1]
    assert last.startswith("everything the configured agents need is in place; not usable here:")
    assert "claude" in last and "gemini" in last and "codex" not in last


# 11: serve with tokens says how to open the page, and a browser gets one -------------------------

BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def test_serve_says_how_to_open_the_page_and_never_prints_the_key(ws: Workspace) -> None:
    from tests.conftest import serving

    ws.write_config()
    key = "k" * 40
    log = ws.path / "serve.log"
    with serving(ws, env={"RUN_AGENT_API_KEY": key}, log=log) as url:
        pass
    said = log.read_text()
    assert (
        f"run-agent: the page asks for a key: open {url}/?key=KEY once, with the API key "
        "(RUN_AGENT_API_KEY) or a token; `run-agent token create --scope operate --link`" in said
    )
    assert key not in said
    made = ws.invoke("token", "create", "--scope", "read", "--link")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip().rpartition("?key=")[2]
    assert made.stdout.strip() == f"http://127.0.0.1:14355/?key={secret}" and secret
    assert "open the address once in a browser" in made.stderr and secret not in made.stderr
    log.write_text("")
    with serving(ws, env={"RUN_AGENT_API_KEY": ""}, log=log):  # a token alone: said too
        pass
    assert "the page asks for a key" in log.read_text() and secret not in log.read_text()


def test_a_browser_without_a_key_gets_a_page_that_takes_one(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from runagent.store import tokens
    from server.app import Settings, create_app

    secret, _ = tokens.create(tmp_path, tokens.Scope.READ)
    app = create_app(Settings(root=tmp_path, run_schedules=False))
    with TestClient(app, base_url="http://127.0.0.1", follow_redirects=False) as client:
        page = client.get("/", headers=BROWSER)
        assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
        assert '<form method="get" action="/">' in page.text and 'name="key"' in page.text
        assert "run-agent token create --scope read --link" in page.text
        api = client.get("/api/tasks")  # a script, or the page's own requests: JSON
        assert api.status_code == 401 and "Bearer" in api.json()["error"]
        wrong = client.get("/?key=rat_wrong", headers=BROWSER)
        assert wrong.status_code == 401 and "was refused" in wrong.text
        client.cookies.set("run_agent_key", "rat_stale")  # a revoked token's cookie
        opened = client.get(f"/?key={secret}", headers=BROWSER)  # the form's address
        assert opened.status_code == 303 and opened.headers["location"] == "/"
        assert client.get("/", headers=BROWSER).status_code == 200


def test_a_damaged_run_record_is_named_in_configs_spelling(ws: Workspace) -> None:
    ws.write_config()
    assert ws.invoke("-p", "p", "-t", "t", "go").returncode == 0
    (run,) = ws.runs()
    info = ws.task().run_folder(run.run_id) / "run-info.yaml"
    info.write_text(info.read_text().replace(f"attempt: {run.attempt}", "attempt: true"))
    listed = ws.invoke("list", "-p", "p", "-t", "t").stdout
    assert "attempt is true, not an int" in listed and "True" not in listed, listed


def test_an_api_body_is_answered_in_jsons_spelling(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from server.app import Settings, create_app

    app = create_app(Settings(root=tmp_path, run_schedules=False))
    said = {
        "max_restarts": (True, "max_restarts: true is not a whole number of restarts"),
        "agent": (False, "agent false is not a name; give one as text"),
        "task_id": (["a"], "task_id [a] is not a task's id"),
        "after": ([1, None], "after [1, null] is not a list of PROJECT/TASK names"),
    }
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for key, (value, error) in said.items():
            answer = client.post("/api/projects/p/tasks", json={"prompt": "x", key: value})
            assert answer.status_code == 400 and answer.json()["error"].startswith(error), (
                answer.text
            )
    assert not (tmp_path / "p").exists()
