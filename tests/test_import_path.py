"""The folder an agent works on is never on the import path of a run-agent process: `python -m`
puts the working folder first, and each detached start, the queue's keeper and an API agent's
child run in it, so a `json.py` there (written by the agent, or shipped in the repository)
would run on the host in place of the standard library's, outside any sandbox."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runagent.store.runinfo import RunStatus
from tests.backends.test_http_backends import configure as configure_api
from tests.conftest import Workspace, wait_for
from tests.fake_models import FakeModelServer

# Modules every run-agent process imports after it starts, none of them at the interpreter's.
SHADOWED = ("json", "yaml", "click", "shlex")


def plant(repo: Path) -> Path:
    """A repository whose modules shadow the standard library's and the dependencies'; the
    file each writes when it is imported."""
    repo.mkdir(parents=True, exist_ok=True)
    marker = repo.parent / "shadow-imported"
    for name in SHADOWED:
        (repo / f"{name}.py").write_text(
            f"import pathlib, sys\n"
            f"pathlib.Path({str(marker)!r}).write_text({name!r} + ' ' + ' '.join(sys.argv))\n"
        )
    return marker


def run_agent(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`run-agent ARGS` as a person runs it in `repo` (the launcher keeps its own folder, not
    the working one, on the path, as `-P` does here)."""
    return subprocess.run([sys.executable, "-P", "-m", "runagent", *args], cwd=repo,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


def test_a_detached_start_imports_nothing_from_the_folder_it_runs_in(ws: Workspace) -> None:
    ws.write_config(["--lines", "1"], max_restarts=0)
    marker = plant(ws.path / "repo")
    done = run_agent(ws.path / "repo", "run", "-p", "p", "-t", "t", "-d", "--config",
                     str(ws.config), "go")  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_for(lambda: ws.runs() and ws.runs()[-1].status is RunStatus.COMPLETED, 60, "the run")
    assert not marker.exists(), marker.read_text()


def test_the_keeper_imports_nothing_from_the_folder_a_queued_start_runs_in(
    ws: Workspace,
) -> None:
    import yaml

    ws.write_config(["--lines", "1", "--wait-in-task", "go"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    ws.config.write_text(yaml.safe_dump({**data, "limits": {"max_running": 1}}))
    repo = ws.path / "repo"
    marker = plant(repo)
    for task in ("a", "b"):
        done = run_agent(repo, "run", "-p", "p", "-t", task, "-d", "--config", str(ws.config),
                         "go")  # fmt: skip
        assert done.returncode == 0, done.stderr

    def completed(task: str) -> bool:
        return [r.status for r in ws.runs("p", task)] == [RunStatus.COMPLETED]

    for task in ("a", "b"):
        folder = ws.task("p", task).folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "go").touch()
        wait_for(lambda: completed(task), 60, f"task {task} to complete")  # noqa: B023
    assert not marker.exists(), marker.read_text()


def test_an_api_agents_child_imports_nothing_from_the_folder_it_works_in(ws: Workspace) -> None:
    marker = plant(ws.path / "repo")
    with FakeModelServer() as provider:
        configure_api(ws, "perplexity", provider)
        done = run_agent(ws.path / "repo", "-p", "p", "-t", "t", "--config", str(ws.config),
                         "ask")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()
