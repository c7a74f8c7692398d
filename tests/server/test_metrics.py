"""`GET /metrics`: scraped from a real server and read with the Prometheus client library's own
parser; its figures are checked against what the test ran (and the run folders recorded)."""

from __future__ import annotations

import itertools
import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from server import metrics
from server.app import Settings, create_app
from tests.conftest import Workspace, serving, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(text: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def configure(ws: Workspace) -> None:
    ws.write_config(["--fail-first", "1", "--lines", "1"], max_restarts=2)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["spender"] = {"type": "codex", "command": ws.agent_argv(
        ["--ignore-unknown", "--codex-usage", "700", "--usage-lines", "3"])}  # fmt: skip
    ws.config.write_text(yaml.safe_dump(data))


def test_metrics_count_what_ran(ws: Workspace) -> None:
    configure(ws)
    assert ws.cli("run", "-p", "p", "-t", "flaky", "go").returncode == 0  # fails once, then not
    assert ws.cli("run", "-p", "p2", "-t", "spend", "--agent", "spender", "go").returncode == 0
    assert ws.cli("job", "-p", "p", "-t", "bad", "go").returncode == 1
    after = ws.cli("run", "-p", "p", "-t", "after", "--after", "p/bad", "go")
    assert after.returncode == 6, after.stderr  # blocked: what it runs after failed
    (ws.path / "project" / "victim").mkdir(parents=True)
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "createFile", "path": "notes.txt", "content": "hi\n"},
        {"type": "shell", "command": "echo one"},
        {"type": "shell", "id": "rm-1", "command": "rm -r victim"},  # approval, under standard
    ]}  # fmt: skip
    ops = ws.cli("ops", "apply", "-", "-w", "project", "--policy", "standard",
                 input=json.dumps(message))  # fmt: skip
    assert json.loads(ops.stdout)["status"] == "awaiting_approval", ops.stderr
    spent = next(r for r in ws.runs("p2", "spend"))

    with serving(ws) as url:
        answer = httpx.get(f"{url}/metrics", timeout=30)
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/plain; version=")
        got = scrape(answer.text)
        assert value(got, "run_agent_sse_clients") == 0

    assert value(got, "run_agent_tasks", status="completed") == 2
    assert value(got, "run_agent_tasks", status="failed") == 1
    assert value(got, "run_agent_tasks", status="blocked") == 1
    assert value(got, "run_agent_runs_started_total", agent="fake") == 3
    assert value(got, "run_agent_runs_started_total", agent="spender") == 1
    assert value(got, "run_agent_runs_ended_total", agent="fake", reason="exit_code") == 2
    assert value(got, "run_agent_runs_ended_total", agent="fake", reason="exited") == 1
    assert value(got, "run_agent_restarts_total", agent="fake") == 1
    assert value(got, "run_agent_attempt_duration_seconds_count", agent="fake") == 3
    assert value(got, "run_agent_attempt_duration_seconds_bucket", agent="fake", le="+Inf") == 3
    assert spent.tokens_in == 2100 and spent.tokens_out == 0  # three turns of 700 in, none out
    assert value(got, "run_agent_tokens_total", agent="spender", project="p2",
                 direction="in") == spent.tokens_in  # fmt: skip
    assert value(got, "run_agent_tokens_total", agent="spender", project="p2",
                 direction="out") == spent.tokens_out  # fmt: skip
    assert value(got, "run_agent_queue_length", state="blocked") == 1
    assert value(got, "run_agent_queue_length", state="queued") == 0
    assert value(got, "run_agent_queue_oldest_wait_seconds") > 0
    assert value(got, "run_agent_operations_total", type="createFile", verdict="done") == 1
    assert value(got, "run_agent_operations_total", type="shell", verdict="done") == 1
    assert value(got, "run_agent_operations_total", type="shell",
                 verdict="approval_required") == 1  # fmt: skip


