"""The paste backend: an agent run through any chat window, with no API key, by the copy-paste
protocol (spec/copy-paste-protocol.md; runagent/paste/).

Like the HTTP backends it is a child process the supervisor starts, times out and stops:
`python -m backends.paste RUN_FOLDER`. The child writes the outbox, waits for the person's reply in
the task's paste/inbox/, carries out its commands in the working folder through the operations
runtime, and ends when a reply says DONE, whose summary becomes output.md. Waiting for a person is
not an idle agent: the wait says so on stderr often enough for the idle timeout, and only
`paste.wait` bounds it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

from runagent.backend import (
    ChildBackend,
    Finding,
    LaunchSpec,
    Reason,
    RunContext,
    RunPaths,
    TaskPaths,
    atomic_write,
    report_failure,
)

# The line the channel prints for each outbox; only a file of a paste outbox folder is copied.
OUTBOX_READY = re.compile(r"outbox \d+ ready: (/.+/paste/outbox/[0-9a-f]{8}_seq\d{4}\.txt) \(")
# The exit code of a run that waited past paste.wait: one of the loop's non-retryable codes, as
# a restart would only wait for the same person again.
GAVE_UP = 2


class PasteBackend(ChildBackend):
    """A person between run-agent and a chat model, carrying text both ways."""

    name = "paste"
    talks_to_person = True

    def terminal_copy(self, line: str, run_folder: Path) -> str | None:
        """Each outbox of this run's task, as its line says it is ready (the terminal's
        clipboard over SSH); a path anywhere else is never read."""
        if not self.config.paste.clipboard:
            return None
        found = OUTBOX_READY.match(line)
        if found is None:
            return None
        from runagent.paste.session import PASTE, Folders

        path = Path(found.group(1))
        task_folder = run_folder.parent.parent  # TASK/runs/RUN
        if path.parent != Folders(task_folder / PASTE).outbox:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
            return f.read()

    def launch(self, ctx: RunContext) -> LaunchSpec:
        env = self.environment(ctx)
        env["RUN_AGENT_OPS"] = json.dumps(self.config.ops.to_dict())
        env["RUN_AGENT_PASTE"] = json.dumps(self.config.paste.to_dict())
        return LaunchSpec(self.child_argv(ctx), env, ctx.working_dir, stdin=None)

    def check(self) -> list[Finding]:
        return [Finding(True, "paste needs no key: a person carries the text to a chat window")]


def main(argv: list[str]) -> int:
    from runagent.errors import RunAgentError
    from runagent.ops import Approvals
    from runagent.ops.policy import Policy
    from runagent.ops.runtime import Runtime
    from runagent.ops.sandbox import Sandbox
    from runagent.ops.waiting import HEARTBEAT_MAX, Waiter
    from runagent.paste import clipboard
    from runagent.paste.apply import Applier
    from runagent.paste.channel import HEARTBEAT, Channel, WaitExpired, for_person
    from runagent.paste.session import Folders

    if len(argv) != 1:
        print("usage: python -m backends.paste RUN_FOLDER", file=sys.stderr)
        return 2
    run = RunPaths(Path(argv[0]))
    env = os.environ
    task = TaskPaths(Path(env["JRUN_RUNS_DIR"]), env["JRUN_PROJECT_ID"], env["JRUN_TASK_ID"])
    try:
        text = task.task_md.read_text(encoding="utf-8")
    except OSError:
        text = run.prompt.read_text(encoding="utf-8")
    idle = float(env.get("RUN_AGENT_IDLE_TIMEOUT") or 0)

    def tell(line: str) -> None:  # for the person at the terminal, which echoes stdout
        sys.stdout.write(for_person(line))
        sys.stdout.flush()

    def say(line: str) -> None:  # kept in the run's stderr: it shows the wait is alive
        print(f"run-agent: {line}", file=sys.stderr, flush=True)

    try:
        ops = json.loads(env.get("RUN_AGENT_OPS") or "{}")
        paste = json.loads(env.get("RUN_AGENT_PASTE") or "{}")
        policy = Policy.from_config(ops)
        runtime = Runtime.create(
            run.folder, Path.cwd(), policy.name, Sandbox(ops.get("sandbox", "auto")),
            rules=ops.get("rules"), shell="/bin/sh", policy=policy,
        )  # fmt: skip
    except (RunAgentError, ValueError, TypeError, AttributeError) as exc:
        report_failure(Reason.EXIT_CODE, f"the paste channel cannot start: {exc}")
        return 2
    # The person is right there: what the policy holds for approval waits for their answer.
    beat = min(idle / 3, HEARTBEAT_MAX) if idle else HEARTBEAT_MAX
    waiter = Waiter(runtime, tell, beat, beat=say)
    applier = Applier(runtime, lambda events: waiter.resolve(events, Approvals.WAIT))

    def announce(path: Path, outbox: str) -> None:
        if paste.get("clipboard", True) and (tool := clipboard.copy(outbox)):
            print(f"(copied to the clipboard with {tool})", flush=True)

    channel = Channel(
        Folders.of(task), applier, text, out=sys.stdout, err=sys.stderr,
        wait=paste.get("wait"), heartbeat=min(idle / 3, HEARTBEAT) if idle else HEARTBEAT,
        announce=announce, output=run.output,
    )  # fmt: skip
    try:
        ended = channel.run()
    except WaitExpired as exc:
        report_failure(Reason.EXIT_CODE, str(exc))
        return GAVE_UP
    if not run.output.exists():  # the channel writes it; a session found complete has not
        atomic_write(run.output, (ended.summary or "(DONE without a summary)") + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
