"""The page in a real browser: Debian's chromium, driven by Playwright, against the server."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from runagent.store.host import this_host
from runagent.store.runfolder import supervisor_log_path
from tests.conftest import (
    REPO,
    TEST_DEFAULTS,
    Server,
    Workspace,
    alive,
    free_port,
    serving,
    wait_for,
)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = REPO / "test-artifacts"

# Each test reports its own skip with the reason (never in CI, where chromium is installed).
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="chromium is not installed: apt-get install chromium (CI installs it)",
)

from playwright.sync_api import (  # noqa: E402
    APIResponse,
    Browser,
    Page,
    Route,
    expect,
    sync_playwright,
)

# What the page shows follows a real agent and server: on a loaded machine (parallel workers on
# 2 cores) they take longer than the 5 s an expectation waits by default. A longer wait only
# lets a slow pass pass; a wrong page still fails, later.
expect.set_options(timeout=60_000)


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


@pytest.fixture
def shells(ws: Workspace) -> Iterator[list[subprocess.Popen[str]]]:
    """Commands a test starts as a shell would (`ws.start_cli`): whatever a failing test left
    running is killed, process group and all, before the workspace checks for leftovers."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def start_from_form(page: Page, task: str, prompt: str, **fields: str) -> None:
    """Start task p/TASK the way a person does: the New task form (and its other `fields`)."""
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", task)
    for name, value in fields.items():
        page.fill(f"input[name={name}]", value)
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
    # Search once stdout is shown again, as a person would: on a busy machine the tab takes a
    # moment to come back (a search typed before it stayed at "no match" in a parallel run).
    expect(log).to_contain_text("working on step 3")
    page.fill("#search", "step 3")
    expect(page.locator("#search-count")).to_have_text("1 of 1")  # counted, and marked
    expect(page.locator("#log .line.current-match mark")).to_have_text("step 3")
    page.fill("#search", "")
    pids = ws.agent_pids()
    page.click("#stop-button")
    expect(page.locator("#task-status")).to_have_text("stopped")
    expect(page.locator("nav a[data-task='p/t'] .badge")).to_have_text("stopped")
    shot(page, "stopped-task")
    wait_for(lambda: not [p for p in pids if alive(p)], what="the agent to be gone")
    assert ws.runs()[0].status == "stopped"


def test_the_page_runs_as_es_modules_with_no_console_error(
    ws: Workspace, server: Server, page: Page
) -> None:
    """The browser loads the page's modules itself (no build step): every module in static/ is
    fetched, and the task list, a task's log, the search and the start form work with nothing
    said on the console (a missing export or a module served as the wrong type is an error)."""
    said: list[str] = []
    page.on("console", lambda m: said.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: said.append(str(e)))
    fetched: set[str] = set()
    page.on(
        "request", lambda r: fetched.add(r.url.rsplit("/", 1)[1]) if r.url.endswith(".js") else None
    )
    ws.write_config(["--lines", "3", "--line-text", "said"], max_restarts=0)
    assert ws.cli("--project", "p", "--task", "t", "say three lines").returncode == 0
    page.goto(server.url)
    expect(page.locator("#connection")).to_have_text("live")
    page.click("#tasks a[data-task='p/t']")
    expect(page.locator("#log")).to_contain_text("said 3")
    page.fill("#search", "said 2")
    expect(page.locator("#search-count")).to_have_text("1 of 1")
    page.click("#new-task-button")
    expect(page.locator("#new-task")).to_be_visible()
    expect(page.locator("#agent-choice option").first).to_contain_text("config default (")
    assert said == []
    assert fetched == {p.name for p in (REPO / "server" / "static").glob("*.js")}