def test_a_server_scraped_again_counts_what_changed_since_as_a_fresh_one_would(
    ws: Workspace,
) -> None:
    """The server keeps what ended runs add between scrapes; a run that ends, one that starts,
    a task deleted and an operation approved since the last scrape all show in the next."""
    configure(ws)
    assert ws.cli("run", "-p", "p", "-t", "flaky", "go").returncode == 0  # fails once, then not
    ws.write_config(["--lines", "1", "--sleep", "60"])
    assert ws.cli("run", "-p", "p", "-t", "live", "--detach", "go").returncode == 0
    wait_for(lambda: ws.task("p", "live").run_ids(), 30, "the live run")
    gone = ws.start_cli("--project", "p", "--task", "gone", "go")  # its supervisor dies below
    wait_for(lambda: ws.task("p", "gone").run_ids(), 30, "the run to lose")
    (ws.path / "project" / "victim").mkdir(parents=True)
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "shell", "id": "rm-1", "command": "rm -r victim"}]}  # fmt: skip
    ops = ws.cli("ops", "apply", "-", "-w", "project", "--policy", "standard",
                 input=json.dumps(message))  # fmt: skip
    ops_run = json.loads(ops.stdout)["runId"]

    with serving(ws) as url:
        before = scrape(httpx.get(f"{url}/metrics", timeout=30).text)
        assert value(before, "run_agent_runs_started_total", agent="fake") == 4
        assert value(before, "run_agent_tasks", status="running") == 2
        assert value(before, "run_agent_runs_ended_total", agent="fake", reason="stopped") == 0
        assert value(before, "run_agent_operations_total", type="shell",
                     verdict="approval_required") == 1  # fmt: skip
        assert value(before, "run_agent_operations_total", type="shell", verdict="done") == 0

        assert ws.cli("stop", "-p", "p", "-t", "live").returncode == 0  # its run-info rewritten
        os.kill(gone.pid, signal.SIGKILL)  # its run-info still says running: read as lost
        gone.communicate(timeout=30)
        wait_for(lambda: status(ws, "gone") == "lost", 30, "the run to read as lost")
        assert ws.cli("delete", "-p", "p", "-t", "flaky", "--yes").returncode == 0
        ws.write_config(["--lines", "1"])
        assert ws.cli("run", "-p", "p", "-t", "more", "go").returncode == 0
        approved = ws.cli("ops", "approve", ops_run, "rm-1")  # appends to its events
        assert approved.returncode == 0, approved.stderr

        after = httpx.get(f"{url}/metrics", timeout=30).text
    cold = metrics.render(ws.root, 0)  # what a server that never scraped before says
    assert scrape(after) == scrape(cold.decode())
    got = scrape(after)
    # flaky's two runs, deleted, stay counted (test_counters_never_fall_...); live, gone, more
    assert value(got, "run_agent_runs_started_total", agent="fake") == 5
    assert value(got, "run_agent_runs_ended_total", agent="fake", reason="stopped") == 1
    assert value(got, "run_agent_runs_ended_total", agent="fake", reason="lost") == 1
    assert value(got, "run_agent_runs_ended_total", agent="fake", reason="exit_code") == 1
    assert value(got, "run_agent_restarts_total", agent="fake") == 1
    assert value(got, "run_agent_tasks", status="running") == 0
    assert value(got, "run_agent_operations_total", type="shell", verdict="done") == 1


def test_what_a_server_keeps_between_scrapes_is_what_the_root_holds_now(ws: Workspace) -> None:
    from runagent.store import index

    configure(ws)
    for task in ("one", "two"):
        assert ws.cli("run", "-p", "p", "-t", task, "go").returncode == 0  # two runs each
    assert ws.cli("run", "-p", "other", "-t", "three", "go").returncode == 0
    known = index.for_root(ws.root)
    first = metrics.render(ws.root, 0)
    assert len(known) == 3
    assert metrics.render(ws.root, 0) == first
    assert ws.cli("delete", "-p", "p", "-t", "one", "--yes").returncode == 0
    metrics.render(ws.root, 0)
    assert len(known) == 2  # a deleted task is forgotten, not kept for the server's life
    # A scrape of one project (a token limited to it) forgets only what it looked at.
    assert ws.cli("delete", "-p", "other", "-t", "three", "--yes").returncode == 0
    metrics.render(ws.root, 0, reaches=lambda project: project == "p")
    assert len(known) == 2  # other's task: not looked at, so not known to be gone
    metrics.render(ws.root, 0, reaches=lambda project: project == "other")
    assert len(known) == 1
    # What the file keeps is forgotten with it: a fresh process knows p/two alone.
    fresh = index.Index(ws.root)
    fresh.summaries([])
    assert len(fresh) == 1
    fresh.close()


