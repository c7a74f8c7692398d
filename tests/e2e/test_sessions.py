"""Attempts continue the agent's session: the real claude, codex and gemini CLIs against the fake
provider (tests/fake_models.py). A first attempt answers, its check fails; the second attempt
resumes exactly that session by its id, so its request carries the first attempt's messages,
and is told only the failure's tail. A session that cannot be resumed falls back to a fresh one.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from runagent.store import runfolder
from tests.conftest import Workspace
from tests.e2e import test_real_clis as real
from tests.e2e.test_real_clis import CLIS, PROMPT, configure, pytestmark  # noqa: F401 (skip)
from tests.fake_models import TEXT, FakeModelServer

provider, private_cache = real.provider, real.private_cache  # its fixtures

# A check that fails once, then passes: the first attempt fails with check_failed.
ONCE = (
    "import os, sys; e = os.path.exists('checked'); open('checked', 'a').close(); sys.exit(1 - e)"
)
CHECK = f"{sys.executable} -c {json.dumps(ONCE)}"
# What only the first attempt's prompt says.
FIRST = "attempt 1 of at most"


def model_bodies(server: FakeModelServer) -> list[str]:
    """Each request the CLI sent the model, as text (other requests have no body)."""
    return [json.dumps(r.body) for r in server.requests if r.method == "POST" and r.body]


def run_task(ws: Workspace, work: Path, cache: Path, *more: str) -> Any:
    return ws.cli(
        "--project", "p", "--task", "t", "--cwd", str(work), "--check", CHECK, *more, PROMPT,
        env={"XDG_CACHE_HOME": str(cache)}, timeout=240,
    )  # fmt: skip


@pytest.mark.parametrize("cli", CLIS)
def test_the_second_attempt_continues_the_first_attempts_session(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    work = configure(ws, cli, provider, max_restarts=1)
    proc = run_task(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    first, second = ws.runs()
    assert first.reason == "check_failed" and second.status == "completed"
    assert first.session_id and first.session_id in (second.commandline or "")
    assert second.resumed_run_id == first.run_id and second.session_id
    prompt = ws.task().run(second.run_id).prompt.read_text()
    assert "## Previous attempt" in prompt and "## Task" not in prompt
    # The last request of the second attempt carries the first attempt's messages: its
    # prompt (which alone says "attempt 1 of ...") and the model's answer, then the new one.
    last = model_bodies(provider)[-1]
    assert FIRST in last and TEXT in last and "## Previous attempt" in last
    assert last.index(FIRST) < last.index("## Previous attempt")


@pytest.mark.parametrize("cli", CLIS)
def test_session_fresh_starts_each_attempt_anew_with_the_task_and_the_tail(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    work = configure(ws, cli, provider, max_restarts=1, session="fresh")
    proc = run_task(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    first, second = ws.runs()
    assert second.resumed_run_id is None and "--resume" not in (second.commandline or "")
    assert second.session_id and second.session_id != first.session_id
    last = model_bodies(provider)[-1]
    assert FIRST not in last and "## Previous attempt" in last and "## Task" in last


@pytest.mark.parametrize("cli", CLIS)
def test_a_session_that_is_gone_falls_back_to_a_fresh_attempt_said_in_the_log(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    work = configure(ws, cli, provider, max_restarts=0)
    assert run_task(ws, work, private_cache).returncode != 0  # its check failed, no restart
    (first,) = ws.runs()
    gone = str(uuid.uuid4())  # a session the CLI never had (deleted, expired)
    folder = ws.task().run_folder(first.run_id)
    data = yaml.safe_load((folder / runfolder.RUN_INFO).read_text())
    (folder / runfolder.RUN_INFO).write_text(yaml.safe_dump({**data, "session_id": gone}))
    proc = ws.cli("resume", "-p", "p", "-t", "t", env={"XDG_CACHE_HOME": str(private_cache)},
                  timeout=240)  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # max_restarts 0: the refusal spent none
    _, refused, fresh = ws.runs()
    assert refused.resumed_run_id == first.run_id and gone in (refused.commandline or "")
    assert refused.status == "failed" and refused.session_id is None
    assert f"could not resume session {gone}" in proc.stderr
    assert fresh.status == "completed" and fresh.resumed_run_id is None
    prompt = ws.task().run(fresh.run_id).prompt.read_text()
    assert f"Run `{first.run_id}`" in prompt and "## Task" in prompt  # the failure's tail


@pytest.mark.parametrize("cli", CLIS)
def test_a_sandboxed_agent_continues_its_session_kept_in_the_tasks_own_copy(
    ws: Workspace, provider: FakeModelServer, private_cache: Path, cli: str
) -> None:
    from runagent.ops.sandbox import Bwrap

    if Bwrap(Path("/")).problem() is not None:
        pytest.skip("bubblewrap cannot run here")
    work = configure(ws, cli, provider, max_restarts=1, sandbox="bwrap")
    # The CLI's folder as a user who ran it has it: a sandboxed run keeps its sessions in the
    # task's copy of it (one the host lacks is made in the hidden home, for that run only).
    for folder in (".claude", ".gemini"):
        (ws.path / "home" / folder).mkdir(exist_ok=True)
    proc = run_task(ws, work, private_cache)
    assert proc.returncode == 0, proc.stderr
    first, second = ws.runs()
    assert second.resumed_run_id == first.run_id and second.status == "completed"
    last = model_bodies(provider)[-1]
    assert FIRST in last and "## Previous attempt" in last
