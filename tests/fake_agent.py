#!/usr/bin/env python3
"""A fake agent for the tests, driven entirely by its arguments.

Every process it starts records its pid in --pid-file (one line each), and carries --marker on its
command line, so a test can find and check every process of a run.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def open_descriptors() -> list[int]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # the descriptor listdir itself used, closed by now
        found.append(int(fd))
    return sorted(found)


# Descriptors open when the agent started, read before the script opened files of its own.
INHERITED = open_descriptors()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=0, help="print this many lines to stdout")
    p.add_argument("--interval", type=float, default=0.0, help="seconds between lines")
    p.add_argument("--line-text", default="line", help="text of each line")
    p.add_argument("--codex-usage", type=int, default=0, help="tokens of each codex turn line")
    p.add_argument("--usage-lines", type=int, default=0, help="how many such lines (--interval)")
    p.add_argument(
        "--usage-kind",
        choices=("codex", "claude"),
        default="codex",
        help="the usage lines as codex turns, or as claude assistant messages",
    )
    p.add_argument(
        "--rate-limited", type=float, default=None, help="as claude limited for this many "
        "seconds (negative: no reset time): a rejected rate_limit_event, an error result, exit 1"
    )  # fmt: skip
    p.add_argument("--limited-until", default=None, help="...while the epoch in this file is "
                   "ahead (a provider's limit in time), for as long as it is")  # fmt: skip
    p.add_argument("--limited-first", type=int, default=1, help="...on the first N attempts")
    p.add_argument("--claude-result", type=float, default=None, help="a claude result: its cost")
    p.add_argument("--hold-at", type=int, action="append", default=[],
                   help="after this many lines, wait for... (repeatable, in pairs)")  # fmt: skip
    p.add_argument("--hold-for", action="append", default=[],
                   help="...this file to exist, then go on")  # fmt: skip
    p.add_argument("--stderr", default=None, help="write this to stderr")
    p.add_argument("--chunks", nargs="*", default=[], help="hex byte chunks written to stdout")
    p.add_argument("--echo-stdin", action="store_true", help="copy stdin to stdout")
    p.add_argument("--echo-env", nargs="*", default=[], help="print NAME=value for these")
    p.add_argument("--echo-argv", action="store_true", help="print argv, one per line")
    p.add_argument("--echo-fds", action="store_true", help="print the open descriptors")
    p.add_argument("--sleep", type=float, default=0.0, help="sleep this long before exiting")
    p.add_argument("--wait-for", default=None, help="block until this file exists")
    p.add_argument("--wait-in-task", default=None, help="...or this file in $TASK_FOLDER")
    p.add_argument("--exit", type=int, default=0, help="exit with this code")
    p.add_argument("--fail-first", type=int, default=0, help="exit --fail-code on the first N")
    p.add_argument("--fail-code", type=int, default=1)
    p.add_argument("--counter", default=None, help="attempt counter file ($TASK_FOLDER/...)")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM")
    p.add_argument("--grandchild", action="store_true", help="start a child that sleeps")
    p.add_argument("--setsid-grandchild", action="store_true", help="start a setsid child")
    p.add_argument("--orphan", action="store_true", help="setsid child via a parent that exits")
    p.add_argument("--wait-pids", type=int, default=0, help="wait until --pid-file has N pids")
    p.add_argument("--write-done", action="store_true", help="write DONE in $TASK_FOLDER")
    p.add_argument(
        "--commit", action="append", default=[], help="change a file and git commit it, with this"
        " message ({marker}: $COCODE_READY_MARKER; {attempt}: the attempt number)",
    )  # fmt: skip
    p.add_argument("--ready-from", type=int, default=0, help="from this attempt on, commit last"
                   " with $COCODE_READY_MARKER in the message")  # fmt: skip
    p.add_argument("--edit", default=None, help="write this file (relative to the cwd)")
    p.add_argument("--shell", default=None, help="last: run this with sh -c in the cwd")
    p.add_argument("--probe-read", action="append", default=[], help="say if PATH can be read")
    p.add_argument("--probe-write", action="append", default=[], help="say if PATH can be written")
    p.add_argument("--probe-connect", action="append", default=[], help="say if HOST:PORT answers")
    p.add_argument(
        "--symlink",
        action="append",
        default=[],
        help="LINK=TARGET: make LINK ($VARS expanded) a link to TARGET, in its stead",
    )
    p.add_argument("--pid-file", default=None, help="append our pids here")
    p.add_argument("--marker", default="", help="an inert word to find our processes by")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--middle", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--ignore-unknown", action="store_true", help="ignore the flags a CLI backend adds"
    )
    args, unknown = p.parse_known_args(argv)
    if unknown and not args.ignore_unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def record_pid(args: argparse.Namespace) -> None:
    if args.pid_file:
        try:
            with open(args.pid_file, "a") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as exc:  # a sandbox that shows the test's folder read-only
            if exc.errno != errno.EROFS:
                raise


def spawn_child(args: argparse.Namespace, *, setsid: bool, flags: list[str] | None = None) -> None:
    cmd = [sys.executable, __file__, "--child", "--marker", args.marker]
    if args.pid_file:
        cmd += ["--pid-file", args.pid_file]
    if args.ignore_term:
        cmd.append("--ignore-term")
    subprocess.Popen(
        cmd + (flags or []),
        start_new_session=setsid,
        stdin=subprocess.DEVNULL,
    )


def child(args: argparse.Namespace) -> None:
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.middle:  # start a setsid grandchild, then exit at once, orphaning it
        spawn_child(args, setsid=True)
        return
    record_pid(args)
    time.sleep(3600)


def probe(args: argparse.Namespace) -> None:
    """What this process may see and do (a sandbox's tests): one line per probe."""
    import socket

    def outcome(act: Callable[[], object]) -> str:
        try:
            act()
        except OSError as exc:
            return type(exc).__name__
        return "ok"

    for path in args.probe_read:
        print(f"read {path}: {outcome(lambda p=path: Path(p).read_bytes())}")
    for path in args.probe_write:
        print(f"write {path}: {outcome(lambda p=path: Path(p).write_text('written'))}")
    for where in args.probe_connect:
        host, _, port = where.rpartition(":")
        reach = lambda h=host, n=int(port): socket.create_connection((h, n), 3).close()  # noqa: E731
        print(f"connect {where}: {outcome(reach)}")
    sys.stdout.flush()


def commit(message: str) -> None:
    """Change a file and commit everything in the working folder with `message`."""
    with open("fake-agent-work.txt", "a") as f:
        f.write(f"{message}\n")
    subprocess.run(["git", "add", "-A"], check=True)
    subprocess.run(["git", "commit", "-q", "-m", message], check=True)


def main(argv: list[str]) -> int:
    args = parse(argv)
    if args.child:
        child(args)
        return 0
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    record_pid(args)
    attempt = 1
    if args.counter or args.fail_first or args.ready_from or args.rate_limited is not None:
        counter = Path(args.counter or Path(os.environ["TASK_FOLDER"]) / "fake-attempts")
        attempt = int(counter.read_text()) + 1 if counter.exists() else 1
        counter.write_text(str(attempt))
    if args.limited_until and os.path.exists(args.limited_until):
        until = float(Path(args.limited_until).read_text())
        if until > time.time():
            args.rate_limited, attempt, args.limited_first = until - time.time(), 1, 1
    if args.rate_limited is not None and attempt <= args.limited_first:
        # As claude's stream-json says it (the shared samples of its stream): a rejected
        # rate_limit_event with the reset time in epoch seconds, then the error result.
        info: dict[str, object] = {"status": "rejected", "rateLimitType": "five_hour"}
        if args.rate_limited >= 0:  # a negative one: a limit that says no reset time
            info["resetsAt"] = int(time.time() + args.rate_limited)
        print(json.dumps({"type": "rate_limit_event", "rate_limit_info": info}), flush=True)
        print(json.dumps({"type": "result", "subtype": "success", "is_error": True,
                          "result": "You've hit your limit"}), flush=True)  # fmt: skip
        return 1
    if args.echo_stdin:
        sys.stdout.write(sys.stdin.read())
    for name in args.echo_env:
        print(f"{name}={os.environ.get(name, '')}")
    if args.echo_argv:
        print("\n".join(sys.argv[1:]))
    if args.echo_fds:  # listed before Python opens anything of its own
        print("\n".join(str(fd) for fd in INHERITED))
    probe(args)
    sys.stdout.flush()
    if args.stderr:
        sys.stderr.write(args.stderr + "\n")
        sys.stderr.flush()
    if args.grandchild:
        spawn_child(args, setsid=False)
    if args.setsid_grandchild:
        spawn_child(args, setsid=True)
    if args.orphan:
        spawn_child(args, setsid=False, flags=["--middle"])
    while args.wait_pids and len(Path(args.pid_file).read_text().split()) < args.wait_pids:
        time.sleep(0.01)
    for n in range(args.usage_lines):
        turn = {"type": "turn.completed", "usage": {"input_tokens": args.codex_usage,
                                                     "output_tokens": 0}}  # fmt: skip
        if args.usage_kind == "claude":  # each message twice: claude repeats it per content block
            message = {"id": f"msg_{n}", "usage": {"input_tokens": args.codex_usage,
                                                   "output_tokens": 0}}  # fmt: skip
            turn = {"type": "assistant", "message": message}
            print(json.dumps(turn), flush=True)
        print(json.dumps(turn), flush=True)
        if args.interval:
            time.sleep(args.interval)
    if args.claude_result is not None:
        result = {"type": "result", "subtype": "success", "result": "done",
                  "total_cost_usd": args.claude_result,
                  "usage": {"input_tokens": 100, "output_tokens": 50}}  # fmt: skip
        print(json.dumps(result), flush=True)
    holds = dict(zip(args.hold_at, args.hold_for, strict=True))
    for i in range(1, args.lines + 1):
        print(f"{args.line_text} {i}", flush=True)
        while i in holds and not os.path.exists(holds[i]):
            time.sleep(0.02)
        if args.interval:
            time.sleep(args.interval)
    for chunk in args.chunks:  # raw writes, e.g. a UTF-8 character split across two writes
        os.write(1, bytes.fromhex(chunk))
        if args.interval:
            time.sleep(args.interval)
    if args.wait_for:
        while not os.path.exists(args.wait_for):
            time.sleep(0.02)
    if args.wait_in_task:
        while not Path(os.environ["TASK_FOLDER"], args.wait_in_task).exists():
            time.sleep(0.02)
    if args.sleep:
        time.sleep(args.sleep)
    if args.edit:
        Path(args.edit).write_text(f"edited by attempt {attempt}\n")
    for pair in args.symlink:  # what a hostile agent plants where it may write
        link, _, target = pair.partition("=")
        link = os.path.expandvars(link)
        try:
            if os.path.isdir(link) and not os.path.islink(link):
                os.rename(link, f"{link}.moved")
            elif os.path.lexists(link):
                os.unlink(link)
            os.symlink(target, link)
            print(f"symlink {link}: ok", flush=True)
        except OSError as exc:
            print(f"symlink {link}: {type(exc).__name__}", flush=True)
    for message in args.commit:
        commit(message.format(marker=os.environ.get("COCODE_READY_MARKER", ""), attempt=attempt))
    if args.ready_from and attempt >= args.ready_from:
        commit(f"finish attempt {attempt}\n\n{os.environ['COCODE_READY_MARKER']}")
    if args.shell:  # what a hostile agent does once its work is committed
        subprocess.run(["/bin/sh", "-c", args.shell], check=False)
    if args.write_done:
        Path(os.environ["TASK_FOLDER"], "DONE").write_text(f"done by {os.environ['JRUN_ID']}\n")
    if attempt <= args.fail_first:
        print(f"attempt {attempt} fails", file=sys.stderr, flush=True)
        return args.fail_code
    return args.exit


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