def test_conductor_loops_restarts_are_the_runs_that_name_the_run_before_them(
    ws: Workspace,
) -> None:
    """conductor-loop's records have no attempt (each is shown numbered by its place among its
    task's runs, which gc changes): a restart is a run that names the one before it in its loop
    (`previous_run_id`), so gc removing the first run renumbers the rest and no counter falls."""
    from tests.store.test_conductor_loop import COMPLETED, FAILED, TASK

    task = ws.task("conductor", TASK)
    for n, text in enumerate((FAILED, FAILED, COMPLETED)):
        folder = task.run_folder(f"20260205-12{n}0000000-8700{n}")
        folder.mkdir(parents=True)
        (folder / "run-info.yaml").write_text(text)
    tally = metrics.Tally()
    before = scrape(metrics.render(ws.root, 0, tally).decode())
    assert value(before, "run_agent_restarts_total", agent="codex") == 1  # COMPLETED's
    assert value(before, "run_agent_runs_started_total", agent="codex") == 3
    assert ws.cli("gc", "--keep-last", "2").returncode == 0  # the first run goes
    assert len(task.run_ids()) == 2
    again = scrape(metrics.render(ws.root, 0, tally).decode())
    assert counters(again) == counters(before)
    assert again == scrape(metrics.render(ws.root, 0).decode())


def test_a_record_whose_times_cannot_be_compared_is_counted_without_a_duration(
    ws: Workspace,
) -> None:
    """A start with no time zone beside an end with one (any hand may write a record): the run
    is counted, its duration left out, the scrape answered."""
    from tests.store.test_conductor_loop import COMPLETED, TASK

    folder = ws.task("conductor", TASK).run_folder("20260205-1245000000-87500")
    folder.mkdir(parents=True)
    text = COMPLETED.replace("start_time: 2026-02-05T12:45:00Z", "start_time: 2026-02-05T12:45:00")
    (folder / "run-info.yaml").write_text(text)
    got = scrape(metrics.render(ws.root, 0).decode())
    assert value(got, "run_agent_runs_ended_total", agent="codex", reason="completed") == 1
    assert value(got, "run_agent_attempt_duration_seconds_count", agent="codex") == 0


def test_metrics_count_the_sse_clients_being_served(ws: Workspace) -> None:
    ws.write_config(["--lines", "1", "--sleep", "60"])
    assert ws.cli("run", "-p", "p", "-t", "live", "--detach", "go").returncode == 0
    task = ws.task("p", "live")
    run_id = wait_for(lambda: task.run_ids(), 30, "the run")[0]
    path = f"/api/projects/p/tasks/live/runs/{run_id}/stream/stdout"
    try:
        with serving(ws) as url:
            assert sse_clients(url) == 0
            with httpx.stream("GET", url + path, timeout=30) as stream:
                lines = stream.iter_lines()  # held: an iterator let go of closes the response
                next(line for line in lines if line.startswith("data"))
                assert wait_for(lambda: sse_clients(url) == 1, 10, "one client counted")
            assert wait_for(lambda: sse_clients(url) == 0, 30, "none once it left")
    finally:
        assert ws.cli("stop", "-p", "p", "-t", "live").returncode == 0


def status(ws: Workspace, task: str) -> str:
    shown = ws.cli("status", "-p", "p", "-t", task, "--json")
    return str(json.loads(shown.stdout)["status"])


def sse_clients(url: str) -> float:
    return value(scrape(httpx.get(f"{url}/metrics", timeout=30).text), "run_agent_sse_clients")


