"""The executor seam without a cluster: the `executor:` section, --executor, its one-line
errors, and that nothing pays for Ray unless it is configured."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from runagent import schedule
from runagent.config.file import load_config
from runagent.config.settings import ExecutorType, ScheduleConfig
from runagent.errors import ConfigError, ExitCode
from runagent.store.host import this_host
from runagent.store.lock import TaskLock, read_holder
from tests.conftest import REPO, Workspace, slow_loops, wait_for


def test_the_executor_section_reads_into_typed_settings(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "executor:\n  type: ray\n  address: head.example:6379\n  namespace: team\n"
        "  resources: {agent_slot: 2}\n  max_restarts: 1\n  shared_root: false\n"
    )
    e = load_config(path, (), tmp_path).executor
    assert e.type is ExecutorType.RAY and e.address == "head.example:6379"
    assert e.namespace == "team" and dict(e.resources) == {"agent_slot": 2.0}
    assert e.max_restarts == 1 and e.shared_root is False
    assert load_config(None, (), tmp_path).executor.type is ExecutorType.LOCAL  # the default


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("executor: {type: rya}", "executor.type: 'rya' is not one of: local, ray"),
        ("executor: {adress: auto}", "executor.adress: unknown key; did you mean 'address'?"),
        ("executor: {address: 'head'}", "executor.address: 'head' is not auto or HOST:PORT"),
        ("executor: {resources: {agent_slot: 0}}", "executor.resources: {agent_slot: 0} is not"),
        ("executor: {max_restarts: -1}", "executor.max_restarts: -1 is not a whole number >= 0"),
    ],
)
def test_executor_errors_name_the_key_and_value(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, (), tmp_path)
    assert expected in str(info.value)


def test_a_bad_executor_option_is_a_usage_error(ws: Workspace) -> None:
    done = ws.invoke("run", "-p", "p", "-t", "t", "--executor", "slurm", "go")
    assert done.returncode == ExitCode.USAGE
    assert "'slurm' is not one of 'local', 'ray'" in done.stderr


def test_executor_may_stand_before_the_command_name_as_config_and_root_do(ws: Workspace) -> None:
    done = ws.invoke("--executor", "local", "list")
    assert done.returncode == 0, done.stderr


def test_executor_ray_without_the_extra_says_how_to_install_it(
    ws: Workspace, tmp_path: Path
) -> None:
    missing = tmp_path / "no-ray" / "ray"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n"
    )
    done = ws.cli(
        "--executor", "ray", "-p", "p", "-t", "t", "go",
        env={"PYTHONPATH": f"{missing.parent}:{REPO}"},
    )  # fmt: skip
    assert done.returncode == ExitCode.MISSING_DEPENDENCY, done.stderr
    assert done.stderr.strip().splitlines() == [
        "run-agent: executor 'ray' needs Ray, which is not installed; install it with "
        "pip install 'run-agent[ray]', or use --executor local"
    ]


def test_an_unreachable_cluster_is_one_line_and_quick(ws: Workspace) -> None:
    data = yaml.safe_load(ws.config.read_text())
    data["executor"] = {"type": "ray", "address": "127.0.0.1:9"}  # discard: nothing listens
    ws.config.write_text(yaml.safe_dump(data))
    # ray.init alone would wait minutes on an address nothing answers: a plain probe of the
    # address says so first (the command is given 3 minutes, which a loaded machine needs).
    done = ws.cli("run", "-p", "p", "-t", "t", "go", timeout=180)
    assert done.returncode == ExitCode.MISSING_DEPENDENCY, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    # The probe's own words (ray.init's failure, minutes later, names the address otherwise).
    assert (
        "cannot reach the Ray cluster at executor.address '127.0.0.1:9'" in lines[0]
        or "pip install 'run-agent[ray]'" in lines[0]  # where Ray is not installed
    ), lines
    assert not ws.task().folder.exists()  # a refused dispatch leaves no task behind


def test_importing_the_command_line_does_not_load_ray() -> None:
    found = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import runagent.cli"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stderr  # fmt: skip
    loaded = {line.rsplit("|", 1)[-1].strip() for line in found.splitlines()}
    assert not {m for m in loaded if m == "ray" or m.startswith("ray.")}
    assert "runagent.executors.ray" not in loaded
    assert (
        "runagent.executors.control" not in loaded
    )  # the one door is opened only by what starts loops


def test_a_lock_holder_names_its_host(tmp_path: Path) -> None:
    lock = TaskLock(tmp_path / "p" / "t" / ".lock", "p/t")
    with lock:
        holder = read_holder(lock.path)
        assert holder is not None and holder.host == this_host() and holder.task == "p/t"
        assert holder.alive() and holder.describe() == f"pid {holder.pid}"


def test_a_holder_on_another_host_is_judged_by_the_cluster_not_by_this_proc(
    tmp_path: Path,
) -> None:
    from runagent.store import host

    path = tmp_path / "p" / "t" / ".lock"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump({"pid": 1, "process_start": 0.0, "since": "x", "host": "far"}))
    holder = read_holder(path)
    assert holder is not None and holder.describe() == "pid 1 on host far"
    assert holder.alive()  # no cluster to ask: never called dead on a guess
    asked: list[tuple[str, str, int]] = []
    host.set_judge(lambda label, on, pid, start: bool(asked.append((label, on, pid))))
    try:
        assert not holder.alive()
        assert asked == [("p/t", "far", 1)]
    finally:
        host.set_judge(None)


def test_a_scheduler_that_does_not_lead_fires_nothing(tmp_path: Path) -> None:
    every = ScheduleConfig("every", "* * * * *", "UTC", "p", "tick-{datetime}", prompt="go")
    fired: list[str] = []

    def launch(firing: schedule.Firing) -> int:
        fired.append(firing.label)
        return 1

    s = schedule.Scheduler({"every": every}, tmp_path, launch, log=lambda line: None,
                           leader=lambda: False)  # fmt: skip
    now = datetime(2026, 1, 1, 12, 0, 30, tzinfo=UTC)
    s.start(now)
    s.tick(now + timedelta(minutes=1))
    assert fired == []


def test_a_detached_start_slower_than_ten_seconds_is_waited_for_until_it_holds_its_task(
    ws: Workspace, tmp_path: Path
) -> None:
    # Given up after 10 s, a start was said to be made (exit 0) before its loop held the task,
    # and a second start of the task then started a second loop.
    ws.write_config(["--sleep", "60"])
    env = slow_loops(tmp_path, 13)  # past START_WAIT
    try:
        first = ws.cli("--detach", "-p", "p", "-t", "t", "go", env=env, timeout=120)
        assert first.returncode == 0, first.stderr
        holder = read_holder(ws.task().lock)
        assert holder is not None and holder.alive()  # it held the task when said started
        again = ws.cli("--detach", "-p", "p", "-t", "t", "go", env=env, timeout=120)
        assert again.returncode == ExitCode.ALREADY_RUNNING, again.stderr
        assert f"already running (supervisor pid {holder.pid}" in again.stderr
    finally:
        wait_for(lambda: ws.cli("stop", "-p", "p", "-t", "t").returncode == 0 and
                 not ws.leftovers(), 120, "the loops to stop")  # fmt: skip