def replay(ws: Workspace, backend: str, sample: str, exit_code: int = 0) -> None:
    """A config whose agent is of type `backend` and writes tests/samples/SAMPLE as its stdout:
    the page reads its runs as that backend says its lines read."""
    import yaml

    chunks = (REPO / "tests" / "samples" / sample).read_bytes().hex()
    argv = ws.agent_argv(["--ignore-unknown", "--chunks", chunks, "--exit", str(exit_code)])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"replay": {"type": backend, "permissions": "none", "command": argv}},
        "defaults": {"agent": "replay", **TEST_DEFAULTS, "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip


def test_claude_stream_is_shown_readably_with_a_raw_toggle(
    ws: Workspace, server: Server, page: Page
) -> None:
    replay(ws, "claude", "claude-tool.stdout.jsonl")
    page.goto(f"{server.url}/")
    start_from_form(page, "json", "use a tool")
    log = page.locator("#log")
    expect(log.locator(".ev-assistant").last).to_have_text("hello from fake model")
    expect(log.locator(".ev-tool").first).to_contain_text("Bash")
    expect(log).not_to_contain_text('"type":"assistant"')
    shot(page, "readable-stream")
    page.check("#raw-toggle")
    expect(log).to_contain_text('"type":"assistant"')


TOOL = "echo 'hello from fake tool' > fake_tool_output.txt"
CALL = f'{{"command":"{TOOL}","description":"Write fake tool output file"}}'
# Each agent's stream of a tool call, line by line, as the page showed it before its backend was
# the one to say how its lines read: the parts of each line, (kind, text).
READ = {
    "claude": [
        [("meta", "system init claude-opus-5-5")],
        [("tool", f"⚙ Bash {CALL}")],
        [("tool", "↳ (Bash completed with no output)")],
        [("assistant", "hello from fake model")],
        [("result", "result: hello from fake model")],
    ],
    "codex": [
        [("meta", "thread.started")],
        [("meta", "turn.started")],
        [("tool", f'⚙ /bin/bash -lc "{TOOL}" ')],
        [("tool", f'⚙ /bin/bash -lc "{TOOL}" 0')],
        [("assistant", "hello from fake model")],
        [("meta", "turn.completed")],
    ],
    "gemini": [
        [("meta", "init")],
        [("meta", "user: Say hello, then write fake_tool_output.txt.")],
        [("tool", f"⚙ run_shell_command {CALL}")],
        [("tool", "↳ success ")],
        [("assistant", "hello from fake model")],
        [("result", "result: success ")],
    ],
}


def shown_parts(page: Page) -> list[list[tuple[str, str]]]:
    """Each row of the log: its parts, (kind, text)."""
    rows = page.evaluate(
        """() => [...document.querySelectorAll("#log .line .text")].map((t) =>
             [...t.querySelectorAll("span")].map((s) => [s.className.replace("ev-", ""),
                                                          s.textContent]))"""
    )
    return [[(kind, text) for kind, text in row] for row in rows]


@pytest.mark.parametrize("backend", sorted(READ))
def test_each_agents_stream_reads_as_its_backend_says(
    ws: Workspace, server: Server, page: Page, backend: str
) -> None:
    replay(ws, backend, f"{backend}-tool.stdout.jsonl")
    assert ws.cli("-p", "p", "-t", "read", "use a tool").returncode == 0
    page.goto(f"{server.url}/#p/read")
    expect(page.locator("#log .line")).to_have_count(len(READ[backend]))
    expect(page.locator("#log .ev-assistant")).to_have_text("hello from fake model")
    assert shown_parts(page) == READ[backend]


def test_a_stream_whose_backend_states_no_rules_reads_as_written(
    ws: Workspace, server: Server, page: Page
) -> None:
    """The page knows no agent's events by itself: claude's, codex's and gemini's, written by a
    `command` agent, whose backend says nothing of its lines, are shown as the agent wrote them."""
    lines = [
        line
        for backend in sorted(READ)
        for line in (REPO / "tests" / "samples" / f"{backend}-tool.stdout.jsonl")
        .read_text()
        .splitlines()
    ]
    ws.write_config(["--chunks", "".join(f"{line}\n" for line in lines).encode().hex()])
    assert ws.cli("-p", "p", "-t", "untold", "go").returncode == 0
    page.goto(f"{server.url}/#p/untold")
    expect(page.locator("#log .line")).to_have_count(len(lines))
    assert page.locator("#log [class^=ev-]").count() == 0
    assert [row[0][1] for row in shown_parts(page)] == lines


PARROT = """
from runagent.backend import Backend, LaunchSpec


class Parrot(Backend):
    name = "parrot"
    lines = (
        {"when": {"kind": "said"}, "show": [("assistant", "{words}")]},
        {"when": {"kind": "ran"}, "show": [("tool", "⚙ {tool.called} {tool.with}")]},
        {"when": {"kind": "broke"}, "show": [("error", "broke: {why|how}")]},
    )

    def launch(self, ctx):
        env = self.environment(ctx)
        return LaunchSpec(tuple(self.config.command), env, ctx.working_dir, ctx.prompt_file)
"""


def test_a_new_backends_lines_read_as_its_own_rules_say(ws: Workspace, page: Page) -> None:
    """A backend of another package, whose agent's events are its own: the page reads them by
    the rules its class states, and opens the failed run at the event they call an error."""
    import yaml

    plugins = ws.path / "plugins"
    (plugins / "parrot_backend-1.0.dist-info").mkdir(parents=True)
    (plugins / "parrot_backend.py").write_text(PARROT)
    (plugins / "parrot_backend-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: parrot-backend\nVersion: 1.0\n"
    )
    (plugins / "parrot_backend-1.0.dist-info" / "entry_points.txt").write_text(
        "[runagent.backends]\nparrot = parrot_backend:Parrot\n"
    )
    env = {"PYTHONPATH": os.pathsep.join([str(plugins), os.environ.get("PYTHONPATH", "")])}
    stream = [
        {"kind": "said", "words": "hello in my own words"},
        {"kind": "ran", "tool": {"called": "grep", "with": ["-r", "seed"]}},
        {"kind": "broke", "how": "out of seeds"},
        {"kind": "unheard of"},
    ]
    text = "".join(json.dumps(event) + "\n" for event in stream) + "a plain line\n"
    argv = ws.agent_argv(["--chunks", text.encode().hex(), "--exit", "1"])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"parrot": {"type": "parrot", "command": argv}},
        "defaults": {"agent": "parrot", **TEST_DEFAULTS, "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip
    assert ws.cli("-p", "p", "-t", "parrot", "talk", env=env).returncode == 1
    with serving(ws, env) as url:
        page.goto(f"{url}/#p/parrot")
        log = page.locator("#log")
        expect(log.locator(".ev-assistant")).to_have_text("hello in my own words")
        expect(page.locator("#log .line.failure")).to_contain_text("broke: out of seeds")
        assert shown_parts(page) == [
            [("assistant", "hello in my own words")],
            [("tool", '⚙ grep ["-r","seed"]')],
            [("error", "broke: out of seeds")],
            [("", '{"kind": "unheard of"}')],  # a line no rule reads: as written
            [("", "a plain line")],
        ]
        page.check("#raw-toggle")
        expect(log).to_contain_text('{"kind": "said", "words": "hello in my own words"}')


def test_the_page_shows_when_the_server_goes_away(
    ws: Workspace, server: Server, page: Page
) -> None:
    page.goto(server.url)
    expect(page.locator("#connection")).to_have_text("live")
    server.process.terminate()
    server.process.wait(60)
    expect(page.locator("#connection")).to_have_text(
        # EventSource retries on its own; the page says so instead of pretending to be live.
        re.compile("reconnecting…|disconnected"),
        timeout=15000,
    )
    shot(page, "disconnected")


def test_schedules_show_their_next_firing_and_run_now_from_the_page(
    ws: Workspace, page: Page
) -> None:

    import yaml

    config = yaml.safe_load(ws.write_config(["--lines", "2"], max_restarts=0).read_text())
    config["schedules"] = {
        "nightly": {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "project": "p",
                    "prompt": "nightly tidy"}
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    with own_server(ws) as url:
        page.goto(url)
        item = page.locator("#schedule-list li[data-schedule=nightly]")
        expect(item).to_contain_text("0 3 * * * Europe/Berlin")
        expect(item).to_contain_text("T03:00:00+01:00")  # the next firing, in its zone
        expect(item).to_contain_text("not fired yet")
        item.locator("button").click()
        expect(page.locator("#task-title")).to_contain_text("p/nightly-")
        expect(page.locator("#task-status")).to_have_text("completed")
        expect(item).to_contain_text("completed")
        shot(page, "schedules")


@contextlib.contextmanager
def own_server(ws: Workspace) -> Iterator[str]:
    """`run-agent serve` of the workspace's config as it is now (schedules not fired): its URL."""
    port = free_port()
    server = subprocess.Popen(
        ws.cli_argv("serve", "--port", str(port), "--config", str(ws.config), "--no-schedules"),
        cwd=ws.path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _answers(url), what="the server")
        yield url
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
    go, on = ws.path / "go", ws.path / "on"
    # The agent holds after row 80 until the reader has scrolled up: however slow the page or
    # the agent, row 80 is then the last row, and every row after it comes while scrolled up.
    # It holds again after row 200, so the rows on screen can be watched as rows 201 to 400 come.
    ws.write_config(["--lines", "400", "--interval", "0.02", "--line-text", "row",
                     "--hold-at", "80", "--hold-for", str(go),
                     "--hold-at", "200", "--hold-for", str(on)], max_restarts=0)  # fmt: skip
    page.goto(server.url)
    start_from_form(page, "scroll", "print a lot")
    log = page.locator("#log")
    expect(log).to_contain_text("row 80")
    at_bottom = "el => el.scrollHeight - el.scrollTop - el.clientHeight < 40"
    # following the tail (the page scrolls once it has drawn: waited for, on a loaded machine)
    wait_for(lambda: log.evaluate(at_bottom), timeout=30, what="the log at its tail")
    log.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    go.touch()
    # Lines keep arriving (the log grows by a row each; only the rows on screen are drawn)...
    height = "el => el.querySelector('.sizer').offsetHeight"
    wait_for(lambda: log.evaluate(height) >= 200 * 17, timeout=60, what="rows to 200")
    assert log.evaluate("el => el.scrollTop") == 0  # ...but the reader stays where they were
    # ...and the rows on screen are left as they are: a line arriving below them only makes the
    # log taller (rebuilding them for each line kept a loaded machine's page busy for 30 s).
    log.evaluate("""el => {
        window.rebuilt = 0;
        new MutationObserver(() => { window.rebuilt += 1; })
            .observe(el.querySelector('.rows'), { childList: true });
    }""")
    on.touch()
    wait_for(lambda: log.evaluate(height) >= 400 * 17, timeout=60, what="rows to 400")
    expect(page.locator("#task-status")).to_have_text("completed")
    assert page.evaluate("window.rebuilt") == 0
    assert log.evaluate("el => el.scrollTop") == 0
    follow = page.locator("#follow-button")
    expect(follow).to_be_visible()
    follow.click()
    expect(follow).to_be_hidden()
    wait_for(lambda: log.evaluate(at_bottom), timeout=30, what="the log back at its tail")
    expect(log).to_contain_text("row 400")


def test_the_task_list_shows_what_a_queued_or_blocked_task_waits_for(
    ws: Workspace, server: Server, page: Page, shells: list[subprocess.Popen[str]]
) -> None:
    import yaml

    ws.write_config(["--lines", "1", "--wait-in-task", "go", "--ignore-unknown"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["type"] = "codex"  # an agent that reports usage: it may have a budget
    data["limits"] = {"max_running": 1}
    ws.config.write_text(yaml.safe_dump(data))
    first = ws.start_cli("job", "-p", "p", "-t", "a", "first")
    shells.append(first)
    wait_for(lambda: ws.agent_pids(), what="a's agent")  # a holds the one slot
    second = ws.start_cli("job", "-p", "p", "-t", "b", "second")
    shells.append(second)
    third = ws.start_cli("job", "-p", "p", "-t", "c", "--after", "p/a", "third")
    shells.append(third)
    page.goto(server.url)
    b = page.locator("nav a[data-task='p/b'] .badge")
    expect(b).to_have_text("queued")
    expect(b).to_have_attribute("title", "max_running 1")
    c = page.locator("nav a[data-task='p/c'] .badge")
    expect(c).to_have_text("blocked")
    expect(c).to_have_attribute("title", "waits for p/a")
    # The form starts a task that waits for another, with a place and a budget of its own.
    with page.expect_request(lambda r: r.method == "POST" and "/tasks" in r.url) as sent:
        start_from_form(page, "d", "fourth", after="p/c", priority="2",
                        budget="2usd, 300k-tokens")  # fmt: skip
    body = json.loads(sent.value.post_data or "{}")
    assert body["after"] == "p/c" and body["priority"] == "2", body
    d = page.locator("nav a[data-task='p/d'] .badge")
    expect(d).to_have_text("blocked")
    expect(d).to_have_attribute("title", "waits for p/c")
    for task in ("a", "b", "c"):
        folder = ws.task("p", task).folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "go").touch()
    assert first.wait(60) == 0 and second.wait(60) == 0 and third.wait(60) == 0
    expect(b).to_have_text("completed")
    expect(c).to_have_text("completed")
    ws.task("p", "d").folder.joinpath("go").touch()
    expect(d).to_have_text("completed", timeout=60000)
    remembered = yaml.safe_load((ws.task("p", "d").folder / "task.yaml").read_text())
    assert remembered["budget"] == ["2usd", "300000tokens"]
    # A run whose start waited says for how long; one that went at once says nothing of it.
    page.locator("nav a[data-task='p/b']").click()
    expect(page.locator("#run-header dd[data-field=queued]")).to_contain_text(
        "in the queue before its loop began"
    )
    page.locator("nav a[data-task='p/a']").click()
    expect(page.locator("#run-header dd[data-field=agent]")).to_contain_text("fake")
    expect(page.locator("#run-header dd[data-field=queued]")).to_have_count(0)


def test_the_page_opens_on_the_fleet_live_with_what_needs_a_person(
    ws: Workspace, server: Server, page: Page, shells: list[subprocess.Popen[str]]
) -> None:
    import yaml

    ws.write_config(["--lines", "1", "--wait-in-task", "go"], max_restarts=0)
    data = yaml.safe_load(ws.config.read_text())
    data["limits"] = {"projects": {"p": 1}}
    data["budgets"] = {"daily": {"usd": 5}}
    data["agents"]["spender"] = {"type": "claude", "command": ws.agent_argv(
        ["--ignore-unknown", "--claude-result", "0.3", "--exit", "1"])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))
    spent = ws.cli("-p", "q", "-t", "x", "--agent", "spender", "--budget", "0.2usd", "go")
    assert spent.returncode == 4, spent.stderr
    first = ws.start_cli("job", "-p", "p", "-t", "a", "first")
    shells.append(first)
    wait_for(lambda: len(ws.agent_pids()) == 2, what="a's agent")  # a holds p's one slot
    wait_for(lambda: any("line 1" in p.read_text() for p in
                         ws.task("p", "a").folder.glob("runs/*/agent-stdout.txt")),
             what="a's first line")  # fmt: skip
    second = ws.start_cli("job", "-p", "p", "-t", "b", "second")
    shells.append(second)

    def queued(task: str) -> bool:
        rows = json.loads(ws.cli("list", "--json").stdout)
        return any(r["task_id"] == task and r["status"] == "queued" for r in rows)

    wait_for(lambda: queued("b"), what="b queued")  # c may only name a task that exists
    third = ws.start_cli("job", "-p", "p", "-t", "c", "--after", "p/b", "third")
    shells.append(third)
    page.goto(server.url)
    fleet = page.locator("#fleet")
    expect(fleet).to_be_visible()

    def count(name: str) -> object:
        return page.locator(f"#fleet-counts li[data-count={name}] strong")

    expect(count("running")).to_have_text("1")
    expect(count("queued")).to_have_text("1")
    expect(count("blocked")).to_have_text("1")
    expect(count("needs_person")).to_have_text("1")
    running = page.locator("#fleet-running li[data-task='p/a']")
    expect(running).to_contain_text("fake · attempt 1 · ")
    expect(running.locator(".last-line")).to_have_text("line 1")
    expect(page.locator("#fleet-queue li")).to_have_count(2)
    expect(page.locator("#fleet-queue li").nth(0)).to_contain_text("p/b")
    expect(page.locator("#fleet-queue li").nth(0)).to_contain_text("project p's limit of 1")
    expect(page.locator("#fleet-queue li").nth(1)).to_contain_text("waits for p/b")
    expect(page.locator("#fleet-limits")).to_have_text("limits: project p 1")
    root_day = page.locator("#fleet-spent tr[data-what='the runs root today']")
    expect(root_day).to_contain_text("$0.30")
    expect(root_day).to_contain_text("$5.00")
    need = page.locator("#fleet-needs li[data-task='q/x']")
    expect(need).to_contain_text("budget: $0.30 of $0.20 per task")
    expect(need.locator("code")).to_have_text(
        "run-agent resume -p q -t x --budget AMOUNT (a larger one)")  # fmt: skip
    shot(page, "fleet")
    # Its action: resume with a larger budget. It runs once more (and fails: no restarts left),
    # no longer stopped by a budget, so nobody is needed any more; the day's spend follows.
    need.locator("input[name=budget]").fill("1usd")
    need.locator("button[type=submit]").click()
    expect(count("needs_person")).to_have_text("0")
    expect(root_day).to_contain_text("$0.60")
    # A task's view names what it waits for and the tasks that wait on it.
    page.locator("#fleet-queue a[data-task='p/b']").click()
    expect(page.locator("#task-waits .waits-for")).to_contain_text("queued: project p's limit")
    expect(page.locator("#task-waits .waited-on-by")).to_have_text("waited on by p/c")
    page.locator("#task-waits .waited-on-by a").click()
    expect(page.locator("#task-title")).to_have_text("p/c")
    expect(page.locator("#task-waits .waits-for")).to_contain_text("blocked: waits for p/b")
    page.click("#home-link")
    for task in ("a", "b", "c"):
        folder = ws.task("p", task).folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "go").touch()
    assert first.wait(60) == 0 and second.wait(60) == 0 and third.wait(60) == 0
    expect(count("running")).to_have_text("0")  # live: no reload
    expect(count("queued")).to_have_text("0")
    expect(count("blocked")).to_have_text("0")
    expect(page.locator("#fleet-queue-empty")).to_be_visible()


def test_a_tokens_page_offers_only_what_the_token_may_do(
    ws: Workspace, server: Server, page: Page
) -> None:
    """A read token's page shows the runs and no action (New task, Stop, Resume, Delete, the
    steer box: each would be refused with 403), and says why; an operate token's page acts,
    but offers no Delete, which needs admin."""
    from runagent.store import tokens

    ws.write_config(["--exit", "1"], max_restarts=0)
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 1
    reader, _ = tokens.create(ws.root, tokens.Scope.READ)
    operator, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["p"])
    page.goto(f"{server.url}/?key={reader}")
    expect(page.locator("#access-note")).to_contain_text("read-only access")
    expect(page.locator("#new-task-button")).to_be_hidden()
    page.goto(f"{server.url}/#p/t")
    expect(page.locator("#task-status")).to_have_text("failed")
    for hidden in ("#stop-button", "#resume-button", "#delete-button", "#steer-form"):
        expect(page.locator(hidden)).to_be_hidden()
    page.context.clear_cookies()
    page.goto(f"{server.url}/?key={operator}")
    expect(page.locator("#access-note")).to_have_text(
        "operate access (projects p): deleting needs an admin token")  # fmt: skip
    page.goto(f"{server.url}/#p/t")
    expect(page.locator("#task-status")).to_have_text("failed")
    expect(page.locator("#resume-button")).to_be_visible()
    expect(page.locator("#new-task-button")).to_be_visible()
    expect(page.locator("#delete-button")).to_be_hidden()


