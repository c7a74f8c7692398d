"""The queue at depth costs what it touches: an admission through the door, the keeper's look
and a view of one queued task read a handful of records, not every one of a deep queue (counted,
never timed); the index they read is never trusted over the records (fleet/index.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

import backends
from runagent import listing
from runagent.executors import keeper
from runagent.fleet import gate, index
from runagent.fleet.queue import Fleet
from runagent.service import Service, StartRequest
from runagent.store import jsonfile, runfolder
from tests.conftest import Workspace, wait_for
from tests.fleet.test_queue import configure

DEPTH = 300


def _door(ws: Workspace) -> Service:
    return Service(ws.root, config_path=ws.config, backend_names=backends.known(),
                   workdir=ws.root.parent)  # fmt: skip


@pytest.fixture
def deep(ws: Workspace) -> Iterator[tuple[Workspace, Service]]:
    """A root whose one slot this process holds, with DEPTH detached starts queued: the first
    through the door, the others copies of its record as the door writes them."""
    configure(ws, {"max_running": 1})
    door = _door(ws)
    fleet = Fleet(ws.root)
    with fleet.locked():
        fleet.hold(ws.task("p", "holder"), "fake")  # this process: alive all along
    first = ws.task("p", "q0000")
    assert door.start(StartRequest(first, "wait")).queued is not None
    record = json.loads(fleet.record_path("p", "q0000").read_text())
    for n in range(1, DEPTH):
        name = f"q{n:04d}"
        argv = list(record["start"]["argv"])
        argv[argv.index("--task") + 1] = name
        copy = dict(record, task=name, seq=record["seq"] + n,
                    start=dict(record["start"], argv=argv))  # fmt: skip
        ws.task("p", name).folder.mkdir(parents=True)
        runfolder.atomic_write(ws.task("p", name).task_md, "wait")
        runfolder.atomic_write(fleet.record_path("p", name), json.dumps(copy))
    runfolder.atomic_write(fleet.folder / "seq", f"{record['seq'] + DEPTH}\n")
    try:
        yield ws, door
    finally:
        gate.hold_queue(ws.root, "the test")  # no start, then no record: the keeper ends
        for path in fleet.queue.glob("*.json"):
            path.unlink()
        with fleet.locked():
            fleet.index()  # built again: empty
        wait_for(lambda: not _keepers(ws.root), timeout=30, what="the keeper to end")


def _keepers(root: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if "runagent.executors.keeper" in cmdline and str(root.resolve()) in cmdline:
            found.append(proc)
    return found


class Reads:
    """Counts the queue records read (each parse of a JSON file under .fleet/queue/)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[Path] = []
        real = jsonfile.read_object

        def counted(path: Path, limit: int) -> dict[str, Any]:
            if Path(path).parent.name == "queue":
                self.paths.append(Path(path))
            return real(path, limit)

        monkeypatch.setattr(jsonfile, "read_object", counted)

    def __len__(self) -> int:
        return len(self.paths)


def test_an_admission_to_a_deep_queue_reads_a_few_records_not_every_one(
    deep: tuple[Workspace, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, door = deep
    warm = door.start(StartRequest(ws.task("p", "warm"), "wait"))  # the index built: copies
    assert warm.queued is not None and warm.queued.ahead == DEPTH, warm
    reads = Reads(monkeypatch)
    started = door.start(StartRequest(ws.task("p", "late"), "wait"))
    assert started.queued is not None and started.queued.ahead == DEPTH + 1, started
    assert 0 < len(reads) <= 4, [p.name for p in reads.paths]  # its own, before and after


def test_the_keepers_look_and_a_view_of_one_task_read_what_they_touch(
    deep: tuple[Workspace, Service], monkeypatch: pytest.MonkeyPatch
) -> None:
    ws, _ = deep
    fleet = Fleet(ws.root)
    seen = keeper.Seen()
    with fleet.locked():
        assert keeper._due(fleet, seen) == []  # its first look checks each record once
    reads = Reads(monkeypatch)
    with fleet.locked():
        assert keeper._due(fleet, seen) == []  # the slot is full: none starts
    assert len(reads) == 0, [p.name for p in reads.paths]
    last = ws.task("p", f"q{DEPTH - 1:04d}")
    view = listing.view(last)
    assert view.queue is not None and view.queue.ahead == DEPTH - 1, view.queue
    assert "max_running 1" in view.queue.waits_for
    assert len(reads) <= 2, [p.name for p in reads.paths]


def test_the_index_follows_the_records_not_the_other_way_round(
    deep: tuple[Workspace, Service],
) -> None:
    ws, door = deep
    fleet = Fleet(ws.root)
    door.start(StartRequest(ws.task("p", "warm"), "wait"))  # the index in step
    # A record changed behind the index's back (by hand, by an older run-agent): seen.
    path = fleet.record_path("p", f"q{DEPTH - 1:04d}")
    record = json.loads(path.read_text())
    runfolder.atomic_write(path, json.dumps(dict(record, priority=5)))
    place = listing.view(ws.task("p", f"q{DEPTH - 1:04d}")).queue
    assert place is not None and place.ahead == 0 and place.priority == 5, place
    started = door.start(StartRequest(ws.task("p", "after"), "wait"))
    assert started.queued is not None and started.queued.ahead == DEPTH + 1
    # A writer killed between its record and its row leaves the name dirty: read again.
    with fleet.locked():
        look = fleet.index()
        name = "p@q0001.json"
        look.mark(name)
        kept = fleet.read_record(name)
        assert kept is not None
        (fleet.queue / name).unlink()
    assert listing.view(ws.task("p", "q0001")).queue is None
    with fleet.locked():
        assert fleet.index().in_step()
        assert all(w.task != "q0001" for w in fleet.index().all())
        assert kept is not None
        fleet.put(replace(kept, seq=kept.seq))  # put back, through the one way in
    with fleet.locked():
        assert any(w.task == "q0001" for w in fleet.index().all())
    # A damaged index is built again from the records.
    (fleet.folder / index.NAME).write_bytes(b"not a database" * 100)
    with fleet.locked():
        assert len(fleet.index().all()) == DEPTH + 2


def test_an_unread_start_is_taken_from_its_record_when_a_row_is_written_back(
    ws: Workspace,
) -> None:
    configure(ws, {"max_running": 1})
    fleet = Fleet(ws.root)
    with fleet.locked():
        fleet.hold(ws.task("p", "holder"), "fake")
    door = _door(ws)
    try:
        assert door.start(StartRequest(ws.task("p", "a"), "wait")).queued is not None
        with fleet.locked():
            (row,) = fleet.index().all()
            assert row.start is index.IN_FILE
            fleet.put(replace(row, told="episode"))
        written = json.loads(fleet.record_path("p", "a").read_text())
        assert written["told"] == "episode" and written["start"]["argv"][0] == "run"
        assert os.stat(fleet.folder / index.NAME).st_mode & 0o077 == 0
    finally:
        gate.hold_queue(ws.root, "the test")
        gate.dequeue(ws.task("p", "a"))
        wait_for(lambda: not _keepers(ws.root), timeout=30, what="the keeper to end")
