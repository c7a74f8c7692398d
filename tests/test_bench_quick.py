"""The benches in a quick mode, so that none rots: each runs to its table (nothing here looks at
the figures; docs/performance.md quotes full runs)."""

from __future__ import annotations

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