def test_a_queued_task_leaves_the_queue_from_its_own_view(
    ws: Workspace, server: Server, page: Page
) -> None:
    """Its Stop reads "Leave the queue" and works (it was disabled, and Resume answered 409
    naming a command); then it reads stopped, not pending, and says it never started."""
    from runagent.service import StartRequest
    from tests.fleet.test_queue import configure, go, keepers, listed, running, service

    configure(ws, {"max_running": 1})
    door = service(ws)
    door.start(StartRequest(ws.task("p", "a"), "go"))
    wait_for(lambda: running(ws, "a"), what="a running")
    door.start(StartRequest(ws.task("p", "b"), "go"))
    try:
        page.goto(f"{server.url}/#p/b")
        expect(page.locator("#task-status")).to_have_text("queued")
        expect(page.locator("#resume-button")).to_be_disabled()
        leave = page.locator("#stop-button")
        expect(leave).to_have_text("Leave the queue")
        leave.click()
        expect(page.locator("#task-status")).to_have_text("stopped")
        expect(page.locator("#stop-button")).to_be_disabled()
        assert listed(ws)["p/b"]["status"] == "stopped"
        said = ws.cli("status", "-p", "p", "-t", "b")
        assert "p/b: stopped (0 runs)" in said.stdout, said.stdout
        assert "stopped before it started" in said.stdout
    finally:
        go(ws, "a")
        wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", what="a to complete")
        wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_the_fleet_and_the_task_show_a_queue_record_that_cannot_be_read(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.fleet.test_queue import damage, go, keepers, listed, one_detached_waits

    one_detached_waits(ws)  # p/a runs, p/b waits for its slot
    damage(ws, "b", "truncated JSON")
    page.goto(server.url)
    expect(page.locator("#fleet-counts li[data-count=unreadable] strong")).to_have_text("1")
    row = page.locator("#fleet-queue li[data-task='p/b']")
    expect(row.locator(".badge")).to_have_text("unreadable")
    expect(row).to_contain_text("its queue record cannot be read: not JSON")
    row.locator("a[data-task='p/b']").click()
    expect(page.locator("#task-status")).to_have_text("unreadable")
    expect(page.locator("#task-waits .waits-for")).to_contain_text(
        "unreadable: its queue record cannot be read: not JSON"
    )
    expect(page.locator("#task-waits .waits-for")).to_contain_text("run-agent resume -p p -t b")
    go(ws, "a")
    wait_for(lambda: listed(ws)["p/a"]["status"] == "completed", timeout=60, what="a")
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_the_fleet_shows_a_paused_agent_and_lifts_its_pause(
    ws: Workspace, server: Server, page: Page
) -> None:
    from runagent.fleet import gate
    from runagent.fleet.queue import Fleet

    pause = gate.pause(ws.task("p", "x"), "claude", 600, "rate limited (five_hour limit reached)")
    page.goto(server.url)
    row = page.locator("#fleet-paused li[data-agent='claude']")
    expect(row.locator(".message")).to_have_text(pause.words())
    shot(page, "fleet-paused")
    row.get_by_role("button", name="unpause").click()
    expect(page.locator("#fleet-paused-box")).to_be_hidden()
    assert "claude" not in Fleet(ws.root).pauses(clean=False)


def test_a_completed_task_runs_again_from_the_page_only_by_its_own_button(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "1"], max_restarts=0)
    page.goto(server.url)
    start_from_form(page, "done", "finish at once")
    expect(page.locator("#task-status")).to_have_text("completed")
    button = page.locator("#resume-button")
    expect(button).to_have_text("Run again")  # not a Resume that silently refuses or reruns
    expect(button).to_be_enabled()
    button.click()
    wait_for(lambda: len(ws.runs("p", "done")) == 2, what="the second run")
    expect(page.locator("#task-status")).to_have_text("completed")
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
    from tests.backends.test_agent_mode import configure, done, ops
    from tests.fake_models import FakeModelServer

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
            expect(asked).to_contain_text("rm -r build")
            expect(asked.locator(".why")).not_to_be_empty()  # the rule that fired, and why
            shot(page, "approval-pending")
            assert (work / "build").is_dir()  # nothing ran before the answer
            asked.locator("button.approve").click()
            expect(page.locator("#approvals")).to_be_hidden()
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not (work / "build").exists()
    assert ws.task().run(ws.runs()[0].run_id).output.read_text().startswith("cleaned")


