#!/usr/bin/env python3
"""A stand-in agent for trying run-agent with no agent CLI and no network.

It reads its prompt from stdin, "works" for a moment, and fails its first N attempts (counted in
a file in the task folder), so one `run-agent` command shows a failure, a restart and a
completion. Usage: flaky-agent.py [--fail N] [--seconds S]
"""

import argparse
import os
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--fail", type=int, default=1, help="fail this many attempts first")
parser.add_argument("--seconds", type=float, default=1.5, help="how long each attempt works")
args = parser.parse_args()

prompt = sys.stdin.read()
task_folder = Path(os.environ["TASK_FOLDER"])
counter = task_folder / "flaky-agent-attempts"
attempt = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(attempt))

print(f"flaky-agent: attempt {attempt}, run {os.environ['JRUN_ID']}", flush=True)
task = prompt.split("## Task", 1)[-1].strip()
print(f"flaky-agent: the task is: {task}", flush=True)
for step in range(1, 4):
    time.sleep(args.seconds / 3)
    print(f"flaky-agent: working... step {step}/3", flush=True)
if attempt <= args.fail:
    print(f"flaky-agent: attempt {attempt} failed on purpose (--fail {args.fail})", file=sys.stderr)
    sys.exit(1)
print(f"flaky-agent: done after {attempt} attempts.", flush=True)
