"""The code in docs/adding-a-backend.md works as written."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path

import pytest

import backends
from tests.conftest import REPO


def test_the_adding_a_backend_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (REPO / "docs" / "adding-a-backend.md").read_text()
    module_code, registry, test_code = re.findall(r"```python\n(.*?)```", doc, re.S)
    module = types.ModuleType("backends.aider")
    exec(compile(module_code, "backends/aider.py", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "backends.aider", module)
    # The registry line, as a reader would add it to backends/__init__.py.
    (line,) = re.findall(r'^\s*"aider": (.*),$', registry, re.M)
    monkeypatch.setitem(backends.BUILTIN, "aider", eval(line, vars(backends)))
    namespace: dict[str, object] = {}
    exec(compile(test_code, "tests/test_aider.py", "exec"), namespace)
    test = namespace["test_command_line_and_environment"]
    assert callable(test)
    test(tmp_path)


README = REPO / "README.md"
# Commands the README shows that can run here, offline, without starting anything long-lived.
# (A `job` of the demo agent fails on purpose: it fails its first attempt, and a job has one.)
OFFLINE = ("list", "status -p", "output -p", "backends", "doctor", "schedule list",
           "schedule crontab", "--project")  # fmt: skip


def readme_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)


@pytest.mark.parametrize("index", range(len(readme_yaml_blocks())))
def test_every_yaml_block_of_the_readme_is_a_valid_config(index: int, tmp_path: Path) -> None:
    """What the README shows is accepted as written (`on:` included)."""
    from runagent.configfile import load_config

    block = readme_yaml_blocks()[index]
    config = tmp_path / "config.yaml"
    config.write_text(block)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "nightly.md").write_text("the nightly prompt")
    loaded = load_config(config, backends.known(), tmp_path)
    if "notify:" in block and "on:" in block:
        assert loaded.notify is not None and len(loaded.notify.events) == 3


def readme_commands() -> list[str]:
    """Every `run-agent ...` the README shows (in backticks or an indented block), with its
    placeholders (P, T, [optional] parts, a|b choices) filled in for the quick start's task."""
    text = README.read_text()
    found = re.findall(r"`(run-agent [^`]*)`", text) + re.findall(
        r"^    (run-agent .*)$", text, re.M
    )
    commands = []
    for raw in found:
        command = raw.replace("\\|", "|")
        command = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"\[[^\[\]]*\]", "", command))  # nested
        command = re.sub(r"(\w+)\|[\w|]+", r"\1", command)  # the first of a|b|c
        command = command.replace(" -p P", " -p demo").replace(" -t T", " -t hello")
        command = " ".join(command.split())
        if command.startswith("run-agent:") or " | " in command:
            continue
        rest = command.removeprefix("run-agent ").strip()
        if rest.startswith(OFFLINE) and not re.search(r"\b[A-Z]{1,4}\b", rest):
            commands.append(command)
    return sorted(set(commands))


def test_the_readme_shows_commands_that_run(tmp_path: Path) -> None:
    import shlex
    import subprocess

    commands = readme_commands()
    assert "run-agent list" in commands and "run-agent doctor" in commands
    env = {**os.environ, "RUN_AGENT_ROOT": str(tmp_path / "runs")}
    quick_start = [c for c in commands if c.startswith("run-agent --project demo")]
    rest = [c for c in commands if c not in quick_start]
    for command in [*quick_start, *rest]:  # the quick start makes the task the others look at
        argv = [sys.executable, "-m", "runagent", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        allowed = (0, 3) if " doctor" in command or " backends" in command else (0,)
        assert done.returncode in allowed, f"{command}: {done.stderr}"
        assert "Traceback" not in done.stderr, command