def test_an_operations_run_awaiting_approval_shows_so_with_a_link_to_answer_it(
    ws: Workspace, server: Server, page: Page
) -> None:
    import json

    (ws.path / "project" / "victim").mkdir(parents=True)  # `rm -r` of it awaits approval
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "shell", "id": "clean", "command": "rm -r victim"}]}  # fmt: skip
    paused = ws.cli("ops", "apply", "-", "-w", "project", input=json.dumps(message))
    assert paused.returncode == 0 and "awaiting_approval" in paused.stdout, paused.stderr
    page.goto(server.url)
    row = page.locator("nav a[data-task='ops/ops']")
    expect(row.locator(".badge")).to_have_text("awaiting approval")
    page.select_option("#status-filter", "awaiting_approval")
    expect(page.locator("nav a[data-task]")).to_have_count(1)
    row.click()
    expect(page.locator("#task-status")).to_have_text("awaiting approval")
    waiting = page.locator("#task-approvals")
    expect(waiting).to_contain_text("rm -r victim")
    expect(waiting).to_contain_text("operation clean")
    waiting.locator("a", has_text="approve or deny").click()
    approve = page.locator("#approvals .approval[data-operation=clean] button.approve")
    expect(approve).to_be_focused()
    expect(page).to_have_url(re.compile("#ops/ops$"))  # the link leaves the address alone
    shot(page, "ops-awaiting-approval")
    approve.click()
    expect(page.locator("#approvals")).to_be_hidden()
    expect(page.locator("#task-approvals")).to_be_hidden()
    expect(page.locator("#task-status")).not_to_have_text("awaiting approval")
    page.select_option("#status-filter", "")
    expect(row.locator(".badge")).not_to_have_text("awaiting approval")
    # the approved `rm` runs once the answer is recorded, which the page may show first
    victim = ws.path / "project" / "victim"
    wait_for(lambda: not victim.exists(), 30, "the approved rm -r victim")


def shots(page: Page, name: str) -> None:
    """Screenshots of the view at 1400 px and at 420 px wide (a phone)."""
    for width in (1400, 420):
        page.set_viewport_size({"width": width, "height": 900})
        shot(page, f"{name}-{width}")
    page.set_viewport_size({"width": 1280, "height": 800})


def test_a_person_steers_a_running_task_from_the_box_under_the_log(
    ws: Workspace, server: Server, page: Page
) -> None:
    """The box under the log sends a message with "now": the running attempt ends for it (no
    failure counted), the next starts with it, and the timeline marks it."""
    shell = '[ "$(cat "$TASK_FOLDER/fake-attempts")" -gt 1 ] || sleep 60'
    ws.write_config(["--fail-first", "1", "--lines", "1", "--shell", shell], max_restarts=0)
    assert ws.cli("run", "-p", "p", "-t", "steer", "go", "--detach").returncode == 0
    wait_for(lambda: ws.runs("p", "steer") and ws.runs("p", "steer")[0].pid, 30, "attempt 1")
    page.goto(f"{server.url}/#p/steer")
    expect(page.locator("#steer-send")).to_have_text("Send to the next attempt")
    page.fill("#steer-text", "Look at the failing test first.")
    page.check("#steer-now")
    page.click("#steer-send")
    expect(page.locator("#steer-said")).to_contain_text("the current attempt ends")
    wait_for(lambda: ws.runs("p", "steer")[-1].status.value == "completed", 60, "attempt 2")
    first, second = ws.runs("p", "steer")
    assert first.reason is not None and first.reason.value == "steered"
    assert "Look at the failing test first." in (
        ws.task("p", "steer").run(second.run_id).prompt.read_text()
    )
    page.reload()
    mark = page.locator("#timeline .message-mark")
    expect(mark).to_have_count(1)
    expect(mark).to_have_attribute(
        "title", re.compile(r"message 1 \(now\) .* handed to attempt 2: Look at the failing")
    )
    expect(page.locator("#steer-send")).to_have_text("Run again with it")
    shots(page, "steer")


def test_a_failed_runs_header_says_why_and_it_opens_on_its_stderr(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "2", "--stderr", "Traceback: boom", "--exit", "1"], max_restarts=1)
    page.goto(server.url)
    start_from_form(page, "broken", "fail twice")
    expect(page.locator("#task-status")).to_have_text("failed")
    # How the loop ended, in the words the supervisor used, not in a tooltip.
    expect(page.locator("#task-summary")).to_contain_text(
        "gave up after 2 failed attempts (max_restarts 1)"
    )
    header = page.locator("#run-header")
    expect(header.locator("dd[data-field=status] .badge")).to_have_text("failed")
    expect(header.locator("dd[data-field='exit code']")).to_have_text("1")
    expect(header.locator("dd[data-field=why]")).to_have_text("exited with code 1")
    expect(header.locator("dd[data-field=attempt]")).to_have_text("2 of 2 · run 2 of 2")
    expect(header.locator("dd[data-field=agent]")).to_contain_text("fake (command)")
    expect(header.locator("dd[data-field=folder]")).to_have_text(str(ws.path))
    expect(header.locator("dd[data-field=host]")).to_have_text(this_host())  # who ran it
    expect(header.locator("dd[data-field=duration]")).not_to_have_text("—")
    expect(header.locator("dd[data-field='restart of']")).to_have_text(
        ws.runs("p", "broken")[0].run_id
    )
    # It opens where the failure is: the traceback on stderr, not the stdout tab.
    expect(page.locator(".tabs button.active")).to_have_text("stderr")
    expect(page.locator("#log")).to_contain_text("Traceback: boom")
    shots(page, "failed-run-header")


def test_a_check_is_asked_for_in_the_form_and_a_run_it_failed_opens_on_what_it_printed(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.server.test_server_check import failing_once

    ws.write_config(["--lines", "1"])
    page.goto(server.url)
    start_from_form(page, "checked", "pass the check", check=failing_once(ws))
    expect(page.locator("#task-status")).to_have_text("completed")
    first, second = ws.runs("p", "checked")
    page.goto(f"{server.url}/#p/checked/{first.run_id}")
    header = page.locator("#run-header")
    expect(header.locator("dd[data-field=why]")).to_contain_text("` failed: exited with code 1")
    expect(header.locator("dd[data-field=check]")).to_contain_text("· failed (exit 1) in ")
    expect(page.locator(".tabs button.active")).to_have_text("check")  # where it failed
    expect(page.locator("#log")).to_contain_text("check 1")
    page.goto(f"{server.url}/#p/checked/{second.run_id}")
    expect(header.locator("dd[data-field=check]")).to_contain_text("· passed in ")
    page.click(".tabs button[data-file=check]")
    expect(page.locator("#log")).to_contain_text("check 2")
    shots(page, "check-tab")


def test_an_address_the_reader_moved_to_is_not_rewritten_before_it_is_shown(
    ws: Workspace, server: Server, page: Page
) -> None:
    # The page writes the run and tab it chose into the address. A view finishing after the
    # reader moved, but before their hashchange routed (a loaded machine), wrote its address over
    # theirs, and the page then showed the latest run where the reader had asked for the first.
    ws.write_config(["--lines", "1", "--exit", "1"], max_restarts=1)
    assert ws.cli("--project", "p", "--task", "t", "fail twice").returncode != 0
    first, latest = ws.runs("p", "t")
    page.goto(f"{server.url}/#p/t")
    header = page.locator("#run-header")
    expect(header.locator("dd[data-field=status]")).to_contain_text(latest.run_id)
    # The reader's address, its hashchange still to come; then a view shown meanwhile (the
    # loop's log changed, so the task is read again).
    page.evaluate("(hash) => history.replaceState(null, '', hash)", f"#p/t/{first.run_id}")
    page.evaluate("document.querySelector('#run-header dd').dataset.old = '1'")
    with supervisor_log_path(ws.task("p", "t")).open("a") as said:
        said.write("a line that makes the page read the task again\n")
    page.wait_for_function("!document.querySelector('#run-header dd[data-old]')")
    assert page.evaluate("location.hash") == f"#p/t/{first.run_id}"
    page.evaluate("window.dispatchEvent(new HashChangeEvent('hashchange'))")
    expect(header.locator("dd[data-field=status]")).to_contain_text(first.run_id)


# Reads of one task's detail the page has begun and not yet parsed (a test's own count, so
# it can wait until the page has taken in an answer it was handed).
COUNT_TASK_READS = """
(() => {
  window.taskReads = 0;
  const counted = new WeakSet();
  const fetch = window.fetch;
  window.fetch = function (url, ...rest) {
    const mine = String(url).endsWith("/api/projects/p/tasks/t");
    if (mine) window.taskReads++;
    return fetch.call(this, url, ...rest).then((response) => {
      if (mine) counted.add(response);
      return response;
    }, (error) => { if (mine) window.taskReads--; throw error; });
  };
  const json = Response.prototype.json;
  Response.prototype.json = function () {
    const mine = counted.has(this);
    return json.call(this).finally(() => { if (mine) window.taskReads--; });
  };
})();
"""


def test_a_read_of_the_task_answered_late_does_not_undo_a_later_one(
    ws: Workspace, server: Server, page: Page
) -> None:
    # The server answers reads from a pool of threads; on a loaded machine an answer can come
    # seconds late, after a later read's. The page showed whichever came last: a task that had
    # failed read "running" again, with Stop enabled, until something else changed.
    release = ws.path / "release"
    ws.write_config(["--lines", "1", "--wait-for", str(release), "--exit", "1"], max_restarts=0)
    page.add_init_script(COUNT_TASK_READS)
    page.goto(server.url)
    start_from_form(page, "t", "fail when released")
    badge = page.locator("#run-header dd[data-field=status] .badge")
    expect(badge).to_have_text("running")
    held: list[tuple[Route, APIResponse]] = []

    # The next read is answered by the server now, while the task runs, and handed to the page
    # only once a later read has been shown.
    def hold(route: Route) -> None:
        if held:
            route.continue_()
        else:
            held.append((route, route.fetch()))

    page.route("**/api/projects/p/tasks/t", hold)
    with supervisor_log_path(ws.task("p", "t")).open("a") as said:
        said.write("a line that makes the page read the task again\n")
    # (Playwright hands a route over while it waits.)
    wait_for(lambda: page.wait_for_timeout(20) or held, what="the page to read the task")
    release.touch()
    expect(page.locator("#task-status")).to_have_text("failed")
    expect(badge).to_have_text("failed")
    route, answer = held[0]
    assert json.loads(answer.text())["status"] == "running"
    route.fulfill(response=answer)
    page.wait_for_function("window.taskReads === 0")
    assert badge.inner_text() == "failed"
    assert page.locator("#task-status").inner_text() == "failed"
    expect(page.locator("#stop-button")).to_be_disabled()


def test_a_failed_stream_opens_on_its_error_event(
    ws: Workspace, server: Server, page: Page
) -> None:
    replay(ws, "claude", "claude-error.stdout.jsonl", exit_code=1)
    page.goto(server.url)
    start_from_form(page, "api-error", "meet an API error")
    expect(page.locator("#task-status")).to_have_text("failed")
    expect(page.locator(".tabs button.active")).to_have_text("stdout")  # no stderr was written
    failure = page.locator("#log .line.failure")
    expect(failure).to_contain_text("API Error: 400")
    expect(failure).to_be_in_viewport()


def test_usage_of_each_run_and_of_the_task_is_shown(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "1", "--exit", "1"], max_restarts=1)
    assert ws.cli("--project", "p", "--task", "u", "spend tokens").returncode != 0
    for run_id, tokens in zip(ws.task("p", "u").run_ids(), (1200, 34), strict=True):
        path = ws.task("p", "u").run_folder(run_id) / "run-info.yaml"
        text = f"tokens_in: {tokens}\ntokens_out: 56\ncost_usd: 0.0125\n"
        path.write_text(path.read_text() + text)
    page.goto(f"{server.url}/#p/u")
    expect(page.locator("#run-header dd[data-field=usage]")).to_have_text(
        "34 tokens in, 56 out, $0.0125"
    )
    expect(page.locator("#task-summary")).to_contain_text(
        "all runs: 1,234 tokens in, 112 out, $0.0250"
    )
    expect(page.locator("#task-summary")).to_contain_text("on disk")


