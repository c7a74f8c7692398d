"""The queue at depth: admission and hand-over with 10, 100, 1,000 and 10,000 queued records, this
code beside the code of another git ref (default `main`), from one run.

For each depth, a runs root under `limits: {max_running: S}` (default 2): S tasks started
through the door (`Service.start`) hold the slots (agents that wait for a file), then the queue
is filled: its first record through the door, the others copies of it as the door writes them
(the record with its task, command line and place changed; the task's folder with its TASK.md).
Then, with the keeper the door started:

- a start admitted: K more starts through the door (`Service.start`, as `serve` runs one for
  `POST /api/tasks`), each answered as queued; the median and the slowest (after one start left
  out, with the process's imports and the index of the queue copied in behind its back, and
  once the keeper is quiet again: its first look at the copies checks each once);
- the keeper's memory (RSS; its fork server's beside it) and the CPU the keeper and a
  `run-agent serve` on the root take while nothing changes (a percentage of one core over a
  few seconds);
- a freed slot to the next start: the holders' agents end, and the keeper starts the queue's
  head as each slot frees, each an agent that sleeps a second; from the end of the run that freed
  a slot to the start of the next (the runs' own run-info times), median over H hand-overs.

The other ref's code is `git archive`d into a temporary folder and run the same way (its
modules first on PYTHONPATH, for the door, the keeper and the supervisors alike); by default
only up to 1,000 queued, where each of its starts takes seconds (`--against-up-to`). Nothing
asserts on speed; every process it starts is stopped and its temp folders removed.

    python bench/queue_depth.py [--sizes 10 100 1000 10000] [--against main] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKER = "run-agent-bench-queue-depth"


# The measurement of one depth, in a process of its own whose `runagent` is the code measured.


def measure(size: int, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    import psutil
    import yaml

    import backends
    from runagent.fleet import gate
    from runagent.fleet.queue import Fleet
    from runagent.service import Service, StartRequest
    from runagent.store.runfolder import TaskPaths

    root, go = work / "runs", work / "go"
    root.mkdir()
    config = work / "config.yaml"
    hold = ["bash", "-c", f"while [ ! -e {go} ]; do sleep 0.2; done", MARKER]
    short = ["bash", "-c", f"sleep {args.agent_seconds}", MARKER]
    config.write_text(yaml.safe_dump({
        "agents": {"hold": {"type": "command", "command": hold},
                   "short": {"type": "command", "command": short}},
        "defaults": {"agent": "short", "max_restarts": 0, "idle_timeout": 0},
        "storage": {"runs_dir": str(root)}, "limits": {"max_running": args.slots},
    }))  # fmt: skip
    door = Service(root, config_path=config, backend_names=backends.known(), workdir=work)
    import runagent

    figures: dict[str, Any] = {"size": size, "code": str(Path(runagent.__file__).parent)}
    serve: subprocess.Popen[bytes] | None = None
    try:
        from runagent.config.overrides import LoopOverrides

        for n in range(args.slots):
            holder = TaskPaths(root, "q", f"hold{n}")
            door.start(StartRequest(holder, "hold", overrides=LoopOverrides(agent="hold")))
        fleet = Fleet(root)
        began = time.monotonic()
        first = TaskPaths(root, "q", _name(0))
        assert door.start(StartRequest(first, "work")).queued is not None, "not queued"
        _copies(fleet, first, size)
        figures["build_s"] = time.monotonic() - began
        warm = door.start(StartRequest(TaskPaths(root, "a", "warm"), "work"))
        assert warm.queued is not None, "the warm-up start was not queued"
        keeper = _keeper(root)
        if keeper is not None:
            _quiet(fleet, keeper, args.quiet)
        admitted = []
        for n in range(args.starts):
            task = TaskPaths(root, "a", f"s{n:03d}")
            began = time.monotonic()
            started = door.start(StartRequest(task, "work"))
            admitted.append((time.monotonic() - began) * 1000)
            assert started.queued is not None, f"{task.label} was not queued"
        figures["admit_ms"] = admitted
        time.sleep(args.settle)
        figures["keeper_rss_mib"] = keeper.memory_info().rss / 2**20 if keeper else None
        server = _fork_server(keeper) if keeper else None
        figures["fork_server_rss_mib"] = server.memory_info().rss / 2**20 if server else None
        figures["keeper_cpu"] = _cpu(keeper, args.idle) if keeper else None
        serve = _serve(config, root)
        time.sleep(args.settle)
        figures["serve_cpu"] = _cpu(psutil.Process(serve.pid), args.idle)
        figures["hand_over_ms"] = _hand_overs(root, go, size, args)
        gate.hold_queue(root, "the bench")  # no more starts: the bench is done
        figures["keeper_rss_after_mib"] = keeper.memory_info().rss / 2**20 if keeper else None
    finally:
        go.touch()
        if serve is not None:
            _end(serve.pid)
        _end_ours(root)
    return figures


def _name(n: int) -> str:
    return f"t{n:05d}"


def _copies(fleet: Any, first: Any, size: int) -> None:
    """The queue filled to `size` records behind the first, each a copy of the record the door
    wrote (its task, command line and place its own) and its task's folder with its TASK.md."""
    from runagent.store import runfolder

    path = fleet.queue / f"{first.project_id}@{first.task_id}.json"
    record = json.loads(path.read_text())
    prompt = first.task_md.read_text()
    seq = record["seq"]
    for n in range(1, size):
        name = _name(n)
        copy = dict(record, task=name, seq=seq + n)
        argv = list(record["start"]["argv"])
        argv[argv.index("--task") + 1] = name
        copy["start"] = dict(record["start"], argv=argv)
        folder = first.folder.parent / name
        folder.mkdir(mode=0o700)
        _write(folder / "TASK.md", prompt)  # as the door writes them, less each one's fsync
        _write(fleet.queue / f"{first.project_id}@{name}.json", json.dumps(copy))
    runfolder.atomic_write(fleet.folder / "seq", f"{seq + size}\n")


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8", opener=lambda p, f: os.open(p, f, 0o600)) as out:
        out.write(text)


