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


def test_the_cluster_command_bench_measures_each_command_beside_a_local_one() -> None:
    """Each command a new process on a real Ray cluster, through the broker and joining, beside
    the local executor, and a freed slot's hand-over (its own in-process cluster, stopped)."""
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")
    done = subprocess.run(
        [sys.executable, str(BENCH / "cluster_cli.py"), "--quick"],
        capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for row in ("run, to the agent's first act", "run --detach, to its return", "list",
                "stop -p b -t T", "the first run, starting the broker"):  # fmt: skip
        assert row in done.stdout, done.stdout
    assert "a freed slot to the next start" in done.stdout, done.stdout