# The bars' widths and the first gap's, from one look at the page.
MEASURE = """t => [[...t.querySelectorAll('.bar')].map(e => e.getBoundingClientRect().width),
             (t.querySelector('.gap') || {getBoundingClientRect: () => ({width: 0})})
               .getBoundingClientRect().width]"""


def test_the_loop_is_a_timeline_of_its_attempts_that_can_be_clicked(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(
        ["--fail-first", "2", "--counter", "attempts", "--lines", "1"],
        max_restarts=3, restart_delay="400ms", restart_delay_max="400ms",
    )  # fmt: skip
    assert ws.cli("--project", "p", "--task", "loop", "third time lucky").returncode == 0
    first = ws.runs("p", "loop")[0]
    page.goto(f"{server.url}/#p/loop")
    bars = page.locator("#timeline .bar")
    expect(bars).to_have_count(3)  # one bar per run
    assert [b.get_attribute("class").split()[1] for b in bars.all()] == [
        "failed", "failed", "completed",
    ]  # fmt: skip
    expect(page.locator("#timeline .gap")).to_have_count(2)  # the waits between attempts
    expect(page.locator("#timeline .gap").first).to_have_attribute(
        "title", re.compile(r"waited .* before attempt 2")
    )
    # Measured in one step in the page: the timeline may be drawn again meanwhile (a live
    # update), and a handle taken before that would point at nothing.
    timeline = page.locator("#timeline")
    widths, gap = wait_for(lambda: (m := timeline.evaluate(MEASURE)) and m[1] > 0 and m, 10,
                           "the timeline laid out")  # fmt: skip
    assert gap > 0 and len(widths) == 3
    assert all(w >= 8 for w in widths)
    expect(bars.nth(2)).to_have_class(re.compile("selected"))  # the latest run is shown
    shots(page, "timeline")
    bars.first.click()
    expect(page).to_have_url(re.compile(f"#p/loop/{first.run_id}$"))
    expect(page.locator("#run-header dd[data-field=attempt]")).to_have_text("1 of 4 · run 1 of 3")
    expect(bars.first).to_have_class(re.compile("selected"))
    page.go_back()
    expect(page.locator("#run-header dd[data-field=attempt]")).to_have_text("3 of 4 · run 3 of 3")


def test_every_view_has_an_address_and_back_and_forward_move_between_them(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "3", "--line-text", "out", "--stderr", "err text"], max_restarts=0)
    for task in ("alpha", "beta"):
        assert ws.cli("--project", "p", "--task", task, f"prompt of {task}").returncode == 0
    (alpha,) = ws.runs("p", "alpha")
    page.goto(server.url)
    page.click("nav a[data-task='p/alpha']")
    expect(page).to_have_url(re.compile("#p/alpha$"))
    expect(page.locator("#log")).to_contain_text("out 3")
    page.click(".tabs button[data-file=stderr]")
    expect(page).to_have_url(re.compile(f"#p/alpha/{alpha.run_id}/stderr$"))
    expect(page.locator("#log")).to_have_text("err text")
    page.click("nav a[data-task='p/beta']")
    expect(page.locator("#task-title")).to_have_text("p/beta")
    page.go_back()
    expect(page.locator("#task-title")).to_have_text("p/alpha")
    expect(page.locator(".tabs button.active")).to_have_text("stderr")
    expect(page.locator("#log")).to_have_text("err text")
    page.go_back()
    expect(page.locator(".tabs button.active")).to_have_text("stdout")
    page.go_forward()
    expect(page.locator(".tabs button.active")).to_have_text("stderr")
    # A shared address opens the same view in a fresh page.
    fresh = page.context.new_page()
    fresh.goto(f"{server.url}/#p/alpha/{alpha.run_id}/prompt")
    expect(fresh.locator(".tabs button.active")).to_have_text("prompt")
    expect(fresh.locator("#log")).to_contain_text("prompt of alpha")
    fresh.close()
    # Cancel on the form goes back to where the reader was, not to an empty pane.
    page.click("#new-task-button")
    expect(page).to_have_url(re.compile("#new$"))
    page.click("#cancel-new")
    expect(page.locator("#task-title")).to_have_text("p/alpha")
    expect(page.locator("#task-view")).to_be_visible()


def test_the_sidebar_filters_by_words_and_status_and_collapses_when_narrow(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "2"], max_restarts=0)
    assert ws.cli("--project", "p", "--task", "good-one", "ok").returncode == 0
    assert ws.cli("--project", "p", "--task", "good-two", "ok").returncode == 0
    ws.write_config(["--lines", "2", "--exit", "1"], max_restarts=0)
    assert ws.cli("--project", "q", "--task", "bad-one", "fail").returncode != 0
    page.goto(server.url)
    links = page.locator("nav a[data-task]")
    expect(links).to_have_count(3)
    page.fill("#task-filter", "good")
    expect(links).to_have_count(2)
    page.fill("#task-filter", "p/good two")  # every word must match
    expect(links).to_have_count(1)
    page.fill("#task-filter", "")
    page.select_option("#status-filter", "failed")
    expect(links).to_have_count(1)
    expect(links.first).to_have_attribute("data-task", "q/bad-one")
    page.select_option("#status-filter", "running")
    expect(page.locator("#tasks")).to_contain_text("No task matches (of 3)")
    page.select_option("#status-filter", "")
    # At 420 px the list and the task share the screen in turns.
    page.set_viewport_size({"width": 420, "height": 800})
    page.goto(f"{server.url}/#")
    expect(page.locator("#fleet")).to_be_visible()  # the home view opens on the fleet
    expect(page.locator("nav")).to_be_hidden()
    page.click("#nav-toggle")  # ...and ☰ opens the list
    expect(page.locator("nav")).to_be_visible()
    shot(page, "narrow-list-420")
    links.filter(has_text="bad-one").click()
    expect(page.locator("nav")).to_be_hidden()
    log = page.locator("#log")
    expect(log).to_be_visible()
    box = log.bounding_box()
    assert box is not None and box["width"] > 380  # the log has the width, not 90 px
    shot(page, "narrow-task-420")
    page.click("#nav-toggle")
    expect(page.locator("nav")).to_be_visible()
    expect(page.locator("#detail")).to_be_hidden()


def test_the_form_offers_the_configured_agents_and_the_loop_settings(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "1"], agents={"other": ["--lines", "1", "--line-text", "other"]})
    (ws.path / "sub").mkdir()
    page.goto(server.url)
    page.click("#new-task-button")
    options = page.locator("#agent-choice option")
    expect(options).to_have_text(
        ["config default (fake)", "fake — command", "other — command", "paste — paste"]
    )
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", "formed")
    page.fill("textarea[name=prompt]", "with settings")
    page.select_option("#agent-choice", "other")
    page.fill("input[name=cwd]", "nowhere")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#new-task-error")).to_contain_text("cwd 'nowhere' is not a folder")
    page.fill("input[name=cwd]", "sub")
    page.fill("input[name=timeout]", "soon")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#new-task-error")).to_contain_text("timeout")
    assert not ws.task("p", "formed").folder.exists()  # refused before anything was made
    shots(page, "start-form")
    page.fill("input[name=timeout]", "30s")
    page.fill("input[name=idle_timeout]", "20s")
    page.fill("input[name=max_restarts]", "0")
    page.select_option("select[name=until]", "exit")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#task-title")).to_have_text("p/formed")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#log")).to_contain_text("other 1")
    (run,) = ws.runs("p", "formed")
    assert run.agent == "other" and run.cwd == str(ws.path / "sub")
    page.go_back()  # the form is not reopened: the task replaced it in the history
    expect(page.locator("#new-task")).to_be_hidden()


