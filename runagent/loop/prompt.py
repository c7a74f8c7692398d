"""What an agent is told at each run: where it is, how to finish, how the run before it ended.

The text goes to the run's prompt.md: a preamble with the ids and folders, the completion rule's
sentence, then, after a run of the same task, the end of that run's output and stderr, and last
the task itself. The earlier run's text is the agent's own output, so it is redacted before it is
shown again.
"""

from __future__ import annotations

import re

from runagent.loop.completion import CompletionRule
from runagent.loop.context import LoopRequest
from runagent.loop.redaction import Redactor
from runagent.store import runfolder
from runagent.store.runinfo import RunInfo

TAIL_BYTES = 3000  # of the previous run's output and of its stderr


def compose(
    request: LoopRequest,
    rule: CompletionRule,
    redactor: Redactor,
    *,
    run_id: str,
    attempt: int,
    previous: RunInfo | None,
    first_attempt: int = 1,
) -> str:
    """The prompt of run `run_id`, attempt number `attempt` of the loop `request` describes,
    whose first attempt was number `first_attempt` (numbers go on across a task's loops)."""
    task = request.task
    lines = [
        "# run-agent",
        "",
        f"You are running under run-agent: project `{task.project_id}`, task "
        f"`{task.task_id}`, run `{run_id}`, attempt {attempt} of at most "
        f"{first_attempt + request.settings.max_restarts}.",
        f"- Task folder: {task.folder} (TASK.md there holds the task)",
        f"- Run folder: {task.run_folder(run_id)}",
        f"- Working folder: {request.working_dir}",
        rule.instruction,
        "If you cannot finish, exit with a non-zero code; you may be restarted with this note.",
    ]
    if previous is not None:
        later = attempt > first_attempt
        lines += ["", redactor("\n".join(_previous_section(request, later, previous)))]
    lines += ["", "## Task", "", request.prompt]
    return "\n".join(lines) + "\n"


def _previous_section(request: LoopRequest, later: bool, previous: RunInfo) -> list[str]:
    # The first attempt of a loop can follow a run of an earlier loop of the same task.
    heading = "## Previous attempt" if later else "## Previous run of this task"
    lines = [
        heading,
        "",
        f"Run `{previous.run_id}` (attempt {previous.attempt}) ended "
        f"{previous.status.value}: {previous.describe()}.",
    ]
    paths = request.task.run(previous.run_id)
    for title, path in (("output", paths.output), ("stderr", paths.stderr)):
        text = runfolder.tail(path, TAIL_BYTES).strip("\n")
        if text:
            fence = _fence(text)
            lines += ["", f"The end of its {title}:", "", fence, text, fence]
    return lines


def _fence(text: str) -> str:
    """A Markdown fence longer than any run of backticks inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)
