"""What a fleet user reaches for on the page, in a real chromium against a real server, real loops
and a real queue: the queue held and released and every loop stopped from the fleet view, the
task list sorted by most recent activity (remembered), and which task waits for which."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from runagent.fleet.queue import Fleet
from tests.conftest import Server, Workspace, wait_for

# The browser (a fixture) and the skip where chromium is missing are test_browser's.
from tests.e2e.test_browser import browser, pytestmark, shot  # noqa: F401
from tests.fleet.test_queue import configure, go, keepers, listed


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    p = context.new_page()
    yield p
    context.close()


def status(ws: Workspace, label: str) -> str:
    return str(listed(ws).get(label, {}).get("status"))


def test_the_fleet_view_holds_the_queue_stops_everything_and_releases_it(
    ws: Workspace, server: Server, page: Page
) -> None:
    configure(ws, {"max_running": 1})
    for task in ("a", "b"):
        assert ws.cli("run", "-p", "p", "-t", task, "-d", "go").returncode == 0
    wait_for(lambda: status(ws, "p/a") == "running" and status(ws, "p/b") == "queued",
             what="a running, b queued")  # fmt: skip
    page.goto(server.url)
    state, button = page.locator("#fleet-hold-state"), page.locator("#fleet-hold-button")
    expect(state).to_have_text("the queue runs: queued tasks start as their turns come")
    expect(button).to_have_text("Hold the queue")
    button.click()
    expect(state).to_contain_text("the queue is held since ")
    expect(button).to_have_text("Release the queue")
    held = Fleet(ws.root).queue_hold()
    assert held is not None and held.by == "the API"
    expect(page.locator("#fleet-queue li[data-task='p/b'] .waits")).to_contain_text(
        "the queue is held since "
    )
    shot(page, "fleet-held")
    stop_all = page.locator("#fleet-stop-all")
    page.once("dialog", lambda d: d.dismiss())  # a second thought stops nothing
    stop_all.click()
    assert status(ws, "p/a") == "running"
    page.once("dialog", lambda d: d.accept())
    stop_all.click()
    expect(page.locator("#fleet-stop-all-said")).to_have_text(
        "stopped 1 running: p/a · took 1 out of the queue, never started: p/b"
    )
    expect(page.locator("#fleet-counts li[data-count=running] strong")).to_have_text("0")
    assert status(ws, "p/a") == "stopped" and not ws.task("p", "b").run_ids()
    expect(state).to_contain_text("the queue is held since ")  # held before: held still
    button.click()
    expect(state).to_have_text("the queue runs: queued tasks start as their turns come")
    assert Fleet(ws.root).queue_hold() is None
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_the_task_list_sorts_by_most_recent_activity_and_remembers_it(
    ws: Workspace, server: Server, page: Page
) -> None:
    configure(ws, None, ["--lines", "1"])
    for project, task in (("p", "zeta"), ("q", "alpha"), ("p", "mid")):  # in this order
        assert ws.cli("job", "-p", project, "-t", task, "go").returncode == 0
    page.goto(server.url)
    links = page.locator("#tasks a[data-task]")
    expect(links).to_have_count(3)
    by_name = ["p/mid", "p/zeta", "q/alpha"]  # by project, then name
    expect(links.first).to_have_attribute("data-task", by_name[0])
    assert [links.nth(i).get_attribute("data-task") for i in range(3)] == by_name
    page.select_option("#task-sort", "recent")
    recent = ["p/mid", "q/alpha", "p/zeta"]  # the latest activity first, across projects
    expect(links.nth(1)).to_have_attribute("data-task", recent[1])
    assert [links.nth(i).get_attribute("data-task") for i in range(3)] == recent
    expect(links.nth(0)).to_contain_text("p/mid")  # a flat list names each task's project
    page.select_option("#status-filter", "completed")  # the filter still applies
    expect(links).to_have_count(3)
    page.reload()
    expect(page.locator("#task-sort")).to_have_value("recent")
    expect(links.nth(1)).to_have_attribute("data-task", recent[1])
    page.select_option("#task-sort", "name")
    expect(links.nth(1)).to_have_attribute("data-task", by_name[1])
    page.reload()
    expect(page.locator("#task-sort")).to_have_value("name")


def test_the_fleet_shows_which_task_waits_for_which(
    ws: Workspace, server: Server, page: Page
) -> None:
    configure(ws, None)
    assert ws.cli("run", "-p", "p", "-t", "build", "-d", "go").returncode == 0
    wait_for(lambda: status(ws, "p/build") == "running", what="build running")
    after = ("run", "-p", "p", "-d", "--after", "p/build")
    assert ws.cli(*after, "-t", "test", "go").returncode == 0
    assert ws.cli(*after, "--after", "p/test", "-t", "deploy", "go").returncode == 0
    page.goto(server.url)
    deploy = page.locator("#fleet-after > li[data-task='p/deploy']")
    expect(deploy.locator("> a")).to_have_text("p/deploy")
    expect(deploy.locator("li[data-on='p/build'] .badge")).to_have_text("running")
    expect(deploy.locator("li[data-on='p/test'] .badge")).to_have_text("blocked")
    test = page.locator("#fleet-after > li[data-task='p/test']")
    expect(test.locator("li[data-on]")).to_have_count(1)
    shot(page, "fleet-after")
    go(ws, "build")
    expect(deploy.locator("li[data-on='p/build'] .badge")).to_have_text("completed")
    expect(deploy.locator("li[data-on='p/test'] .badge")).to_have_text("running")
    expect(test).to_have_count(0)  # it waits no more: it runs
    deploy.locator("li[data-on='p/test'] a").click()
    expect(page.locator("#task-title")).to_have_text("p/test")
    go(ws, "test")
    go(ws, "deploy")
    wait_for(lambda: status(ws, "p/deploy") == "completed", 60, "deploy to complete")
    page.goto(server.url)
    expect(page.locator("#fleet-after-box")).to_be_hidden()
    wait_for(lambda: not keepers(ws), what="the keeper to exit")


def test_the_hold_and_stop_all_buttons_show_only_where_the_token_may_use_them(
    ws: Workspace, server: Server, page: Page
) -> None:
    """A read token's fleet view offers neither button; an operate token limited to projects
    offers Stop all (its projects' loops) but not the hold, which holds every project's queue."""
    from runagent.store import tokens

    reader, _ = tokens.create(ws.root, tokens.Scope.READ)
    limited, _ = tokens.create(ws.root, tokens.Scope.OPERATE, ["p"])
    every, _ = tokens.create(ws.root, tokens.Scope.OPERATE)
    page.goto(f"{server.url}/?key={reader}")
    expect(page.locator("#access-note")).to_contain_text("read-only access")
    expect(page.locator("#fleet-hold-state")).to_have_text(
        "the queue runs: queued tasks start as their turns come"
    )
    for hidden in ("#fleet-hold-button", "#fleet-stop-all"):
        expect(page.locator(hidden)).to_be_hidden()
    page.context.clear_cookies()
    page.goto(f"{server.url}/?key={limited}")
    expect(page.locator("#access-note")).to_contain_text("operate access (projects p)")
    expect(page.locator("#fleet-stop-all")).to_be_visible()
    expect(page.locator("#fleet-hold-button")).to_be_hidden()
    page.context.clear_cookies()
    page.goto(f"{server.url}/?key={every}")
    expect(page.locator("#fleet-hold-button")).to_be_visible()
    expect(page.locator("#fleet-stop-all")).to_be_visible()
