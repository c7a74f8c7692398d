"""What the paste channel costs a person: from a reply saved in the inbox to the next outbox,
and what reading and carrying out a large reply takes, beside doing the same work directly.

1. A real `run-agent --agent paste` loop in a temporary folder; replies of one CREATE_FILE each
   are moved into the inbox one after another, and the time from the rename to the next outbox
   appearing is taken (median over --rounds). That time is the inbox's settle time (a reply must
   be unchanged for inbox.SETTLE seconds before it is read) plus the work; the ratio to SETTLE
   says what the work adds.
2. A reply of --files CREATE_FILE blocks (4 KiB each) parsed and carried out through the ops
   runtime (sandbox, policy, journals), beside writing the same files with plain open/write.

    python bench/paste.py [--rounds 5] [--files 200] [--quick]

No assertion on speed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from runagent.config.settings import Approvals
from runagent.ops.runtime import Runtime
from runagent.ops.waiting import Waiter
from runagent.paste import inbox
from runagent.paste.apply import Applier
from runagent.paste.parser import parse


def wait(path_glob: Path, pattern: str, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(path_glob.glob(pattern)):
            return time.monotonic()
        time.sleep(0.005)
    raise SystemExit(f"no {pattern} in {path_glob} after {timeout}s")


def round_trip(rounds: int) -> list[float]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "ws").mkdir()
        argv = [sys.executable, "-m", "runagent", "--root", str(base / "runs"), "-p", "b",
                "-t", "t", "-a", "paste", "--cwd", str(base / "ws"), "bench"]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        paste = base / "runs" / "b" / "t" / "paste"
        try:
            wait(paste / "outbox", "*_seq0001.txt")
            times = []
            for n in range(1, rounds + 1):
                staged = base / f"r{n}.txt"
                staged.write_text(f'[CREATE_FILE path="f{n}.txt"]\n{n}\n[/CREATE_FILE]\n')
                started = time.monotonic()
                os.replace(staged, paste / "inbox" / staged.name)
                times.append(wait(paste / "outbox", f"*_seq{n + 1:04d}.txt") - started)
            staged = base / "done.txt"
            staged.write_text("[DONE]\nbench\n[/DONE]\n")
            os.replace(staged, paste / "inbox" / "done.txt")
            proc.wait(30)
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(10)
        return times


def large_reply(files: int) -> tuple[float, float, float]:
    body = ("x" * 63 + "\n") * 64  # 4 KiB
    reply = "".join(
        f'[CREATE_FILE path="d{i % 10}/f{i}.txt"]\n{body}[/CREATE_FILE]\n' for i in range(files)
    )
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "ws").mkdir()
        runtime = Runtime.create(base / "run", base / "ws", "standard", shell="/bin/sh")
        waiter = Waiter(runtime, lambda line: None)
        applier = Applier(runtime, lambda events: waiter.resolve(events, Approvals.DENY))
        started = time.perf_counter()
        items = parse(reply)
        parsed = time.perf_counter() - started
        applied = applier.apply(items)
        through = time.perf_counter() - started
        assert all(r.success for r in applied.results)
        direct_root = base / "direct"
        started = time.perf_counter()
        for i in range(files):
            folder = direct_root / f"d{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"f{i}.txt").write_text(body)
        direct = time.perf_counter() - started
    return parsed, through, direct


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--files", type=int, default=200)
    args.add_argument("--quick", action="store_true", help="1 round, 10 files (for the tests)")
    a = args.parse_args()
    if a.quick:
        a.rounds, a.files = 1, 10
    times = round_trip(a.rounds)
    median = statistics.median(times)
    print(f"reply saved -> next outbox: median {median * 1000:.0f} ms over {a.rounds} rounds "
          f"(min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}); the settle time is "
          f"{inbox.SETTLE * 1000:.0f} ms, so the work adds {(median - inbox.SETTLE) * 1000:.0f} ms "
          f"(x{median / inbox.SETTLE:.2f} of settle)")  # fmt: skip
    parsed, through, direct = large_reply(a.files)
    size = a.files * 4
    print(f"a reply of {a.files} CREATE_FILE blocks ({size} KiB): parsed in "
          f"{parsed * 1000:.1f} ms; parsed and carried out through the ops runtime in "
          f"{through * 1000:.0f} ms ({through / a.files * 1000:.2f} ms a file), beside "
          f"{direct * 1000:.1f} ms writing the same files directly "
          f"(x{through / direct:.0f})")  # fmt: skip


if __name__ == "__main__":
    main()
