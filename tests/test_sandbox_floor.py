"""The sandbox is a floor the config sets: an agent's `sandbox: bwrap` and `network: false` are
lowered only by the config's owner (the config itself, the command line of the user who runs
run-agent, the api_key or an admin token), never by a token below admin over REST or MCP, a
schedule's firing or the task's own `task.yaml`; nor the config's `ops.sandbox` of an
operations run made over the API. Real bubblewrap, a real `run-agent serve`, the
fake agent probing whether it reaches a listener on the host and reads a key in the home; the
runs root outside /tmp and the home (`ws_outside`), as a person's is."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import httpx
import pytest
import yaml

from runagent import listing
from runagent.errors import ExitCode
from runagent.ops.sandbox import Bwrap
from runagent.store import tokens
from runagent.store.runfolder import TASK_SETTINGS
from tests.conftest import Workspace, serving, wait_for
from tests.server.test_mcp import call, over_http, refusal

pytestmark = pytest.mark.skipif(
    Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here"
)

KEY = "k" * 40
MINE = "mine"
REFUSED = "only the config's owner lowers it"  # in every refusal of a lowering


@dataclass
class Floor:
    """A workspace whose agent `fake` the config puts under bubblewrap without network, and
    `plain`, which it leaves as the user (network: false, which holds only in a sandbox); both
    probe a listener on the host and a key in the home."""

    ws: Workspace
    home: Path
    secret: Path
    where: str  # HOST:PORT the listener answers on

    @property
    def env(self) -> dict[str, str]:
        return {"HOME": str(self.home), "RUN_AGENT_API_KEY": KEY}

    def seen(self, task: str, project: str = MINE) -> str:
        """Where the task's latest run ran: `sandboxed` (no home, no network), `host` (both)."""
        paths = self.ws.task(project, task)
        text = paths.run(paths.run_ids()[-1]).stdout.read_text()
        probes = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        read, reach = probes[f"read {self.secret}"], probes[f"connect {self.where}"]
        if read == "ok" and reach == "ok":
            return "host"
        if read == "FileNotFoundError" and reach != "ok":
            return "sandboxed"
        return f"read {read}, connect {reach}"

    def ended(self, task: str, project: str = MINE, runs: int = 1) -> str:
        """Wait for the task's loop to end after its `runs`th run; where that run ran."""
        paths = self.ws.task(project, task)

        def over() -> bool:
            view = listing.view(paths)
            return len(paths.run_ids()) >= runs and view.status.value in ("completed", "failed")

        wait_for(over, 60, f"{project}/{task} to end")
        return self.seen(task, project)

    def remember(self, task: str, **settings: object) -> None:
        """Add `settings` to the task's task.yaml, as its agent can (its task folder is its)."""
        path = self.ws.task(MINE, task).folder / TASK_SETTINGS
        record = yaml.safe_load(path.read_text()) or {}
        path.write_text(yaml.safe_dump({**record, **settings}))


