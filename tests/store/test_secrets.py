"""No secret value on disk nor in a line run-agent prints: a URL's password is scrubbed, a record
keeps a secret variable's name, and a run's files are its owner's alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runagent.store import credentials
from runagent.store.lock import live_holder
from tests.conftest import Workspace, wait_for

SECRET = "hunter2-never-shown"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"git push http://user:{SECRET}@127.0.0.1:1/x failed",
         "git push http://user:***@127.0.0.1:1/x failed"),
        (f"'https://u:{SECRET}@host/r.git'", "'https://u:***@host/r.git'"),
        (f"https://{SECRET}@github.com/o/r", "https://***@github.com/o/r"),  # a token as user
        (f"postgres://app:p@ss{SECRET}@db:5432/x?a=b@c", "postgres://app:***@db:5432/x?a=b@c"),
        ("ssh://git@host/repo and git@host:repo", "ssh://git@host/repo and git@host:repo"),
        ("mail a@b.example, see http://host/a@b", "mail a@b.example, see http://host/a@b"),
    ],
)  # fmt: skip
def test_a_url_s_credentials_are_scrubbed_and_nothing_else(text: str, shown: str) -> None:
    assert credentials.scrub_urls(text) == shown


def test_a_record_keeps_the_names_of_secret_variables_and_the_values_of_the_others() -> None:
    env = {"PATH": "/bin", "OPENAI_API_KEY": SECRET, "MY_LLM": SECRET, "EMPTY_TOKEN": "",
           "PROXY": f"http://u:{SECRET}@proxy:3128", "HOME": "/home/u"}  # fmt: skip
    values, withheld = credentials.withhold(env, named=("MY_LLM",))
    assert values == {"PATH": "/bin", "HOME": "/home/u", "EMPTY_TOKEN": ""}
    assert withheld == ("MY_LLM", "OPENAI_API_KEY", "PROXY")
    restored, missing = credentials.restore(values, withheld, {"OPENAI_API_KEY": "k", "PROXY": "p"})
    assert restored == {**values, "OPENAI_API_KEY": "k", "PROXY": "p"} and missing == ("MY_LLM",)


def test_a_url_s_password_in_the_agent_s_command_line_is_not_recorded(ws: Workspace) -> None:
    url = f"https://deploy:{SECRET}@127.0.0.1:9/x"
    ws.write_config(["--lines", "1", "--echo-env", url], max_restarts=0)  # one more argument
    done = ws.cli("job", "-p", "p", "-t", "t", "go")
    assert done.returncode == 0, done.stderr
    (info,) = ws.runs("p", "t")
    assert "deploy:***@127.0.0.1" in (info.commandline or "") and SECRET not in done.stderr
    folder = ws.task("p", "t").folder
    assert not [p for p in folder.rglob("*.yaml") if SECRET in p.read_text()]


def test_a_worktree_record_keeps_a_url_without_its_password(ws: Workspace) -> None:
    from runagent.store import taskfolder

    task = ws.task("p", "t")
    task.folder.mkdir(parents=True)
    taskfolder.write_worktree_record(task, {"issue": 7, "url": f"https://u:{SECRET}@h/i/7"})
    assert SECRET not in task.issue_record.read_text()
    assert taskfolder.read_worktree_record(task)["url"] == "https://u:***@h/i/7"


def modes(folder: Path) -> dict[str, str]:
    """Each path under `folder` (itself included), relative, with its mode in octal."""
    found = {".": oct(folder.stat().st_mode & 0o777)}
    for path in folder.rglob("*"):
        found[str(path.relative_to(folder))] = oct(path.lstat().st_mode & 0o777)
    return found


def test_a_run_s_files_are_its_owner_s_alone_whatever_the_umask(ws_outside: Workspace) -> None:
    """The prompt, TASK.md, stdout and stderr (the same prompt, the agent's output), run-info,
    output.md, the supervisor's log and every folder run-agent makes under the root, for a
    loop in the foreground and one detached: files 0600, folders 0700, under a umask of 022."""
    from runagent.service import Service, StartRequest

    ws = ws_outside
    ws.write_config(["--lines", "2"], max_restarts=0)
    old = os.umask(0o022)
    try:
        done = ws.cli("job", "-p", "p", "-t", "fg", "the prompt")
        assert done.returncode == 0, done.stderr
        door = Service(ws.root, config_path=ws.config, workdir=ws.path)
        door.start(StartRequest(ws.task("p", "bg"), "the prompt"))
        wait_for(lambda: [r.status.value for r in ws.runs("p", "bg")] == ["completed"],
                 what="the detached loop to end")  # fmt: skip
        wait_for(lambda: live_holder(ws.task("p", "bg").lock) is None, what="its supervisor")
    finally:
        os.umask(old)
    found = modes(ws.root)
    for name in ("p/fg/TASK.md", "p/bg/supervisor.log"):
        assert name in found, sorted(found)
    run = next(n for n in found if n.startswith("p/fg/runs/") and n.count("/") == 3)
    for name in ("prompt.md", "agent-stdout.txt", "agent-stderr.txt", "run-info.yaml",
                 "output.md"):  # fmt: skip
        assert f"{run}/{name}" in found, sorted(found)
    folders = {n for n in found if (ws.root / n).is_dir()}
    wrong = {n: m for n, m in found.items() if m != ("0o700" if n in folders else "0o600")}
    assert not wrong, sorted(wrong.items())
