"""The page in a real browser: Debian's chromium, driven by Playwright, against the server."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, Server, Workspace, alive, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"

# Each test reports its own skip with the reason (never in CI, where chromium is installed).
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="chromium is not installed: apt-get install chromium (CI installs it)",
)

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync"],
        )  # fmt: skip
        yield b
        b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    p = context.new_page()
    yield p
    context.close()


def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def start_from_form(page: Page, task: str, prompt: str) -> None:
    """Start task p/TASK the way a person does: the New task form."""
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", task)
    page.fill("textarea[name=prompt]", prompt)
    page.click("form#new-task button[type=submit]")


def test_watch_a_task_live_then_stop_it_from_the_page(
    ws: Workspace, server: Server, page: Page
) -> None:
    # An agent that prints a coloured line, then a line every 0.3 s for a minute.
    ws.write_config(
        ["--stderr", "\x1b[31mred warning\x1b[0m", "--lines", "200", "--interval", "0.3",
         "--line-text", "working on step"],
        max_restarts=0,
    )  # fmt: skip
    page.goto(server.url)
    expect(page.locator("#connection")).to_have_text("live")
    start_from_form(page, "t", "watch me")
    expect(page.locator("#task-title")).to_have_text("p/t")
    expect(page.locator("#task-status")).to_have_text("running")
    log = page.locator("#log")
    expect(log).to_contain_text("working on step 2")
    # New lines keep arriving while we watch: live, without reloading.
    expect(log).to_contain_text("working on step 5")
    shot(page, "running-task")
    page.click(".tabs button[data-file=stderr]")
    red = page.locator("#log span.fg-31")
    expect(red).to_have_text("red warning")  # ANSI colours are rendered, not shown raw
    page.click(".tabs button[data-file=stdout]")
    page.fill("#search", "step 3")
    expect(page.locator("#log .line:not(.hidden)")).to_have_count(1)
    page.fill("#search", "")
    pids = ws.agent_pids()
    page.click("#stop-button")
    expect(page.locator("#task-status")).to_have_text("stopped", timeout=20000)
    expect(page.locator("nav a[data-task='p/t'] .badge")).to_have_text("stopped")
    shot(page, "stopped-task")
    wait_for(lambda: not [p for p in pids if alive(p)], what="the agent to be gone")
    assert ws.runs()[0].status == "stopped"


def test_claude_stream_is_shown_readably_with_a_raw_toggle(
    ws: Workspace, server: Server, page: Page
) -> None:
    sample = REPO / "tests" / "samples" / "claude-tool.stdout.jsonl"
    ws.write_config(["--chunks", sample.read_bytes().hex()], max_restarts=0)
    page.goto(f"{server.url}/")
    start_from_form(page, "json", "use a tool")
    log = page.locator("#log")
    expect(log.locator(".ev-assistant").last).to_have_text("hello from fake model")
    expect(log.locator(".ev-tool").first).to_contain_text("Bash")
    expect(log).not_to_contain_text('"type":"assistant"')
    shot(page, "readable-stream")
    page.check("#raw-toggle")
    expect(log).to_contain_text('"type":"assistant"')


def test_the_page_shows_when_the_server_goes_away(
    ws: Workspace, server: Server, page: Page
) -> None:
    page.goto(server.url)
    expect(page.locator("#connection")).to_have_text("live")
    server.process.terminate()
    server.process.wait(15)
    expect(page.locator("#connection")).to_have_text(
        # EventSource retries on its own; the page says so instead of pretending to be live.
        re.compile("reconnecting…|disconnected"),
        timeout=15000,
    )
    shot(page, "disconnected")


def test_schedules_show_their_next_firing_and_run_now_from_the_page(
    ws: Workspace, page: Page
) -> None:
    import subprocess

    import yaml

    from tests.conftest import free_port

    config = yaml.safe_load(ws.write_config(["--lines", "2"], max_restarts=0).read_text())
    config["schedules"] = {
        "nightly": {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "project": "p",
                    "prompt": "nightly tidy"}
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    port = free_port()
    server = subprocess.Popen(
        ws.cli_argv("serve", "--port", str(port), "--config", str(ws.config), "--no-schedules"),
        cwd=ws.path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), what="the server")
        page.goto(url)
        item = page.locator("#schedule-list li[data-schedule=nightly]")
        expect(item).to_contain_text("0 3 * * * Europe/Berlin")
        expect(item).to_contain_text("T03:00:00+01:00")  # the next firing, in its zone
        expect(item).to_contain_text("not fired yet")
        item.locator("button").click()
        expect(page.locator("#task-title")).to_contain_text("p/nightly-")
        expect(page.locator("#task-status")).to_have_text("completed", timeout=20000)
        expect(item).to_contain_text("completed", timeout=40000)
        shot(page, "schedules")
    finally:
        server.terminate()
        server.wait(15)


def _answers(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/api/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_auto_scroll_pauses_when_the_reader_scrolls_up(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "400", "--interval", "0.02", "--line-text", "row"], max_restarts=0)
    page.goto(server.url)
    start_from_form(page, "scroll", "print a lot")
    log = page.locator("#log")
    expect(log).to_contain_text("row 80")
    at_bottom = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 40"
    assert log.evaluate(at_bottom)  # following the tail
    log.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    expect(log).to_contain_text("row 200")  # lines keep arriving...
    assert log.evaluate("el => el.scrollTop") == 0  # ...but the reader stays where they were
    follow = page.locator("#follow-button")
    expect(follow).to_be_visible()
    follow.click()
    expect(follow).to_be_hidden()
    assert log.evaluate(at_bottom)
    expect(page.locator("#task-status")).to_have_text("completed", timeout=30000)


def test_a_completed_task_runs_again_from_the_page_only_by_its_own_button(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "1"], max_restarts=0)
    page.goto(server.url)
    start_from_form(page, "done", "finish at once")
    expect(page.locator("#task-status")).to_have_text("completed", timeout=20000)
    button = page.locator("#resume-button")
    expect(button).to_have_text("Run again")  # not a Resume that silently refuses or reruns
    expect(button).to_be_enabled()
    button.click()
    wait_for(lambda: len(ws.runs("p", "done")) == 2, what="the second run")
    expect(page.locator("#task-status")).to_have_text("completed", timeout=20000)
    assert [r.attempt for r in ws.runs("p", "done")] == [1, 2]


def test_an_issue_run_shows_its_issue_branch_commits_and_marker(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.gitrepo import GIT_ENV, make_repo

    repo = make_repo(ws.path / "repo")
    ws.write_config(["--commit", "fix the parser", "--ready-from", "1"], env=GIT_ENV)
    proc = ws.cli(
        "-p", "p", "--issue", "12", "--repo", str(repo), "--issue-url",
        "https://example.invalid/issues/12", "fix it", env=GIT_ENV,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    page.goto(f"{server.url}/")
    page.click("[data-task='p/issue-12']")
    git = page.locator("#task-git")
    expect(git).to_be_visible()
    expect(git.locator("#git-issue a")).to_have_text("issue #12")
    expect(git.locator("#git-issue a")).to_have_attribute(
        "href", "https://example.invalid/issues/12"
    )
    expect(git.locator("#git-branch")).to_have_text("run-agent/p/issue-12")
    expect(git.locator("#git-marker")).to_have_text("ready marker seen")
    expect(git.locator("#git-commits li")).to_have_count(2)
    expect(git.locator("#git-commits li").last).to_contain_text("fix the parser")
    shot(page, "issue-run")


def test_an_agent_modes_approval_is_answered_from_the_page(
    ws: Workspace, server: Server, page: Page
) -> None:
    """Agent mode against the fake chat-completions provider: the model asks for `rm -r build`,
    the unattended run waits (approvals: wait), a person approves it on the page."""
    from tests.fake_models import FakeModelServer
    from tests.test_agent_mode import configure, done, ops

    work = ws.path / "work"
    (work / "build").mkdir(parents=True)
    with FakeModelServer(scenario="script") as provider:
        provider.replies = [
            ops({"type": "shell", "id": "clean", "command": "rm -r build"}),
            done("cleaned"),
        ]
        configure(ws, provider, ops_section={"approvals": "wait"})
        proc = ws.start_cli("--project", "p", "--task", "t", "--cwd", str(work), "clean up")
        try:
            page.goto(server.url)
            asked = page.locator("#approvals .approval[data-operation=clean]")
            expect(asked).to_contain_text("rm -r build", timeout=20000)
            expect(asked.locator(".why")).not_to_be_empty()  # the rule that fired, and why
            shot(page, "approval-pending")
            assert (work / "build").is_dir()  # nothing ran before the answer
            asked.locator("button.approve").click()
            expect(page.locator("#approvals")).to_be_hidden(timeout=20000)
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not (work / "build").exists()
    assert ws.task().run(ws.runs()[0].run_id).output.read_text().startswith("cleaned")