@pytest.fixture
def floor(ws_outside: Workspace) -> Iterator[Floor]:
    import shutil
    import tempfile

    ws = ws_outside
    # Beside the workspace, not in it: a working folder that holds the home shows it.
    home = Path(tempfile.mkdtemp(prefix="run-agent-test-home-", dir=ws.path.parent))
    (home / ".ssh").mkdir()
    secret = home / ".ssh" / "id_ed25519"
    secret.write_text("a private key")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    where = f"127.0.0.1:{listener.getsockname()[1]}"
    probes = ["--probe-read", str(secret), "--probe-connect", where]
    ws.write_config(probes, agents={"plain": probes}, max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"].update({"sandbox": "bwrap", "network": False})
    data["agents"]["plain"]["network"] = False
    ws.config.write_text(yaml.safe_dump(data))
    try:
        yield Floor(ws, home, secret, where)
    finally:
        listener.close()
        shutil.rmtree(home, ignore_errors=True)


def one_line(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    error: str = answer.json()["error"]
    assert "\n" not in error
    return error


def test_a_token_below_admin_never_lowers_the_sandbox_over_rest(floor: Floor) -> None:
    ws = floor.ws
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    admin, _ = tokens.create(ws.root, tokens.Scope.ADMIN)
    with serving(ws, env=floor.env) as url, httpx.Client(base_url=url, timeout=60) as client:

        def start(secret: str, **body: object) -> httpx.Response:
            return client.post(f"/api/projects/{MINE}/tasks", json={"prompt": "go", **body},
                               headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

        def resume(secret: str, task: str, **body: object) -> httpx.Response:
            return client.post(f"/api/projects/{MINE}/tasks/{task}/resume", json=body,
                               headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

        lowered = one_line(start(operate, task_id="a", sandbox="none"), 403)
        assert "sandbox none" in lowered and REFUSED in lowered, lowered
        assert "fake" in lowered and "network: false" in lowered, lowered
        assert not ws.task(MINE, "a").folder.exists()  # nothing started, nothing left
        # `network` is the config's alone: no body, of any token, names it.
        assert "'network' is not something" in one_line(start(admin, network=True), 400)

        # As the config says, the token's start runs sandboxed; a resume asking less is refused.
        assert start(operate, task_id="kept").status_code == 202
        assert floor.ended("kept") == "sandboxed"
        again = one_line(resume(operate, "kept", sandbox="none", again=True), 403)
        assert again == lowered and len(ws.task(MINE, "kept").run_ids()) == 1
        assert resume(operate, "kept", again=True).status_code == 202
        assert floor.ended("kept", runs=2) == "sandboxed"

        # Raising is anyone's: `plain` runs as the user unless asked to run sandboxed.
        assert start(operate, task_id="raised", agent="plain", sandbox="bwrap").status_code == 202
        assert floor.ended("raised") == "sandboxed"
        assert start(operate, task_id="as-is", agent="plain").status_code == 202
        assert floor.ended("as-is") == "host"

        # The owner's credentials lower it: an admin token, and the api_key.
        assert start(admin, task_id="by-admin", sandbox="none").status_code == 202
        assert floor.ended("by-admin") == "host"
        assert start(KEY, task_id="by-key", sandbox="none").status_code == 202
        assert floor.ended("by-key") == "host"


def test_a_token_below_admin_never_lowers_the_sandbox_over_mcp(floor: Floor) -> None:
    ws = floor.ws
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])

    async def main(url: str) -> None:
        async with over_http(url, operate) as operator:
            said = await refusal(operator, "start_task", project=MINE, task="a", prompt="go",
                                 sandbox="none")  # fmt: skip
            assert "sandbox none" in said and REFUSED in said, said
            await call(operator, "start_task", project=MINE, task="kept", prompt="go")
            assert await anyio.to_thread.run_sync(floor.ended, "kept") == "sandboxed"
            resumed = await refusal(operator, "resume_task", project=MINE, task="kept",
                                    sandbox="none", again=True)  # fmt: skip
            assert resumed == said
        async with over_http(url, KEY) as owner:
            await call(owner, "start_task", project=MINE, task="by-key", prompt="go",
                       sandbox="none")  # fmt: skip
            assert await anyio.to_thread.run_sync(floor.ended, "by-key") == "host"

    with serving(ws, env=floor.env) as url:
        anyio.run(main, url)
    assert not ws.task(MINE, "a").folder.exists()
    assert len(ws.task(MINE, "kept").run_ids()) == 1


def test_the_task_file_never_lowers_the_sandbox(floor: Floor) -> None:
    ws = floor.ws
    done = ws.cli("-p", MINE, "-t", "t", "go", env=floor.env)
    assert done.returncode == ExitCode.COMPLETED, done.stderr
    assert floor.seen("t") == "sandboxed"
    # What its agent could write into its own task folder: read, and not obeyed.
    floor.remember("t", sandbox="none", network=True)
    resumed = ws.cli("resume", "-p", MINE, "-t", "t", "--again", env=floor.env)
    assert resumed.returncode == ExitCode.COMPLETED, resumed.stderr
    assert floor.seen("t") == "sandboxed"
    # Nor by a start through the server, of a token or of the owner, that does not ask for it.
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    floor.remember("t", sandbox="none")
    with serving(ws, env=floor.env) as url, httpx.Client(base_url=url, timeout=60) as client:
        for n, secret in enumerate((operate, KEY)):
            answer = client.post(f"/api/projects/{MINE}/tasks/t/resume", json={"again": True},
                                 headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
            assert answer.status_code == 202, answer.text
            assert floor.ended("t", runs=3 + n) == "sandboxed"
    # The owner lowers it on the command line, for that loop; its record does not carry it on.
    lowered = ws.cli("resume", "-p", MINE, "-t", "t", "--again", "--sandbox", "none",
                     env=floor.env)  # fmt: skip
    assert lowered.returncode == ExitCode.COMPLETED, lowered.stderr
    assert floor.seen("t") == "host"
    again = ws.cli("resume", "-p", MINE, "-t", "t", "--again", env=floor.env)
    assert again.returncode == ExitCode.COMPLETED, again.stderr
    assert floor.seen("t") == "sandboxed"
    # What the record raises stays raised: `plain`, started sandboxed, resumes sandboxed.
    raised = ws.cli("-p", MINE, "-t", "r", "-a", "plain", "--sandbox", "bwrap", "go",
                    env=floor.env)  # fmt: skip
    assert raised.returncode == ExitCode.COMPLETED and floor.seen("r") == "sandboxed"
    resumed = ws.cli("resume", "-p", MINE, "-t", "r", "--again", env=floor.env)
    assert resumed.returncode == ExitCode.COMPLETED and floor.seen("r") == "sandboxed"


def test_a_schedule_never_lowers_the_sandbox(floor: Floor) -> None:
    ws = floor.ws
    data = yaml.safe_load(ws.config.read_text())
    data["schedules"] = {"tick": {"cron": "@daily", "project": MINE, "task": "nightly",
                                  "prompt": "nightly work"}}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    fired = ws.cli("schedule", "now", "tick", env=floor.env)
    assert fired.returncode == 0, fired.stderr
    assert floor.ended("nightly") == "sandboxed"
    floor.remember("nightly", sandbox="none")  # each firing runs the same task again
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    auth = {"Authorization": f"Bearer {operate}"}
    with serving(ws, env=floor.env) as url, httpx.Client(base_url=url, timeout=60) as client:
        asked = client.post("/api/schedules/tick/run", json={"sandbox": "none"}, headers=auth)
        said = one_line(asked, 400)
        assert "'sandbox' is not something" in said and "as the config says" in said, said
        assert len(ws.task(MINE, "nightly").run_ids()) == 1
        assert client.post("/api/schedules/tick/run", json={}, headers=auth).status_code == 202
        assert floor.ended("nightly", runs=2) == "sandboxed"
    fired = ws.cli("schedule", "now", "tick", env=floor.env)
    assert fired.returncode == 0, fired.stderr
    assert floor.ended("nightly", runs=3) == "sandboxed"


def test_a_cocode_host_runs_the_agent_as_the_config_sandboxes_it(floor: Floor) -> None:
    from tests.gitrepo import GIT_ENV, make_repo
    from tests.issues.test_cocode import cocode

    ws = floor.ws
    repo = make_repo(ws.path / "repo")
    # The agent works in the repository alone: its pids go where it may write.
    ws.config.write_text(ws.config.read_text().replace(str(ws.pid_file), str(repo / ".git/pids")))
    issue = ws.path / "issue.txt"
    issue.write_text("Fix the bug\n")
    recipe = {"COCODE_REPO_PATH": str(repo), "COCODE_ISSUE_NUMBER": "1",
              "COCODE_ISSUE_BODY_FILE": str(issue), "COCODE_READY_MARKER": "ready",
              "HOME": str(floor.home), **GIT_ENV}  # fmt: skip
    done = cocode(ws, recipe)
    assert done.returncode == 0, done.stderr
    assert floor.seen("issue-1", "cocode") == "sandboxed"


def test_a_token_below_admin_never_lowers_the_operations_sandbox(floor: Floor) -> None:
    ws = floor.ws
    operate, _ = tokens.create(ws.root, tokens.Scope.OPERATE, [MINE])
    admin, _ = tokens.create(ws.root, tokens.Scope.ADMIN)
    data = yaml.safe_load(ws.config.read_text())
    data["ops"] = {"sandbox": "bwrap"}
    ws.config.write_text(yaml.safe_dump(data))
    (ws.path / "project").mkdir()
    with serving(ws, env=floor.env) as url, httpx.Client(base_url=url, timeout=60) as client:

        def create(secret: str, **body: object) -> httpx.Response:
            return client.post("/api/ops/runs", json={"workspace": "project", "project_id": MINE,
                               **body}, headers={"Authorization": f"Bearer {secret}"})  # fmt: skip

        for lower in ("none", "auto"):
            said = one_line(create(operate, sandbox=lower), 403)
            assert f"sandbox {lower}" in said and REFUSED in said and "ops.sandbox" in said, said
        assert not ws.task(MINE, "ops").folder.exists()
        # Unsaid, a run is as the config says (as `run-agent ops apply` is); the owner lowers it.
        made = create(operate)
        assert made.status_code == 201 and made.json()["sandbox"] == "bwrap", made.text
        lowered = create(admin, sandbox="none")
        assert lowered.status_code == 201 and lowered.json()["sandbox"] == "none", lowered.text
        data["ops"] = {"sandbox": "auto"}  # the default: `none` is still below it
        ws.config.write_text(yaml.safe_dump(data))
        said = one_line(create(operate, sandbox="none"), 403)
        assert "sandbox none" in said and REFUSED in said, said
        assert create(operate, sandbox="bwrap").status_code == 201
