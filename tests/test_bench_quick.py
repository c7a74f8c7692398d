"""The benches in a quick mode, so that none rots: each runs to its table (nothing here looks at
the figures; docs/performance.md quotes full runs). Every script in bench/ runs here with
`--quick` (small sizes), but listing.py; those that need what CI installs (Ray, chromium, the real
agent CLIs) are skipped without it only outside CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from runagent.ops.sandbox import Bwrap

BENCH = Path(__file__).resolve().parent.parent / "bench"


def quick(name: str, timeout: float = 240) -> str:
    """What `bench/NAME --quick` printed; it must exit 0."""
    done = subprocess.run(
        [sys.executable, str(BENCH / name), "--quick"],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def needs_ray() -> None:
    try:
        import ray  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        pytest.skip("the ray extra is not installed (pip install -e '.[ray]')")


def needs_claude() -> None:
    # The real claude CLI against the fake model provider (CI installs it, as for tests/e2e).
    from tests.e2e.test_real_clis import BIN

    if not (BIN / "claude").exists() and not os.environ.get("CI"):
        pytest.skip(f"the real claude CLI is not installed in {BIN}")


def test_the_four_benches_of_run_all_print_their_figures() -> None:
    out = quick("run_all.py", timeout=400)  # overhead, throughput, idle_cpu, restart_latency
    assert out.count("exited 0 after") == 4, out
    assert "run-agent job adds" in out and "run-agent list (empty root) adds" in out
    assert "where the median goes:" in out and "ratio, less the fixed cost" in out
    assert "goal: supervisor under" in out and "agent exit -> next agent start" in out


def test_the_policy_bench_times_decisions_beside_a_spawn() -> None:
    out = quick("policy.py")
    assert "first decision (loads the bash grammar)" in out and "policy decision" in out, out
    assert "median decision / median spawn" in out


def test_the_ops_bench_times_batches_and_the_policy() -> None:
    out = quick("ops.py")
    assert "createFile" in out and "readFile" in out, out
    assert "policy decision per command" in out and "`shell` op `true` via the runtime" in out


def test_the_paste_bench_times_a_round_and_a_reply_of_files() -> None:
    out = quick("paste.py")
    assert "reply saved -> next outbox" in out and "CREATE_FILE blocks" in out, out


def test_the_sse_bench_measures_one_client_and_many() -> None:
    out = quick("sse_latency.py")
    rows = [line.split()[0] for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert rows == ["1", "10"], out


def test_the_surface_bench_measures_a_token_and_mcp_beside_rest() -> None:
    out = quick("surface.py")
    assert "GET /api/health with the api_key" in out and "task_status over /mcp" in out, out


def test_the_fleet_bench_runs_its_tasks_under_the_cap() -> None:
    out = quick("fleet.py")
    assert "completed: 6 of 6" in out and "started in submission order (FIFO)" in out, out
    assert "a freed slot to the next run's start" in out


def test_the_budget_bench_measures_the_overshoot_of_claude_and_the_fake_agent() -> None:
    needs_claude()
    out = quick("budget.py")
    assert [line.split()[0] for line in out.splitlines() if "; budget " in line] == [
        "claude", "fake"
    ], out  # fmt: skip


@pytest.mark.skipif(
    not Path(shutil.which("chromium") or "/usr/bin/chromium").exists() and not os.environ.get("CI"),
    reason="chromium is not installed: apt-get install chromium (CI installs it)",
)
def test_the_page_bench_times_a_log_in_chromium() -> None:
    out = quick("page.py")
    assert "built 2000 lines" in out and "last line" in out and "search" in out, out


def test_the_cluster_bench_measures_ray_beside_local() -> None:
    needs_ray()
    out = quick("cluster.py", timeout=400)
    assert "dispatch median (ms)" in out and "3 tasks all running (s)" in out, out
    assert "memory per task, by host" in out


def test_the_cluster_queue_bench_measures_the_queue_on_ray_beside_local() -> None:
    needs_ray()
    out = quick("cluster_queue.py", timeout=400)
    assert "local" in out and "ray" in out, out


@pytest.mark.skipif(Bwrap(Path("/")).problem() is not None, reason="bubblewrap cannot run here")
def test_the_sandbox_bench_measures_each_kind_side_by_side() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / "sandbox.py"), "--quick"],
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
    out = quick("pause.py")
    assert "runs of lim that found the limit" in out, out
    assert "most slots held by loops waiting the limit out" in out
    assert "tasks completed" in out


def test_the_session_bench_measures_a_continued_attempt_beside_a_fresh_one() -> None:
    needs_claude()
    out = quick("session.py")
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("claude")]
    assert [row[1] for row in rows] == ["continue", "fresh"], out


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


def test_the_listing_bench_builds_in_processes_and_times_the_index_alone() -> None:
    """What a million runs are measured with: the root built by two processes, each a share
    of the tasks, and only the index's path timed."""
    done = subprocess.run(
        [sys.executable, str(BENCH / "listing.py"), "--quick", "--jobs", "2", "--index-only"],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "built 50 runs over 10 tasks as the supervisor writes them" in done.stdout
    line = next(x for x in done.stdout.splitlines() if x.startswith("run-agent list --json"))
    assert line.split()[4] == "-", line  # no old path timed


def test_every_bench_runs_here() -> None:
    sys.path.insert(0, str(BENCH))
    try:
        from run_all import BENCHES
    finally:
        sys.path.remove(str(BENCH))
    here = Path(__file__).read_text(encoding="utf-8")
    left = {p.name for p in BENCH.glob("*.py")} - {"__init__.py", "serving.py"}  # no bench
    assert {name for name in left if f'"{name}"' not in here and name not in BENCHES} == set()
    assert all("--quick" in (BENCH / name).read_text(encoding="utf-8") for name in left)


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
