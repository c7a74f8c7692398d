#!/usr/bin/env python3
"""A stand-in for the claude CLI, for trying budgets, stuck detection and a provider's limit
with no paid agent and no network.

Configure it as a `claude` agent (`type: claude`): run-agent runs it as it runs claude, with
`-p --output-format stream-json --verbose` and the prompt on stdin, and reads what it prints as
it reads claude's headless stream (the session's `system` init event, `assistant` messages
with their usage, a `rate_limit_event`, the closing `result` with its cost). Its own options
go under the agent's `args:`:

  --turns N          assistant messages it prints (default 3), one every --interval seconds
  --tokens N         input tokens each message reports (default 1000)
  --cost USD         what each message costs (default 0.01), summed in the result
  --interval S       seconds between messages (default 1)
  --limit-once S     its first attempt hits the provider's limit, which lifts in S seconds
                     (the reset time claude gives); later attempts work
  --fail             every attempt fails the same way (for stuck detection)

It writes nothing but its output, and keeps one file in the task folder
(stand-in-limited, for --limit-once). Standard library only.
"""

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path


def say(event: dict) -> None:
    print(json.dumps(event), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--cost", type=float, default=0.01)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--limit-once", type=float, default=None)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--resume", default=None)  # claude's: the session to continue
    parser.add_argument("--version", action="store_true")
    args, _ = parser.parse_known_args()  # claude's own flags (-p, --output-format, ...) too
    if args.version:
        print("0.0.0 (run-agent's stand-in for claude)")
        return 0
    prompt = sys.stdin.read()
    session = args.resume or str(uuid.uuid4())
    say(
        {
            "type": "system",
            "subtype": "init",
            "session_id": session,
            "model": "stand-in",
            "tools": [],
            "cwd": os.getcwd(),
        }
    )
    folder = Path(os.environ.get("TASK_FOLDER", "."))
    marker = folder / "stand-in-limited"
    if args.limit_once is not None and not marker.exists():
        marker.write_text(f"{time.time() + args.limit_once:.0f}\n")
        info = {
            "status": "rejected",
            "rateLimitType": "five_hour",
            "resetsAt": int(time.time() + args.limit_once),
        }
        say({"type": "rate_limit_event", "rate_limit_info": info, "session_id": session})
        say(
            {
                "type": "result",
                "subtype": "success",
                "is_error": True,
                "result": "You've hit your limit",
                "session_id": session,
            }
        )
        return 1
    task = prompt.split("## Task", 1)[-1].strip().splitlines()[:1]
    for turn in range(1, args.turns + 1):
        time.sleep(args.interval)
        text = f"turn {turn} of {args.turns}: working on {task[0] if task else 'the task'!r}"
        say(
            {
                "type": "assistant",
                "session_id": session,
                "message": {
                    "id": f"msg_{session[:8]}_{turn}",
                    "role": "assistant",
                    "model": "stand-in",
                    "content": [{"type": "text", "text": text}],
                    "usage": {"input_tokens": args.tokens, "output_tokens": args.tokens // 10},
                },
            }
        )
    used = {
        "input_tokens": args.tokens * args.turns,
        "output_tokens": args.tokens // 10 * args.turns,
    }
    if args.fail:
        say(
            {
                "type": "result",
                "subtype": "error_during_execution",
                "is_error": True,
                "result": "the same failure again",
                "total_cost_usd": args.cost * args.turns,
                "usage": used,
                "session_id": session,
            }
        )
        return 1
    say(
        {
            "type": "result",
            "subtype": "success",
            "is_error": False,
            "result": "done",
            "total_cost_usd": round(args.cost * args.turns, 6),
            "usage": used,
            "session_id": session,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