def test_the_form_asks_whether_attempts_continue_the_agents_session(
    ws: Workspace, server: Server, page: Page
) -> None:
    """The form's Session: fresh starts each attempt of the task in a new session (remembered
    for its resumes, as --session fresh is); the API names a value that is neither."""
    import httpx

    from runagent.store import taskfolder

    replay(ws, "claude", "claude-text.stdout.jsonl", exit_code=1)  # a session, then a failure
    page.goto(server.url)
    page.click("#new-task-button")
    choices = page.locator("select[name=session] option")
    expect(choices).to_have_text(["config default", "continue", "fresh"])
    page.select_option("select[name=session]", "fresh")
    start_from_form(page, "cold", "start cold each time", max_restarts="1")
    expect(page.locator("#task-status")).to_have_text("failed")
    first, second = ws.runs("p", "cold")
    assert first.session_id and second.resumed_run_id is None  # not continued: fresh
    assert taskfolder.read_task_settings(ws.task("p", "cold"))["session"] == "fresh"
    bad = httpx.post(f"{server.url}/api/projects/p/tasks", timeout=30,
                     json={"task_id": "odd", "prompt": "x", "session": "warm"})  # fmt: skip
    assert bad.status_code == 400
    assert bad.json()["error"] == "session: 'warm' is not one of continue, fresh"
    assert not ws.task("p", "odd").folder.exists()