def _quiet(fleet: Any, proc: Any, seconds: float) -> None:
    """Wait for the keeper's look at a queue copied in behind its back (its first checks every
    record once) to end: the queue's lock taken once it has begun, then (up to `seconds`) the
    keeper under a tenth of a core for a second."""
    time.sleep(1.0)
    with fleet.locked():
        pass
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _cpu(proc, 1.0) > 10:
        pass


def _keeper(root: Path) -> Any:
    import psutil

    for _ in range(100):
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if "runagent.executors.keeper" in cmdline and str(root.resolve()) in cmdline:
                return proc
        time.sleep(0.1)
    return None


def _fork_server(keeper: Any) -> Any:
    """The keeper's fork server, if it has one (this code's keeper forks each supervisor from
    it; an older one started each as a new interpreter)."""
    for child in keeper.children():
        try:
            if "runagent.executors.forkserver" in child.cmdline():
                return child
        except Exception:  # gone meanwhile
            continue
    return None


def _cpu(proc: Any, seconds: float) -> float:
    """The percentage of one core `proc` used over `seconds`."""
    before = sum(proc.cpu_times()[:2])
    time.sleep(seconds)
    return (sum(proc.cpu_times()[:2]) - before) / seconds * 100


def _serve(config: Path, root: Path) -> subprocess.Popen[bytes]:
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "runagent", "serve", "--config", str(config), "--root", str(root),
         "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    _end(proc.pid)
    raise SystemExit("serve did not come up")


def _hand_overs(root: Path, go: Path, size: int, args: argparse.Namespace) -> list[float]:
    """The holders' agents end; the keeper starts the queue's head as each slot frees. From the
    end of each run that freed a slot to the start of the run that took it (run-info times)."""
    from runagent.store.runfolder import TaskPaths, read_run_info

    go.touch()
    wanted = min(args.hand_overs, size)
    heads = [TaskPaths(root, "q", _name(n)) for n in range(wanted)]
    deadline = time.monotonic() + 120 + wanted * (args.agent_seconds + 30)
    while time.monotonic() < deadline and not all(h.run_ids() for h in heads):
        time.sleep(0.1)
    time.sleep(args.agent_seconds + 1)  # the last ones end
    runs = []
    for project in ("q", "a"):
        folder = root / project
        for task in sorted(folder.iterdir()) if folder.is_dir() else []:
            paths = TaskPaths(root, project, task.name)
            for run_id in paths.run_ids():
                info = read_run_info(paths.run_folder(run_id))
                if info is not None:
                    end = _stamp(info.end_time) if info.end_time else None
                    runs.append((_stamp(info.start_time), end))
    starts = sorted(s for s, _ in runs)
    ends = sorted(e for _, e in runs if e is not None)
    slots = args.slots
    return [(starts[k] - ends[k - slots]) * 1000 for k in range(slots, len(starts))
            if k - slots < len(ends) and starts[k] >= ends[k - slots]]  # fmt: skip


