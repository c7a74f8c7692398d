"""Cron schedules: firing times across DST, overlap and catch-up policies, failing firings."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from runagent.config.file import load_config
from runagent.config.settings import Overlap, ScheduleConfig
from runagent.errors import AlreadyRunningError, ConfigError, RunAgentError
from runagent.schedule import (
    Firing,
    Scheduler,
    ScheduleState,
    load_state,
    next_firings,
    save_state,
    task_id,
)
from runagent.store.lock import TaskLock
from runagent.store.runfolder import TaskPaths

BERLIN = ZoneInfo("Europe/Berlin")


def schedule(name: str = "nightly", cron: str = "30 2 * * *", **extra: object) -> ScheduleConfig:
    values: dict[str, object] = {"timezone": "Europe/Berlin", "project": "p", "prompt": "x"}
    values.update(extra)
    return ScheduleConfig(name=name, cron=cron, task=str(values.pop("task", "{name}-{datetime}")),
                          **values)  # type: ignore[arg-type]  # fmt: skip


class Recorder:
    """The scheduler's launch seam: records firings instead of starting supervisors."""

    def __init__(self, fail_for: set[str] | None = None) -> None:
        self.fired: list[Firing] = []
        self.fail_for = fail_for or set()

    def __call__(self, firing: Firing) -> int:
        if firing.schedule.name in self.fail_for:
            raise RunAgentError("agent 'ghost' not found on PATH")
        self.fired.append(firing)
        return 4242


def walk(scheduler: Scheduler, start: datetime, end: datetime, step: timedelta) -> None:
    """Tick the scheduler at every `step` from start to end, as a clock would."""
    now = start
    scheduler.start(now)
    while now < end:
        now += step
        scheduler.tick(now)


def test_next_firings_follow_the_time_zone_across_both_dst_changes() -> None:
    s = schedule()
    spring = next_firings(s, datetime(2026, 3, 27, 12, tzinfo=BERLIN), 3)
    # 2026-03-29 has no 02:30 in Berlin: cron runs it at 03:00 CEST.
    assert [t.isoformat() for t in spring] == [
        "2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00",
    ]  # fmt: skip
    autumn = next_firings(s, datetime(2026, 10, 24, 12, tzinfo=BERLIN), 3)
    # 2026-10-25 has 02:30 twice: it fires once.
    assert [t.isoformat() for t in autumn] == [
        "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00", "2026-10-27T02:30:00+01:00",
    ]  # fmt: skip


def test_the_scheduler_fires_at_the_right_minutes_across_a_dst_change(tmp_path: Path) -> None:
    recorder = Recorder()
    scheduler = Scheduler({"nightly": schedule()}, tmp_path, recorder, log=lambda line: None)
    start = datetime(2026, 3, 27, 22, 0, tzinfo=UTC)
    walk(scheduler, start, start + timedelta(days=3), timedelta(minutes=1))
    fired = [f.at.astimezone(UTC) for f in recorder.fired]
    assert fired == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),  # 03:00 CEST: 02:30 did not exist
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]
    assert [f.task_id for f in recorder.fired] == [
        "nightly-20260328-023000", "nightly-20260329-030000", "nightly-20260330-023000",
    ]  # fmt: skip


def test_in_the_repeated_autumn_hour_no_wall_clock_time_fires_twice(tmp_path: Path) -> None:
    recorder = Recorder()
    scheduler = Scheduler({"h": schedule("h", "@hourly")}, tmp_path, recorder, log=lambda _: None)
    start = datetime(2026, 10, 24, 22, 30, tzinfo=UTC)  # 00:30 CEST on the night of the change
    walk(scheduler, start, start + timedelta(hours=6), timedelta(minutes=7))
    local = [f.at.astimezone(BERLIN) for f in recorder.fired]
    # Each local hour once: 02:00 happens twice on the clock, and fires once (as cron does).
    assert [t.hour for t in local] == [1, 2, 3, 4, 5]
    assert [t.utcoffset() for t in local] == [timedelta(hours=2)] * 2 + [timedelta(hours=1)] * 3