def test_a_finished_task_is_deleted_from_the_page_and_shows_its_disk_use(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60"], max_restarts=0)
    page.goto(server.url)
    start_from_form(page, "busy", "keep going")
    expect(page.locator("#task-status")).to_have_text("running")
    expect(page.locator("#delete-button")).to_be_disabled()  # never a running task
    page.click("#stop-button")
    expect(page.locator("#task-status")).to_have_text("stopped")
    expect(page.locator("#task-summary")).to_contain_text(re.compile(r"[\d.]+ (bytes|KB) on disk"))
    delete = page.locator("#delete-button")
    expect(delete).to_be_enabled()
    page.once("dialog", lambda d: d.dismiss())  # a second thought keeps it
    delete.click()
    assert ws.task("p", "busy").folder.is_dir()
    page.once("dialog", lambda d: d.accept())
    delete.click()
    expect(page.locator("nav a[data-task='p/busy']")).to_have_count(0)
    expect(page.locator("#placeholder")).to_be_visible()
    assert not ws.task("p", "busy").folder.exists()


BIG_RUN = "20260101-000000000-1000"


def big_log(ws: Workspace, lines: int = 200_000) -> str:
    """Task p/big with one finished run whose stdout is LINES numbered lines (about 11 MB)."""
    from runagent.store import runfolder, taskfolder
    from runagent.store.runinfo import Reason, RunInfo, RunStatus

    run_id = BIG_RUN
    task = ws.task("p", "big")
    taskfolder.write_task_prompt(task, "print a lot")
    folder = runfolder.create_run_folder(task, run_id)
    info = RunInfo(run_id, "p", "big", 1, "fake", "command", "2026-01-01T00:00:00+00:00",
                   str(ws.path), status=RunStatus.COMPLETED, reason=Reason.EXITED, exit_code=0,
                   end_time="2026-01-01T00:01:00+00:00")  # fmt: skip
    runfolder.write_run_info(folder, info)
    text = "".join(
        f"entry {i:06d} of the long log, with some words after it\n" for i in range(1, 200001)
    )
    (folder / runfolder.STDOUT).write_text(text)
    return run_id


def test_a_200000_line_log_opens_at_its_end_and_is_searched_numbered_and_linked(
    ws: Workspace, server: Server, page: Page
) -> None:
    run_id = big_log(ws)
    page.goto(f"{server.url}/#p/big")
    log = page.locator("#log")
    expect(log.locator(".line", has_text="entry 200000")).to_be_visible()  # opens at its end
    assert log.locator(".line").count() < 200  # only the rows on screen (and a margin) exist
    # Every line has its number (counted by the server), and the file's start is read by itself.
    expect(log.locator(".line", has_text="entry 200000").locator(".ln")).to_have_attribute(
        "data-ln", "200000", timeout=30000
    )
    wait_for(lambda: page.evaluate("() => log.from") == 0, 30, "the file's start to be read")
    # Typing searches by itself (after a pause of 120 ms); Enter then means "next match", so a
    # test that pressed Enter raced the page's own search under load.
    page.fill("#search", "entry 12345")
    expect(page.locator("#search-count")).to_have_text("10 of 10")  # 123450 to 123459
    current = log.locator(".line.current-match")
    expect(current.locator("mark")).to_have_text("entry 12345")
    expect(current).to_contain_text("entry 123459")  # the latest match first
    page.click("#search-next")  # wraps round to the first
    expect(page.locator("#search-count")).to_have_text("1 of 10")
    expect(current).to_contain_text("entry 123450")
    page.click("#search-prev")
    expect(page.locator("#search-count")).to_have_text("10 of 10")
    shots(page, "big-log-search")
    # A line's number is a link to it; the link opens the log there in a fresh page.
    number = current.locator(".ln")
    number.click()
    expect(page).to_have_url(re.compile(f"#p/big/{run_id}/stdout/L123459$"))
    fresh = page.context.new_page()
    fresh.goto(f"{server.url}/#p/big/{run_id}/stdout/L100")
    target = fresh.locator("#log .line.target")
    expect(target).to_contain_text("entry 000100")
    expect(target).to_be_in_viewport()
    fresh.close()


def test_a_log_beyond_what_is_read_ahead_loads_its_earlier_parts_on_scroll(
    ws: Workspace, server: Server, page: Page
) -> None:
    big_log(ws)
    page.add_init_script("window.runAgentPrefetchBytes = 0")  # nothing read ahead by itself
    page.goto(f"{server.url}/#p/big")
    log = page.locator("#log")
    last = log.locator(".line", has_text="entry 200000")
    expect(last).to_be_visible()
    held = page.evaluate("() => log.lines.length")
    assert held < 10_000  # only the tail was read
    tops = 0
    while page.evaluate("() => log.from") > 0:
        before = page.evaluate("() => log.lines.length")
        log.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
        wait_for(
            lambda b=before: page.evaluate("() => log.lines.length") > b, what="an earlier part"
        )
        tops += 1
    assert tops >= 2  # read in parts, as the reader went up
    # Stitched at every part's edge: every line once, whole, in order.
    assert page.evaluate(
        """() => log.lines.length === 200000 && log.lines.every((l, i) => l ===
             `entry ${String(i + 1).padStart(6, "0")} of the long log, with some words after it`)"""
    )
    log.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    expect(log.locator(".line", has_text="entry 000001").locator(".ln")).to_have_attribute(
        "data-ln", "1"
    )


def test_a_huge_logs_tail_is_numbered_before_its_start_is_read(
    ws: Workspace, server: Server, page: Page
) -> None:
    run_id = big_log(ws)
    page.add_init_script("window.runAgentPrefetchBytes = 0")  # nothing read ahead by itself
    page.goto(f"{server.url}/#p/big")
    log = page.locator("#log")
    last = log.locator(".line", has_text="entry 200000")
    # The server counts the lines before the tail: the numbers come without the file's start.
    expect(last.locator(".ln")).to_have_attribute("data-ln", "200000")
    expect(log.locator(".line", has_text="entry 199990").locator(".ln")).to_have_attribute(
        "data-ln", "199990"
    )
    assert page.evaluate("() => log.from") > 0  # only the tail was read
    # Scrolling up joins earlier parts under the same numbers.
    log.evaluate("el => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); }")
    wait_for(lambda: page.evaluate("() => log.lines.length") > 10_000, what="an earlier part")
    first = page.evaluate("() => log.lines[0]")
    number = int(first.split()[1])
    assert page.evaluate("() => log.base") == number - 1
    # A link to a line before what is read reads back to it.
    fresh = page.context.new_page()
    fresh.add_init_script("window.runAgentPrefetchBytes = 0")
    fresh.goto(f"{server.url}/#p/big/{run_id}/stdout/L100")
    target = fresh.locator("#log .line.target")
    expect(target).to_contain_text("entry 000100")
    expect(target.locator(".ln")).to_have_attribute("data-ln", "100")
    expect(target).to_be_in_viewport()
    fresh.close()


def test_the_search_box_is_emptied_when_another_task_is_shown(
    ws: Workspace, server: Server, page: Page
) -> None:
    ws.write_config(["--lines", "5"])
    for task in ("one", "two"):
        assert ws.cli("-p", "p", "-t", task, "print").returncode == 0
    page.goto(f"{server.url}/#p/one")
    expect(page.locator("#log")).to_contain_text("line 5")
    page.fill("#search", "line 3")
    page.press("#search", "Enter")
    expect(page.locator("#search-count")).to_have_text("1 of 1")
    expect(page.locator("#log mark")).to_have_count(1)
    page.click("nav a[data-task='p/two']")
    expect(page.locator("#task-title")).to_have_text("p/two")
    expect(page.locator("#log")).to_contain_text("line 5")
    expect(page.locator("#search")).to_have_value("")
    expect(page.locator("#search-count")).to_have_text("")
    expect(page.locator("#log mark")).to_have_count(0)
    expect(page.locator("#log .current-match")).to_have_count(0)


def test_the_forms_until_offers_ready_marker_and_the_loop_completes_on_a_marked_commit(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.gitrepo import GIT_ENV, git, make_repo

    repo = make_repo(ws.path / "repo")
    (ws.path / "plain").mkdir()
    ws.write_config(["--commit", "work", "--ready-from", "1"], env=GIT_ENV, max_restarts=0)
    page.goto(server.url)
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", "marked")
    page.fill("textarea[name=prompt]", "commit when ready")
    page.select_option("select[name=until]", "ready-marker")
    page.fill("input[name=cwd]", "plain")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#new-task-error")).to_contain_text("not in a git repository")
    assert not ws.task("p", "marked").folder.exists()  # refused before anything was made
    page.fill("input[name=cwd]", "repo")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#task-title")).to_have_text("p/marked")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#git-marker")).to_have_text("ready marker seen")
    (run,) = ws.runs("p", "marked")
    assert run.reason is not None and run.reason.value == "ready_marker"
    assert "cocode ready for check" in git(repo, "log", "-1", "--format=%B")


def test_the_form_starts_a_task_in_a_worktree_of_its_own(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.gitrepo import GIT_ENV, git, make_repo

    repo = make_repo(ws.path / "repo")
    head = git(repo, "rev-parse", "HEAD")
    ws.write_config(["--commit", "work"], env=GIT_ENV, max_restarts=0)
    page.goto(server.url)
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", "isolated")
    page.fill("textarea[name=prompt]", "work on a branch")
    page.fill("input[name=cwd]", "repo")
    page.check("input[name=worktree]")
    page.fill("input[name=base]", "no-such-branch")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#new-task-error")).to_contain_text("names no commit")
    assert not ws.task("p", "isolated").folder.exists()  # refused before anything was made
    page.fill("input[name=base]", "main")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#task-title")).to_have_text("p/isolated")
    expect(page.locator("#task-status")).to_have_text("completed")
    task = ws.task("p", "isolated")
    (run,) = ws.runs("p", "isolated")
    assert run.cwd == str(task.worktree) and run.branch == "run-agent/p/isolated"
    assert git(task.worktree, "log", "--format=%s", f"{head}..HEAD") == "work"
    assert git(repo, "rev-parse", "HEAD") == head and git(repo, "status", "--porcelain") == ""
    # The way back: what the branch holds, and Merge once the task has completed.
    expect(page.locator("#git-ahead")).to_contain_text("1 commit since the fork")
    expect(page.locator("#git-ahead")).to_contain_text("1 file changed")
    expect(page.locator("#git-ahead")).to_contain_text("→ main")
    page.click("#git-diff-box summary")
    expect(page.locator("#git-diff")).to_contain_text("+++ b/fake-agent-work.txt")
    page.click("#merge-button")
    expect(page.locator("#git-ahead")).to_contain_text("merged into main (fast-forward)")
    expect(page.locator("#merge-button")).to_be_hidden()
    assert git(repo, "rev-parse", "HEAD") == git(task.worktree, "rev-parse", "HEAD")


def test_rebase_on_the_page_hands_a_conflict_to_the_agent_and_merge_follows(
    ws: Workspace, server: Server, page: Page
) -> None:
    from tests.gitrepo import GIT_ENV, commit, git, make_repo

    repo = make_repo(ws.path / "repo")
    commit(repo, "the shared file", name="shared.txt", text="original\n")
    ws.write_config(["--edit", "shared.txt", "--commit", "work"], env=GIT_ENV, max_restarts=0)
    done = subprocess.run(
        ws.cli_argv("--config", str(ws.config), "-p", "p", "-t", "t", "--worktree", "go"),
        cwd=repo, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    theirs = commit(repo, "main changed it too", name="shared.txt", text="main's line\n")
    resolve = ('if [ -f "$(git rev-parse --git-dir)/MERGE_HEAD" ]; then printf "both\\n" > '
               "shared.txt && git add shared.txt && git commit -q --no-edit; fi")  # fmt: skip
    ws.write_config(["--shell", resolve], env=GIT_ENV, max_restarts=1)
    page.goto(f"{server.url}/#p/t")
    expect(page.locator("#git-ahead")).to_contain_text("main has 1 commit it lacks")
    page.click("#merge-button")
    expect(page.locator("#action-error")).to_contain_text("run-agent rebase -p p -t t")
    page.click("#rebase-button")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#merge-button")).to_be_visible()
    expect(page.locator("#rebase-button")).to_be_hidden()
    expect(page.locator("#git-ahead")).not_to_contain_text("it lacks")
    tree = ws.task("p", "t").worktree
    assert (tree / "shared.txt").read_text() == "both\n"
    assert git(tree, "rev-parse", "HEAD^2") == theirs
    page.click("#merge-button")
    expect(page.locator("#git-ahead")).to_contain_text("merged into main (fast-forward)")


def test_the_form_starts_an_issue_run(ws: Workspace, server: Server, page: Page) -> None:
    from tests.gitrepo import GIT_ENV, make_repo

    repo = make_repo(ws.path / "repo")
    ws.write_config(["--ready-from", "1"], env=GIT_ENV, max_restarts=0)
    page.goto(server.url)
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", "issue-3")
    page.fill("textarea[name=prompt]", "The login button does nothing")
    page.fill("input[name=issue_number]", "3")
    page.fill("input[name=issue_repo]", "repo")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#task-title")).to_have_text("p/issue-3")
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#git-issue")).to_have_text("issue #3")
    expect(page.locator("#git-marker")).to_have_text("ready marker seen")
    (run,) = ws.runs("p", "issue-3")
    assert run.cwd == str(ws.task("p", "issue-3").worktree) and run.repo == str(repo)


def test_a_schedules_tasks_are_grouped_under_it_latest_first(ws: Workspace, page: Page) -> None:

    import yaml

    from runagent.store import taskfolder

    config = yaml.safe_load(ws.write_config(["--lines", "1"], max_restarts=0).read_text())
    config["schedules"] = {
        "minutely": {"cron": "* * * * *", "project": "p", "prompt": "tick"}
    }  # fmt: skip
    ws.config.write_text(yaml.safe_dump(config))
    fired = [f"minutely-20261101-0{m}0000" for m in range(1, 6)]
    for task_id in [*fired, "by-hand"]:
        taskfolder.write_task_prompt(ws.task("p", task_id), "tick")
    with own_server(ws) as url:
        page.goto(url)
        group = page.locator("nav .group[data-schedule=minutely]")
        expect(group.locator(".group-title")).to_have_text("schedule minutely · 5 tasks")
        links = group.locator("a[data-task]")
        expect(links).to_have_count(3)  # the latest three...
        expect(links.first).to_have_attribute("data-task", f"p/{fired[-1]}")
        expect(links.first).to_contain_text("20261101-050000 (0)")  # its time, not the name again
        more = group.locator("button.more")
        expect(more).to_have_text("2 more")  # ...then how many more
        expect(page.locator("nav > #tasks > a[data-task='p/by-hand']")).to_have_count(1)
        shot(page, "schedule-group")
        more.click()
        expect(links).to_have_count(5)
        page.fill("#task-filter", "0100")  # filters reach into the group
        expect(links).to_have_count(1)


def test_copy_puts_the_logs_lines_on_the_clipboard(
    ws: Workspace, server: Server, browser: Browser
) -> None:
    ws.write_config(["--lines", "300", "--line-text", "copied"], max_restarts=0)
    assert ws.cli("--project", "p", "--task", "c", "copy me").returncode == 0
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = context.new_page()
    try:
        page.goto(f"{server.url}/#p/c")
        expect(page.locator("#log")).to_contain_text("copied 300")
        page.click("#copy-button")
        expect(page.locator("#copy-button")).to_have_text("copied 300 lines")
        copied = page.evaluate("() => navigator.clipboard.readText()")
        # Every line, not only the rows on screen.
        assert copied.splitlines() == [f"copied {i}" for i in range(1, 301)]
    finally:
        context.close()


def test_the_sidebar_sums_what_each_projects_runs_used(
    ws: Workspace, server: Server, page: Page
) -> None:
    import yaml

    sample = (REPO / "tests/samples/claude-text.stdout.jsonl").read_bytes().hex()
    replay = ws.agent_argv(["--ignore-unknown", "--chunks", sample])
    ws.config.write_text(yaml.safe_dump({
        "agents": {"claudeish": {"type": "claude", "permissions": "none", "command": replay}},
        "defaults": {"agent": "claudeish", "max_restarts": 0},
        "storage": {"runs_dir": str(ws.root)},
    }))  # fmt: skip
    for task in ("a", "b"):
        assert ws.cli("-p", "spend", "-t", task, "x").returncode == 0
    page.goto(server.url)
    heading = page.locator("nav h3", has_text="spend")
    expect(heading.locator(".usage")).to_have_text("30 tokens · $0.0003")  # 2 x (10 in + 5 out)


@contextlib.contextmanager
def paste_run(ws: Workspace, task: str = "paste") -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """`run-agent -a paste` on task p/TASK in a terminal, working in a fresh folder: the process
    and the folder. A run the test did not finish is interrupted as in a terminal."""
    from tests.server.test_server_paste import paste_config

    paste_config(ws)
    work = ws.path / "work"
    work.mkdir()
    proc = ws.start_cli("-p", "p", "-t", task, "-a", "paste", "--cwd", str(work), "Create it")
    try:
        yield proc, work
    finally:
        if proc.poll() is None:  # as Ctrl-C in its terminal would: the supervisor stops the run
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def outbox(ws: Workspace, sequence: int, task: str = "paste") -> Path:
    """The run's outbox file of `sequence`, once it is there."""
    folder = ws.task("p", task).folder / "paste" / "outbox"
    return wait_for(
        lambda: next(iter(folder.glob(f"*_seq{sequence:04d}.txt")), None), what="the outbox"
    )


def test_a_paste_run_is_copied_answered_and_done_from_the_page(
    ws: Workspace, server: Server, browser: Browser
) -> None:
    from tests.server.test_server_paste import DONE, REPLY

    reply = REPLY + '[DELETE_FILE path="nothing-here.txt"]\n'  # one command that fails
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    page = context.new_page()
    try:
        with paste_run(ws) as (proc, work):
            page.goto(f"{server.url}/#p/paste")
            first = outbox(ws, 1)
            text = first.read_text(encoding="utf-8")
            panel = page.locator("#paste")
            expect(panel.locator("#paste-name")).to_have_text(first.name)
            expect(panel.locator("#paste-sequence")).to_have_text("1")
            expect(panel.locator("#paste-size")).to_have_text(f"{len(text):,} characters")
            panel.locator("#paste-copy").click()
            expect(panel.locator("#paste-copied")).to_have_text(f"copied {len(text):,} characters")
            assert page.evaluate("() => navigator.clipboard.readText()") == text
            panel.locator("#paste-text-box summary").click()
            expect(panel.locator("#paste-text")).to_contain_text("=== PROTOCOL ===")
            expect(panel.locator("#paste-results-box")).to_be_hidden()  # no reply yet
            shot(page, "paste-outbox")

            # A refused reply says why, and stays in the box.
            panel.locator("#paste-reply").fill("  \n ")
            panel.locator("#paste-send").click()
            expect(panel.locator("#paste-error")).to_contain_text("the reply is empty")

            panel.locator("#paste-reply").fill(reply)
            panel.locator("#paste-send").click()
            expect(panel.locator("#paste-error")).to_be_empty()
            expect(panel.locator("#paste-reply")).to_have_value("")
            expect(panel.locator("#paste-sequence")).to_have_text("2")
            expect(panel.locator("#paste-name")).to_have_text(outbox(ws, 2).name)
            results = panel.locator("#paste-results .result")
            expect(results).to_have_count(4)
            expect(results.nth(0)).to_have_class(re.compile(r"\bok\b"))
            expect(results.nth(0)).to_contain_text("[OK] CREATE_FILE: Created 'hello.txt'")
            expect(results.nth(1)).to_contain_text("[OK] RUN_COMMAND: Ran 'echo ran-ok'")
            expect(results.nth(1).locator(".output")).to_contain_text("Output: ran-ok")
            expect(results.nth(3)).to_have_class(re.compile(r"\bfailed\b"))
            expect(results.nth(3)).to_contain_text("[FAILED] DELETE_FILE")
            expect(panel.locator("#paste-messages .message")).to_have_text(["hello.txt is written"])
            assert (
                work / "hello.txt"
            ).read_text() == "    hi there"  # indentation kept, no line break added
            shots(page, "paste-results")  # wide, and as narrow as a phone

            # The same reply again is refused as a duplicate, and stays in the box.
            panel.locator("#paste-reply").fill(reply)
            panel.locator("#paste-send").click()
            expect(panel.locator("#paste-error")).to_have_text(
                "the reply is a duplicate of the last one (the answer to outbox 1), which was "
                "already applied: it was not saved nor applied again; paste the chat's answer to "
                "outbox 2"
            )
            expect(panel.locator("#paste-reply")).to_have_value(reply)

            panel.locator("#paste-reply").fill(DONE)
            panel.locator("#paste-reply").press("Control+Enter")  # the keyboard's Send
            expect(panel.locator("#paste-summary")).to_have_text(
                re.compile(r"^wrote hello.txt\s*$"), timeout=30000
            )
            expect(panel.locator("#paste-form")).to_be_hidden()
            expect(panel.locator("#paste-outbox")).to_be_hidden()
            expect(page.locator("#task-status")).to_have_text("completed")
            shot(page, "paste-done")
            assert proc.wait(60) == 0
    finally:
        context.close()
    assert ws.runs("p", "paste")[0].status.value == "completed"


def test_copy_falls_back_to_a_selected_box_where_the_clipboard_api_is_not_offered(
    ws: Workspace, server: Server, browser: Browser
) -> None:
    """As on http://192.168.x.y (not a secure context): no navigator.clipboard for the page."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=server.url)
    context.add_init_script("Object.defineProperty(window, 'isSecureContext', {value: false})")
    page = context.new_page()
    try:
        with paste_run(ws):
            page.goto(f"{server.url}/#p/paste")
            text = outbox(ws, 1).read_text(encoding="utf-8")
            expect(page.locator("#paste-sequence")).to_have_text("1")
            assert page.evaluate("() => window.isSecureContext") is False
            page.locator("#paste-copy").click()
            expect(page.locator("#paste-copied")).to_have_text(f"copied {len(text):,} characters")
            expect(page.locator("#paste-fallback")).to_be_hidden()
            # Read back through the API the page was kept from (the test's own way in).
            assert page.evaluate("() => navigator.clipboard.readText()") == text
            # Where the browser refuses even that, the outbox is left selected for Ctrl+C.
            page.evaluate("() => { document.execCommand = () => false; }")
            page.locator("#paste-copy").click()
            expect(page.locator("#paste-copied")).to_contain_text("press Ctrl+C")
            box = page.locator("#paste-fallback")
            expect(box).to_be_visible()
            expect(box).to_have_value(text)
            selected = "el => el.value.slice(el.selectionStart, el.selectionEnd)"
            assert box.evaluate(selected) == text and box.evaluate("el => el.readOnly")
    finally:
        context.close()


def test_a_paste_runs_command_that_needs_approval_is_answered_on_the_page(
    ws: Workspace, server: Server, page: Page
) -> None:
    """The reply asks for `rm -r build`, which the shell policy holds for a person's approval:
    the approvals panel shows it with the paste task's name, Approve lets it run."""
    with paste_run(ws) as (proc, work):
        (work / "build").mkdir()
        page.goto(f"{server.url}/#p/paste")
        expect(page.locator("#paste-sequence")).to_have_text("1")
        page.locator("#paste-reply").fill("[RUN_COMMAND]\nrm -r build\n[/RUN_COMMAND]\n")
        page.locator("#paste-send").click()
        asked = page.locator("#approvals .approval", has_text="rm -r build")
        expect(asked).to_be_visible()
        expect(asked.locator(".where")).to_contain_text("p/paste")
        assert (work / "build").is_dir()  # nothing ran before the answer
        shot(page, "paste-approval")
        asked.locator("button.approve").click()
        expect(page.locator("#approvals")).to_be_hidden()
        expect(page.locator("#paste-sequence")).to_have_text("2")
        expect(page.locator("#paste-results .result.ok")).to_contain_text(
            "[OK] RUN_COMMAND: Ran 'rm -r build'"
        )
        assert not (work / "build").exists()
        page.locator("#paste-reply").fill(DONE_REPLY)
        page.locator("#paste-send").click()
        expect(page.locator("#task-status")).to_have_text("completed")
        assert proc.wait(60) == 0


DONE_REPLY = "[DONE]\nremoved build\n[/DONE]\n"


def test_the_form_starts_a_race_and_the_task_shows_its_racers_side_by_side(
    ws: Workspace, server: Server, page: Page
) -> None:
    """A race from the form: the race's task lists its racers (agent, status, attempt, spend,
    check, reason), live; the second wins, the first loses, and Merge brings the winner's
    branch back."""
    from tests.gitrepo import GIT_ENV, git, make_repo

    repo = make_repo(ws.path / "repo")
    from tests.test_race import PASSING

    ws.write_config(["--commit", "work", "--wait-in-task", "go"], env=GIT_ENV, **PASSING)
    page.goto(server.url)
    page.click("#new-task-button")
    page.fill("input[name=project]", "p")
    page.fill("input[name=task_id]", "duel")
    page.fill("textarea[name=prompt]", "race for it")
    page.fill("input[name=cwd]", "repo")
    page.fill("input[name=agents]", "fake, fake")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#new-task-error")).to_contain_text("agents names fake twice")
    assert not ws.task("p", "duel").folder.exists()
    page.fill("input[name=agents]", "")
    page.fill("input[name=race]", "2")
    page.click("form#new-task button[type=submit]")
    expect(page.locator("#task-title")).to_have_text("p/duel")
    expect(page.locator("#task-status")).to_have_text("running")
    rows = page.locator("#race-racers tr")
    expect(rows).to_have_count(2)
    for racer in ("duel.1", "duel.2"):
        row = page.locator(f"#race-racers tr[data-racer='{racer}']")
        expect(row.locator("td").nth(0)).to_have_text(f"p/{racer}")
        expect(row.locator("td").nth(1)).to_have_text("fake")
        expect(row.locator("td").nth(2)).to_have_text("running")
        expect(row.locator("td").nth(3)).to_have_text("1")  # its attempt, once it started
    expect(page.locator("#race-summary")).to_have_text("race of 2: racing")
    shot(page, "race-running")
    # The fleet lists the race running, its racers under it.
    page.goto(server.url + "/#")
    race = page.locator("#fleet-races > li[data-task='p/duel']")
    expect(race.locator("li[data-racer]")).to_have_count(2)
    expect(race.locator("li[data-racer='duel.2']")).to_contain_text("fake running · attempt 1")
    race.locator("> a").click()
    expect(page.locator("#task-title")).to_have_text("p/duel")
    (ws.task("p", "duel.2").folder / "go").touch()
    expect(page.locator("#task-status")).to_have_text("completed")
    expect(page.locator("#race-summary")).to_have_text("race of 2: won by duel.2")
    won = page.locator("#race-racers tr[data-racer='duel.2']")
    expect(won).to_have_class("won")
    expect(won.locator("td").nth(2)).to_have_text("won")
    lost = page.locator("#race-racers tr[data-racer='duel.1']")
    expect(lost.locator("td").nth(2)).to_have_text("stopped")
    expect(lost.locator("td").nth(6)).to_have_text("lost_race: lost the race to p/duel.2")
    shot(page, "race-won")
    expect(page.locator("#git-branch")).to_have_text("run-agent/p/duel.2")
    page.click("#merge-button")
    expect(page.locator("#git-ahead")).to_contain_text("merged into main (fast-forward)")
    assert git(repo, "log", "-1", "--format=%s") == "work"
    # A racer is a link to its own task.
    lost.locator("td a").click()
    expect(page.locator("#task-title")).to_have_text("p/duel.1")
