"""The benches in a quick mode, so that none rots: each runs to its table (nothing here looks at
the figures; docs/performance.md quotes full runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runagent.ops.sandbox import Bwrap

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.skipif(Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here")
def test_the_sandbox_bench_measures_each_kind_side_by_side() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "sandbox.py"), "--repeat", "1"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0]: line.split() for line in done.stdout.splitlines()[2:]}
    assert set(rows) == {"plain", "sandbox", "worktree", "both"}, done.stdout
    assert rows["plain"][3] == "1.00" and all(len(row) == 7 for row in rows.values())


def test_the_clone_bench_measures_a_clone_beside_a_linked_worktree() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "git_clone.py"), "--quick"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "clone / worktree add" in done.stdout and "bring a commit back" in done.stdout


def test_the_check_bench_measures_a_checks_cost_beside_its_commands_own_time() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "check_overhead.py"), "--quick"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sum("difference of the medians" in line for line in lines) >= 2, done.stdout
    assert any("goal < 30 ms" in line for line in lines), done.stdout
    assert any(line.strip().startswith("check `true`") for line in lines), done.stdout


def test_the_race_bench_measures_the_winner_the_losers_end_and_the_shared_budget() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "race.py"), "--quick"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "the racer whose check passes won" in done.stdout, done.stdout
    assert "win to losers gone, median / max (s)" in done.stdout
    assert "3 racers spent together, budget 5,000" in done.stdout


def test_the_pause_bench_measures_a_limited_agent_beside_another() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "pause.py"), "--tasks", "2", "--slots", "1", "--limit", "3"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "runs of lim that found the limit" in done.stdout, done.stdout
    assert "most slots held by loops waiting the limit out" in done.stdout
    assert "tasks completed" in done.stdout


def test_the_session_bench_measures_a_continued_attempt_beside_a_fresh_one() -> None:
    # The real claude CLI against the fake model provider (CI installs it, as for tests/e2e).
    from tests.e2e.test_real_clis import BIN

    if not (BIN / "claude").exists() and not os.environ.get("CI"):
        pytest.skip(f"the real claude CLI is not installed in {BIN}")
    done = subprocess.run(
        [sys.executable, str(BENCH / "session.py"), "--only", "claude"],
        capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.strip().startswith("claude")]
    assert [row[1] for row in rows] == ["continue", "fresh"], done.stdout


def test_the_listing_bench_measures_the_index_beside_reading_every_run() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "listing.py"), "--quick", "--page"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "built 50 runs over 10 tasks as the supervisor writes them" in done.stdout
    for row in ("run-agent list --json (process)", "GET /api/tasks (warm server)",
                "GET /metrics, a server's first scrape", "GET /metrics, later scrapes",
                "page: the fleet view on screen"):  # fmt: skip
        assert row in done.stdout, done.stdout


def test_the_queue_depth_bench_measures_admission_and_hand_over_at_each_depth() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "queue_depth.py"), "--quick"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if "a start admitted, median" in line]
    assert [row[-4] for row in rows] == ["10", "100"], done.stdout
    assert "freed slot to next start, median (ms)" in done.stdout
    assert "keeper RSS (MiB)" in done.stdout and "serve CPU while idle" in done.stdout