def hold(tmp_path: Path, project: str, task: str) -> TaskLock:
    """Make a task look running: take its lock, as a live supervisor does."""
    lock = TaskLock(TaskPaths(tmp_path, project, task).lock, f"{project}/{task}")
    lock.acquire()
    return lock


@pytest.mark.parametrize("overlap", list(Overlap))
def test_overlap_policies(tmp_path: Path, overlap: Overlap) -> None:
    recorder = Recorder()
    log: list[str] = []
    s = schedule("every", "*/10 * * * *", overlap=overlap)
    scheduler = Scheduler({"every": s}, tmp_path, recorder, log=log.append)
    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    scheduler.start(start)
    scheduler.tick(start + timedelta(minutes=10))
    first = recorder.fired[0]
    lock = hold(tmp_path, "p", first.task_id)  # the first firing is still running...
    scheduler.tick(start + timedelta(minutes=20))  # ...when the next one is due
    if overlap is Overlap.SKIP:
        assert len(recorder.fired) == 1 and any("skipped" in line for line in log)
    elif overlap is Overlap.QUEUE:
        assert len(recorder.fired) == 1 and any("queued" in line for line in log)
    else:
        assert len(recorder.fired) == 2
    lock.release()  # the first firing ends
    scheduler.tick(start + timedelta(minutes=21))
    expected = {Overlap.SKIP: 1, Overlap.QUEUE: 2, Overlap.ALLOW: 2}[overlap]
    assert len(recorder.fired) == expected
    if overlap is Overlap.QUEUE:  # the queued firing keeps its own time and task id
        assert recorder.fired[1].task_id == "every-20260601-142000"


def test_missed_firings_are_reported_not_run_in_a_burst(tmp_path: Path) -> None:
    s = schedule("q", "*/15 * * * *")
    stopped = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    save_state(tmp_path, {"q": ScheduleState(last_checked=stopped)})
    recorder, log = Recorder(), []
    Scheduler({"q": s}, tmp_path, recorder, log=log.append).start(stopped + timedelta(hours=3))
    assert recorder.fired == []
    assert any("missed 12 firing(s)" in line and "not run" in line for line in log)


def test_catch_up_runs_only_the_last_missed_firing(tmp_path: Path) -> None:
    s = schedule("q", "*/15 * * * *", catch_up=True)
    stopped = datetime(2026, 6, 1, 8, 0, tzinfo=UTC)
    save_state(tmp_path, {"q": ScheduleState(last_checked=stopped)})
    recorder = Recorder()
    Scheduler({"q": s}, tmp_path, recorder, log=lambda _: None).start(stopped + timedelta(hours=3))
    (firing,) = recorder.fired
    assert firing.at.astimezone(UTC) == datetime(2026, 6, 1, 11, 0, tzinfo=UTC)


def test_a_failing_firing_does_not_stop_the_scheduler(tmp_path: Path) -> None:
    recorder, log = Recorder(fail_for={"broken"}), []
    schedules = {
        "broken": schedule("broken", "*/5 * * * *"),
        "good": schedule("good", "*/5 * * * *"),
    }
    scheduler = Scheduler(schedules, tmp_path, recorder, log=log.append)
    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    walk(scheduler, start, start + timedelta(minutes=15), timedelta(minutes=1))
    assert [f.schedule.name for f in recorder.fired] == ["good"] * 3
    assert sum("failed: agent 'ghost' not found on PATH" in line for line in log) == 3


def test_disabled_schedules_never_fire(tmp_path: Path) -> None:
    recorder = Recorder()
    scheduler = Scheduler({"off": schedule("off", "* * * * *", enabled=False)}, tmp_path,
                          recorder, log=lambda _: None)  # fmt: skip
    start = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    walk(scheduler, start, start + timedelta(minutes=5), timedelta(minutes=1))
    assert recorder.fired == []