def app_client(tmp_path: Path, **settings: Any) -> TestClient:
    app = create_app(Settings(root=tmp_path, run_schedules=False, **settings))
    return TestClient(app, base_url="http://127.0.0.1")


def test_metrics_need_the_key_unless_made_public(tmp_path: Path) -> None:
    with app_client(tmp_path, api_key="k" * 32) as client:
        assert client.get("/metrics").status_code == 401
        given = client.get("/metrics", headers={"Authorization": "Bearer " + "k" * 32})
        assert given.status_code == 200 and "run_agent_tasks" in given.text
    with app_client(tmp_path, api_key="k" * 32, metrics_public=True) as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/api/tasks").status_code == 401  # nothing else is made public


def test_metrics_public_is_read_from_the_config(ws: Workspace) -> None:
    ws.write_config([])
    data = yaml.safe_load(ws.config.read_text())
    data["metrics"] = {"public": "yes"}
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.invoke("list")
    assert done.returncode == 2 and "metrics.public: 'yes' is not true or false" in done.stderr


def counters(samples: Samples) -> Samples:
    """The samples Prometheus takes as counters: a counter's, and a histogram's buckets, count
    and sum (each may only grow, or `rate()` and `increase()` read a reset)."""
    grows = ("_total", "_bucket", "_count", "_sum")
    return {key: v for key, v in samples.items() if key[0].endswith(grows)}


def test_counters_never_fall_when_gc_and_delete_remove_runs(ws: Workspace) -> None:
    """Prometheus' counter contract: a counter only grows. What gc, delete and the API's gc
    remove stays counted (a tally kept under the runs root), so `increase()` over a deletion is
    0, not the removed runs again; a restarted server, or one that never scraped, says the same."""
    configure(ws)
    assert ws.cli("run", "-p", "p", "-t", "flaky", "go").returncode == 0  # fails once, then not
    assert ws.cli("run", "-p", "p2", "-t", "spend", "--agent", "spender", "go").returncode == 0
    assert ws.cli("run", "-p", "q", "-t", "flaky", "go").returncode == 0
    (ws.path / "project").mkdir()
    message = {"protocolVersion": "1.0", "operations": [
        {"type": "createFile", "path": "notes.txt", "content": "hi\n"}]}  # fmt: skip
    ops = ws.cli("ops", "apply", "-", "-w", "project", "-p", "o", "-t", "acts",
                 input=json.dumps(message))  # fmt: skip
    assert json.loads(ops.stdout)["status"] == "completed", ops.stderr
    with serving(ws) as url:
        before = counters(scrape(httpx.get(f"{url}/metrics", timeout=30).text))
        assert value(before, "run_agent_runs_started_total", agent="fake") == 4
        assert value(before, "run_agent_operations_total", type="createFile", verdict="done") == 1
        gc = ws.cli("gc", "--keep-last", "1", "-p", "p")  # flaky's failed first run
        assert gc.returncode == 0 and "removed 1 run" in gc.stderr, gc.stderr
        assert counters(scrape(httpx.get(f"{url}/metrics", timeout=30).text)) == before
        api = httpx.post(f"{url}/api/gc", json={"keep_last": 1, "project": "q"}, timeout=30)
        assert api.status_code == 200 and len(api.json()["removed"]) == 1, api.text
        assert counters(scrape(httpx.get(f"{url}/metrics", timeout=30).text)) == before
        assert ws.cli("delete", "-p", "p2", "-t", "spend", "--yes").returncode == 0
        assert ws.cli("delete", "-p", "o", "-t", "acts", "--yes", "--force").returncode == 0
        assert counters(scrape(httpx.get(f"{url}/metrics", timeout=30).text)) == before
    assert not ws.task("p2", "spend").folder.exists() and len(ws.task("p", "flaky").run_ids()) == 1
    assert counters(scrape(metrics.render(ws.root, 0).decode())) == before  # a fresh server
    # What was removed is counted once: a run started since adds itself alone.
    ws.write_config(["--lines", "1"])
    assert ws.cli("run", "-p", "p", "-t", "more", "go").returncode == 0
    after = counters(scrape(metrics.render(ws.root, 0).decode()))
    assert value(after, "run_agent_runs_started_total", agent="fake") == 5
    assert value(after, "run_agent_restarts_total", agent="fake") == 2