def _stamp(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _end(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _end_ours(root: Path) -> None:
    """Every process of this root (the keeper, supervisors, their agents) stopped."""
    import psutil

    for _ in range(3):
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if str(root) in cmdline or str(root.resolve()) in cmdline or MARKER in cmdline:
                found.append(proc)
        for proc in found:
            try:
                proc.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(found, timeout=5)
        if not found:
            return


# The runs: each depth in a child process, this code and the other ref's side by side.


def child(code: Path, size: int, args: argparse.Namespace) -> dict[str, Any] | None:
    work = Path(tempfile.mkdtemp(prefix="bench-queue-depth-", dir=args.tmp))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), str(REPO)]))
    argv = [sys.executable, str(Path(__file__).resolve()), "--one", str(size), "--work",
            str(work), *_passed(args)]  # fmt: skip
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=args.timeout,
                              stdin=subprocess.DEVNULL, cwd=str(code))  # fmt: skip
    except subprocess.TimeoutExpired:
        print(f"  {size:,} queued: over {args.timeout:.0f} s, left off", file=sys.stderr)
        return None
    finally:
        _end_ours(work / "runs")
        shutil.rmtree(work, ignore_errors=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"the bench at {size} queued failed in {code}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _passed(args: argparse.Namespace) -> list[str]:
    return ["--slots", str(args.slots), "--starts", str(args.starts), "--hand-overs",
            str(args.hand_overs), "--idle", str(args.idle), "--settle", str(args.settle),
            "--agent-seconds", str(args.agent_seconds), "--quiet", str(args.quiet)]  # fmt: skip


def checkout(ref: str, into: Path) -> Path | None:
    """The code of git ref `ref` of this repository, in folder `into`; None without one."""
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", ref, "runagent", "backends", "server"],
            capture_output=True, check=True, timeout=120,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    # Its supervisors read bytecode, as this code's do: a shell that turns writing it off
    # would otherwise have each new interpreter compile every module it loads.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(into)], check=True)
    return into


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000])
    ap.add_argument(
        "--against",
        default=None,
        help="the git ref to measure beside (default main; '' none; none with --quick)",
    )
    ap.add_argument("--against-up-to", type=int, default=1000)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--starts", type=int, default=10)
    ap.add_argument("--hand-overs", type=int, default=8)
    ap.add_argument("--idle", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=1.0)
    ap.add_argument("--agent-seconds", type=float, default=1.0)
    ap.add_argument("--quiet", type=float, default=60.0, help="seconds to wait for the keeper")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--tmp", default=None)
    ap.add_argument("--quick", action="store_true", help="10 and 100 queued, a few starts")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.work, args)))
        return 0
    if args.quick:  # the code paths, not the figures (tests/test_bench_quick.py)
        args.sizes, args.starts, args.hand_overs = [10, 100], 2, 2
        args.idle, args.settle, args.agent_seconds, args.quiet = 0.5, 0.2, 0.3, 5.0
    if args.against is None:
        args.against = "" if args.quick else "main"
    scratch = Path(tempfile.mkdtemp(prefix="bench-queue-depth-code-"))
    try:
        other = checkout(args.against, scratch / "other") if args.against else None
        results: dict[int, dict[str, Any]] = {}
        for size in args.sizes:
            mine = child(REPO, size, args)
            old = child(other, size, args) if other and size <= args.against_up_to else None
            results[size] = {"this": mine, "other": old}
            print(f"  {size:,} queued measured", file=sys.stderr, flush=True)
        report(results, args)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


ROWS = (
    ("a start admitted, median (ms)", "admit_ms", "median"),
    ("a start admitted, slowest (ms)", "admit_ms", "max"),
    ("freed slot to next start, median (ms)", "hand_over_ms", "median"),
    ("keeper RSS (MiB)", "keeper_rss_mib", "value"),
    ("its fork server's RSS (MiB)", "fork_server_rss_mib", "value"),
    ("keeper CPU while idle (% of a core)", "keeper_cpu", "value"),
    ("serve CPU while idle (% of a core)", "serve_cpu", "value"),
)


def report(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> None:
    load = os.getloadavg()[0]
    against = args.against or "none"
    print(f"the queue at depth: {args.slots} slots, {args.starts} starts, {args.hand_overs} "
          f"hand-overs, agents of {args.agent_seconds:g} s; {os.cpu_count()} cores, load "
          f"{load:.1f}; this code beside {against}")  # fmt: skip
    print(f"{'':40}{'queued':>8}{'this':>10}{against:>10}{'ratio':>8}")
    for label, key, how in ROWS:
        for size, pair in results.items():
            mine, old = _figure(pair["this"], key, how), _figure(pair["other"], key, how)
            ratio = f"x{old / mine:.1f}" if mine and old else "-"
            print(f"{label:40}{size:>8,}{_shown(mine):>10}{_shown(old):>10}{ratio:>8}")
    print("goals at 10,000 queued: a start admitted under 50 ms, a freed slot to the next start "
          "under 200 ms median, the keeper under 50 MiB")  # fmt: skip


def _figure(found: dict[str, Any] | None, key: str, how: str) -> float | None:
    if found is None or found.get(key) is None:
        return None
    value = found[key]
    if how == "median":
        return statistics.median(value) if value else None
    if how == "max":
        return max(value) if value else None
    return float(value)


def _shown(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


if __name__ == "__main__":
    sys.exit(main())