def test_fire_now_refuses_while_the_previous_firing_runs(tmp_path: Path) -> None:
    s = schedule("fixed", "@daily", task="fixed-task")
    scheduler = Scheduler({"fixed": s}, tmp_path, Recorder(), log=lambda _: None)
    now = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    assert scheduler.fire_now(s, now).task_id == "fixed-task"
    lock = hold(tmp_path, "p", "fixed-task")
    try:
        with pytest.raises(AlreadyRunningError, match="previous firing p/fixed-task"):
            scheduler.fire_now(s, now)
    finally:
        lock.release()


def test_task_id_templates() -> None:
    at = datetime(2026, 1, 2, 3, 4, tzinfo=BERLIN)
    assert task_id(schedule(), at) == "nightly-20260102-030400"
    assert task_id(schedule(task="{name}.{date}.{time}"), at) == "nightly.20260102.030400"
    with pytest.raises(RunAgentError, match="unknown placeholder"):
        task_id(schedule(task="{nope}"), at)


@pytest.mark.parametrize(
    "body, expected",
    [
        (
            "cron: '61 * * * *'",
            "schedules.s.cron: '61 * * * *' is not a cron expression: Bad minute",
        ),
        ("cron: '* * *'", "Wrong number of fields"),
        ("cron: '@daily'\n    timezone: Mars/Base", "schedules.s.timezone: 'Mars/Base'"),
        ("cron: '@daily'\n    prompt_file: f.md", "give exactly one of prompt and prompt_file"),
        ("cron: '@daily'\n    overlap: sometimes", "schedules.s.overlap: 'sometimes'"),
        ("cron: '@daily'\n    enabled: maybe", "schedules.s.enabled: 'maybe' is not true or false"),
        ("cron: '@daily'\n    agent: nobody", "schedules.s.agent: unknown agent 'nobody'"),
    ],
)
def test_bad_schedules_name_the_schedule_and_the_field(
    tmp_path: Path, body: str, expected: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"schedules:\n  s:\n    project: p\n    prompt: x\n    {body}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, ["command"], tmp_path)
    assert expected in str(info.value)


def test_a_scheduler_never_erases_a_firing_another_process_recorded(tmp_path: Path) -> None:
    """`serve`'s scheduler holds its state for hours while cron runs `schedule now`."""
    every = schedule("every", "* * * * *")
    nightly = schedule()
    server = Scheduler(
        {"every": every, "nightly": nightly}, tmp_path, Recorder(), log=lambda _: None
    )
    cron = Scheduler({"every": every, "nightly": nightly}, tmp_path, Recorder(), log=lambda _: None)
    start = datetime(2026, 6, 1, 12, 0, 30, tzinfo=UTC)
    server.start(start)
    fired = cron.fire_now(nightly, start + timedelta(seconds=5))
    server.tick(start + timedelta(minutes=1))  # fires `every`, and writes the state back
    state = load_state(tmp_path)
    assert state["nightly"].last_task == fired.task_id
    assert state["every"].last_task is not None


def test_concurrent_writers_each_keep_their_firing(tmp_path: Path) -> None:
    names = [f"s{i}" for i in range(12)]
    schedules = {n: schedule(n, "0 0 1 1 *") for n in names}
    at = datetime(2026, 6, 1, 12, 0, 0, tzinfo=UTC)
    errors: list[BaseException] = []

    def writer(name: str) -> None:
        try:
            mine = Scheduler(schedules, tmp_path, Recorder(), log=lambda _: None)
            mine.start(at)
            mine.fire_now(schedules[name], at)
            mine.tick(at + timedelta(seconds=30))
        except BaseException as exc:  # surfaced below; a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    state = load_state(tmp_path)
    assert all(state[n].last_task == f"{n}-20260601-140000" for n in names), state


class FolderRecorder(Recorder):
    """Records firings and creates each firing's task folder, as a real launch does."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root

    def __call__(self, firing: Firing) -> int:
        (self.root / firing.schedule.project / firing.task_id).mkdir(parents=True)
        return super().__call__(firing)


def test_every_firing_gets_its_own_task_even_within_one_second(tmp_path: Path) -> None:
    recorder = FolderRecorder(tmp_path)
    nightly = schedule(overlap=Overlap.ALLOW)
    scheduler = Scheduler({"nightly": nightly}, tmp_path, recorder, log=lambda _: None)
    at = datetime(2026, 6, 1, 21, 55, 8, 123456, tzinfo=UTC)
    ids = [scheduler.fire_now(nightly, at).task_id for _ in range(3)]
    assert load_state(tmp_path)["nightly"].last_fired == at.replace(microsecond=0)
    assert ids == [
        "nightly-20260601-235508",
        "nightly-20260601-235508-2",
        "nightly-20260601-235508-3",
    ]
    daily = schedule("daily", task="{name}-{date}", overlap=Overlap.ALLOW)
    assert task_id(daily, at, tmp_path) == task_id(daily, at + timedelta(minutes=1), tmp_path)


def test_a_schedules_keep_lets_go_of_old_firings_but_never_a_running_one(tmp_path: Path) -> None:
    from runagent.config.settings import ScheduleKeep
    from runagent.store import runfolder as rf
    from runagent.store import taskfolder
    from runagent.store.runinfo import RunInfo, RunStatus

    keep = ScheduleKeep(last=2, older_than=3600.0)
    nightly = schedule(keep=keep)
    now = datetime(2026, 6, 10, 12, tzinfo=UTC)
    made = []
    for day in range(1, 6):  # five finished firings, a day apart, ended long ago
        task = TaskPaths(tmp_path, "p", f"nightly-2026060{day}-023000")
        folder = rf.create_run_folder(task, f"2026060{day}-023000000-1")
        rf.write_run_info(folder, RunInfo(folder.name, "p", task.task_id, 1, "a", "command",
                          "t", "/", status=RunStatus.COMPLETED,
                          end_time=f"2026-06-0{day}T02:31:00+00:00"))  # fmt: skip
        task.done.write_text("done")
        made.append(task)
    by_hand = TaskPaths(tmp_path, "p", "nightly-by-hand")  # not a name the template makes
    taskfolder.write_task_prompt(by_hand, "x")
    with TaskLock(made[0].lock, made[0].label):  # the oldest is running again: never touched
        scheduler = Scheduler({"nightly": nightly}, tmp_path, Recorder(), log=lambda _: None)
        scheduler.start(now)
        scheduler.tick(now + timedelta(seconds=30))
        assert [t.folder.exists() for t in made] == [True, False, False, True, True]
    assert by_hand.folder.exists()
    young = schedule(keep=ScheduleKeep(last=0, older_than=30 * 86400.0))
    assert Scheduler({"nightly": young}, tmp_path, Recorder()).state == {}  # built, nothing run
    from runagent.schedule import expired

    assert expired(tmp_path, young, now) == []  # all younger than 30 days: kept


def test_keep_in_the_config_says_what_to_keep(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    base = "schedules:\n  s:\n    cron: '@daily'\n    project: p\n    prompt: x\n    keep: "
    config.write_text(base + "{last: 3, older_than: 7d, failed: true}\n")
    keep = load_config(config, ["command"], tmp_path).schedules["s"].keep
    assert keep is not None and (keep.last, keep.older_than, keep.failed) == (3, 604800.0, True)
    config.write_text(base + "{failed: true}\n")
    with pytest.raises(ConfigError, match=r"schedules\.s\.keep: say what to keep"):
        load_config(config, ["command"], tmp_path)
