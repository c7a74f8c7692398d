"""The docs work as written: the adding-a-backend example runs, every YAML block is a valid config,
every command shown runs, every link resolves."""

from __future__ import annotations

import os
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import backends
from runagent.loop.lines import checked
from tests.conftest import REPO


def test_the_adding_a_backend_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = (REPO / "docs" / "agents" / "adding-a-backend.md").read_text()
    module_code, lines_code, registry, test_code = re.findall(r"```python\n(.*?)```", doc, re.S)
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
    # The rules its lines read by, in the class as the page shows them, are well made.
    shown: dict[str, Any] = {"Backend": module.AiderBackend}
    exec(compile(lines_code, "backends/aider.py", "exec"), shown)
    assert len(checked(shown["AiderBackend"].lines, "aider")) == 4


README = REPO / "README.md"
# The pages people read: the front page and the documentation site (the protocol specifications
# under docs/spec/ are other projects' documents, kept as they are).
PAGES = [README, *sorted(p for p in (REPO / "docs").rglob("*.md") if "spec" not in p.parts)]
# Commands the docs show that can run here, offline, without starting anything long-lived.
# (A `job` of the demo agent fails on purpose: it fails its first attempt, and a job has one.)
OFFLINE = ("list", "status -p", "output -p", "backends", "doctor", "schedule list", "fleet",
           "schedule crontab", "--project demo", "token")  # fmt: skip


def yaml_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(REPO)}:{index}", block)
        for page in PAGES
        for index, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), re.S))
    ]


@pytest.mark.parametrize(("where", "block"), yaml_blocks(), ids=[w for w, _ in yaml_blocks()])
def test_every_yaml_block_of_the_docs_is_a_valid_config(
    where: str, block: str, tmp_path: Path
) -> None:
    """What the README and the docs show is accepted as written (`on:` included)."""
    from runagent.config.file import load_config

    config = tmp_path / "config.yaml"
    config.write_text(block)
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / "nightly.md").write_text("the nightly prompt")
    names = set(backends.known())
    if "adding-a-backend" in where:
        names.add("aider")  # the backend that page adds
    loaded = load_config(config, names, tmp_path)
    if "notify:" in block and "on:" in block:
        assert loaded.notify is not None and len(loaded.notify.events) == 3


def readme_commands() -> list[str]:
    """Every `run-agent ...` the README and the docs show (in backticks or an indented block),
    with its placeholders (P, T, [optional] parts, a|b choices) filled in for the quick start's
    task."""
    text = "\n".join(page.read_text() for page in PAGES)
    found = re.findall(r"`(run-agent [^`]*)`", text) + re.findall(
        r"^    (run-agent .*)$", text, re.M
    )
    commands = []
    for raw in found:
        command = re.sub(r"\s+#\s.*$", "", raw.replace("\\|", "|"))  # a shell comment
        command = re.sub(r"\[[^\[\]]*\]", "", re.sub(r"\[[^\[\]]*\]", "", command))  # nested
        command = re.sub(r"(\w+)\|[\w|]+", r"\1", command)  # the first of a|b|c
        command = command.replace(" -p P", " -p demo").replace(" -t T", " -t hello")
        command = " ".join(command.split())
        if command.startswith("run-agent:") or " | " in command:
            continue
        if "--install" in command or "--uninstall" in command:
            continue  # it changes the user's crontab: tests/test_crontab.py runs it in a sandbox
        rest = command.removeprefix("run-agent ").strip()
        if rest.startswith(OFFLINE) and not re.search(r"\b[A-Z]{1,4}\b", rest):
            commands.append(command)
    return sorted(set(commands))


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_link_of_the_docs_resolves_in_a_clone(page: Path) -> None:
    """A relative link leads to a file of the repository (no link into ../shared or elsewhere)."""
    dead = []
    for target in LINK.findall(re.sub(r"```.*?```", "", page.read_text(), flags=re.S)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.is_relative_to(REPO) or not path.exists():
            dead.append(target)
    assert not dead, f"{page.relative_to(REPO)}: dead links {dead}"


def test_the_readme_shows_commands_that_run(tmp_path: Path) -> None:
    import shlex
    import subprocess

    commands = readme_commands()
    assert "run-agent list" in commands and "run-agent doctor" in commands
    # Nothing the docs show may touch the machine's crontab, even by mistake: a `crontab` that
    # refuses stands first on PATH.
    guard = tmp_path / "bin"
    guard.mkdir()
    (guard / "crontab").write_text("#!/bin/sh\necho 'no crontab in tests' >&2\nexit 1\n")
    (guard / "crontab").chmod(0o755)
    path = f"{guard}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "RUN_AGENT_ROOT": str(tmp_path / "runs"), "PATH": path}
    quick_start = [c for c in commands if c.startswith("run-agent --project demo")]
    rest = [c for c in commands if c not in quick_start]
    for command in [*quick_start, *rest]:  # the quick start makes the task the others look at
        argv = [sys.executable, "-m", "runagent", *shlex.split(command)[1:]]
        done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        allowed = (0, 3) if " doctor" in command or " backends" in command else (0,)
        assert done.returncode in allowed, f"{command}: {done.stderr}"
        assert "Traceback" not in done.stderr, command
