"""Stuck detection: the loop stops an agent that fails the same way, or changes nothing, N
attempts in a row, and says what it saw; never one that makes progress, never with --no-stuck."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from runagent.loop import stuck
from runagent.store.runinfo import Reason
from tests.conftest import Workspace
from tests.gitrepo import GIT_ENV, make_repo

FAIL = ["--exit", "1", "--stderr", "Error: cannot find module 'left-pad' (pid 4242, 0x7f3a9b2c)"]


def test_the_same_failure_three_times_stops_the_loop_as_stuck(ws: Workspace) -> None:
    ws.write_config(FAIL, max_restarts=10, stuck_after=3)
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == 5, done.stderr
    assert "is stuck: 3 attempts in a row failed the same way (exit 1:" in done.stderr
    runs = ws.runs()
    assert len(runs) == 3  # not the 11 max_restarts allows
    assert runs[-1].reason is Reason.STUCK and "cannot find module" in (runs[-1].message or "")
    assert [r.reason for r in runs[:-1]] == [Reason.EXIT_CODE, Reason.EXIT_CODE]


def test_no_stuck_turns_it_off_for_one_loop_only(ws: Workspace) -> None:
    ws.write_config(FAIL, max_restarts=4, stuck_after=2)
    done = ws.cli("-p", "p", "-t", "t", "--no-stuck", "go")
    assert done.returncode == 1 and "gave up after 5 failed attempts" in done.stderr
    assert all(r.reason is Reason.EXIT_CODE for r in ws.runs())
    again = ws.cli("resume", "-p", "p", "-t", "t", "--max-restarts", "5")
    assert again.returncode == 5  # --no-stuck was for that loop only
    refused = ws.cli("-p", "p", "-t", "u", "--no-stuck", "--stuck-after", "2", "go")
    assert refused.returncode == 2 and "contradict" in refused.stderr


def test_an_agent_of_its_own_sets_its_own_limit(ws: Workspace) -> None:
    ws.write_config(FAIL, max_restarts=10, stuck_after=0)
    data = yaml.safe_load(ws.config.read_text())
    data["agents"]["fake"]["stuck_after"] = 2
    ws.config.write_text(yaml.safe_dump(data))
    done = ws.cli("-p", "p", "-t", "t", "go")
    assert done.returncode == 5 and "2 attempts in a row failed the same way" in done.stderr
    assert len(ws.runs()) == 2


def test_a_loop_that_completes_before_the_limit_is_never_stuck(ws: Workspace) -> None:
    # Attempts 1-2 fail the same way, then the third completes.
    ws.write_config(["--fail-first", "2", "--fail-code", "7", "--counter", "n"], max_restarts=6,
                    stuck_after=3)  # fmt: skip
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 0


def test_what_varies_between_runs_of_one_failure_is_set_aside() -> None:
    one = stuck.normalize(
        "\x1b[31mError\x1b[0m at 12:01:02 in run 20261125-031200-881\nid deadbeef99\n"
    )
    two = stuck.normalize("Error at 09:59:00 in run 20261126-101500-42\nid 0123abcd45\n\n")
    assert one == two == ["Error at #:#:# in run #-#-#", "id #"]
    assert stuck.normalize("Error: a") != stuck.normalize("Error: b")


def test_progress_in_a_git_working_tree_is_a_new_commit_or_a_new_change(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    env = {**os.environ, **GIT_ENV}
    before = stuck.Progress.before(repo, env)
    assert before.git is not None and not before.changed(env)
    (repo / "new.txt").write_text("x")
    assert before.changed(env)
    runs = repo / "runs"
    runs.mkdir()
    (runs / "log").write_text("y")  # the runs root inside the tree is not the agent's work
    mid = stuck.Progress.before(repo, env, skip=(runs,))
    (runs / "log").write_text("z")
    assert not mid.changed(env)


def test_progress_elsewhere_is_any_file_written_since_the_attempt_began(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    (folder / "sub").mkdir(parents=True)
    (folder / "old.txt").write_text("old")
    os.utime(folder / "old.txt", (1, 1))
    os.utime(folder / "sub", (1, 1))
    skip = folder / "runs"
    skip.mkdir()
    os.utime(skip, (1, 1))
    before = stuck.Progress.before(folder, {}, skip=(skip,))
    assert before.git is None and not before.changed({})
    (skip / "run.log").write_text("not progress")
    assert not before.changed({})
    (folder / "sub" / "new.txt").write_text("progress")
    assert before.changed({})


def test_a_stuck_loop_tells_a_person_what_answers_it(ws: Workspace) -> None:
    told = ws.path / "told.jsonl"
    ws.write_config(FAIL, max_restarts=10, stuck_after=2)
    data = yaml.safe_load(ws.config.read_text())
    # One write each, appended: notifications are sent from threads, maybe at the same time.
    write = ("import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT);"
             " os.write(fd, sys.stdin.buffer.read() + b'\\n')")  # fmt: skip
    data["notify"] = {"command": ["python3", "-c", write, str(told)]}
    ws.config.write_text(yaml.safe_dump(data))
    assert ws.cli("-p", "p", "-t", "t", "go").returncode == 5
    events = [json.loads(line) for line in told.read_text().splitlines() if line.strip()]
    (needs,) = [e for e in events if e["event"] == "needs_input"]
    assert needs["waits_for"] == "stuck" and "is stuck: 2 attempts" in needs["message"]
    assert needs["answer"] == "run-agent resume -p p -t t"
    assert [e["event"] for e in events].count("gave_up") == 1