def test_the_removed_runs_of_a_project_count_for_its_own_scrapes_alone(ws: Workspace) -> None:
    configure(ws)
    assert ws.cli("run", "-p", "p2", "-t", "spend", "--agent", "spender", "go").returncode == 0
    assert ws.cli("delete", "-p", "p2", "-t", "spend", "--yes").returncode == 0
    theirs = scrape(metrics.render(ws.root, 0, None, lambda project: project == "p2").decode())
    assert value(theirs, "run_agent_tokens_total", agent="spender", project="p2",
                 direction="in") == 2100  # fmt: skip
    assert value(theirs, "run_agent_runs_started_total", agent="spender") == 1
    other = scrape(metrics.render(ws.root, 0, None, lambda project: project == "p").decode())
    assert value(other, "run_agent_runs_started_total", agent="spender") == 0
    assert value(other, "run_agent_tokens_total", agent="spender", project="p2",
                 direction="in") == 0  # fmt: skip


def test_a_tally_that_cannot_be_read_counts_nothing_and_the_scrape_answers(ws: Workspace) -> None:
    configure(ws)
    assert ws.cli("run", "-p", "p", "-t", "flaky", "go").returncode == 0
    (ws.root / ".removed.json").write_text('{"version": 1, "projects": {"p": {"started": [1]}}}')
    got = scrape(metrics.render(ws.root, 0).decode())
    assert value(got, "run_agent_runs_started_total", agent="fake") == 2
    assert ws.cli("gc", "--keep-last", "1").returncode == 0  # starts the tally afresh
    got = scrape(metrics.render(ws.root, 0).decode())
    assert value(got, "run_agent_runs_started_total", agent="fake") == 2


def test_a_scrape_while_runs_are_removed_sees_every_counter_grow(ws: Workspace) -> None:
    """A removal and a scrape take turns on the tally's lock: however they interleave, no scrape
    sees a removed run in neither its folder nor the tally (a fall), nor in both."""
    import threading

    from runagent.store import cleanup, runfolder
    from runagent.store.runinfo import RunInfo, RunStatus

    start, end = "2026-01-01T00:00:00+00:00", "2026-01-01T00:00:02.5+00:00"
    for t in range(12):
        task = ws.task("p", f"t{t}")
        for n in range(1, 4):
            run_id = f"20260101-00{t:02d}{n:02d}000-1"
            runfolder.create_run_folder(task, run_id)
            info = RunInfo(run_id, "p", task.task_id, n, "fake", "fake", start, "/",
                           RunStatus.COMPLETED, host="here", end_time=end, tokens_in=7 * n,
                           cost_usd=0.1)  # fmt: skip
            runfolder.write_run_info(task.run_folder(run_id), info)
    first = counters(scrape(metrics.render(ws.root, 0).decode()))
    assert value(first, "run_agent_runs_started_total", agent="fake") == 36
    removing = threading.Event()

    def remove() -> None:
        for t in range(12):
            task = ws.task("p", f"t{t}")
            if t % 2:
                cleanup.carry_out([cleanup.delete_plan(task)], ws.root)
            else:
                plan = cleanup.gc_plan(ws.root, cleanup.Retention(keep_last=1), schedule_now(), "p")
                cleanup.carry_out([d for d in plan.doomed if d.task == task], ws.root)
        removing.set()

    remover = threading.Thread(target=remove)
    remover.start()
    seen = [first]
    tally = metrics.Tally()
    while not removing.is_set():
        seen.append(counters(scrape(metrics.render(ws.root, 0, tally).decode())))
    remover.join()
    seen.append(counters(scrape(metrics.render(ws.root, 0, tally).decode())))
    for before, after in itertools.pairwise(seen):
        fell = {k: (v, after.get(k, 0.0)) for k, v in before.items() if after.get(k, 0.0) < v}
        assert not fell, fell
    assert seen[-1] == first and len(seen) > 2


def schedule_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)
