"""What an agent is told at each run: where it is, how to finish, how the run before it ended.

The text goes to the run's prompt.md: a preamble with the ids and folders, the completion rule's
sentence, then, after a run of the same task, the end of that run's output and stderr (and, when
it said it was done and the task's check failed, the check's command and the end of its output),
and last the task itself. An attempt that continues the agent's session (`session: continue`)
is told all but the task, which its session holds already. The earlier run's text is the
agent's own output (and the check's, of the agent's code), so it is redacted before it is shown
again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from runagent.loop.completion import CompletionRule
from runagent.loop.context import LoopRequest
from runagent.loop.redaction import Redactor
from runagent.store import runfolder
from runagent.store.runinfo import Reason, RunInfo
from runagent.store.steering import Message

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
    messages: Sequence[Message] = (),
    spare: int = 0,
    continued: bool = False,
) -> str:
    """The prompt of run `run_id`, attempt number `attempt` of the loop `request` describes,
    whose first attempt was number `first_attempt` (numbers go on across a task's loops), with
    the `messages` a person sent it since the last attempt (after the run before's tail: the
    new text a continued session is given); `spare` attempts spent no restart; `continued`:
    the run resumes `previous`'s session, so the task is not told again."""
    task = request.task
    lines = [
        "# run-agent",
        "",
        f"You are running under run-agent: project `{task.project_id}`, task "
        f"`{task.task_id}`, run `{run_id}`, attempt {attempt} of at most "
        f"{first_attempt + request.settings.max_restarts + spare}.",
        f"- Task folder: {task.folder} (TASK.md there holds the task)",
        f"- Run folder: {task.run_folder(run_id)}",
        f"- Working folder: {request.working_dir}",
        rule.instruction,
        "If you cannot finish, exit with a non-zero code; you may be restarted with this note.",
    ]
    if continued and previous is not None:
        lines += [
            f"This continues your session of run `{previous.run_id}`: the task is the one you "
            "were given there (TASK.md holds it)."
        ]
    if previous is not None:
        later = attempt > first_attempt
        lines += ["", redactor("\n".join(_previous_section(request, later, previous)))]
    if request.worktree is not None:  # a rebase its agent has to finish
        lines += _rebase_section(request, redactor)
    if messages:
        lines += ["", *steering_section(messages)]
    if not (continued and previous is not None):
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
    if previous.reason is Reason.CHECK_FAILED and previous.check_command:
        lines += [
            "",
            f"It said the task was done, but the check `{previous.check_command}` failed (exit "
            f"code {previous.check_exit_code}): the task is done only when that check passes "
            "in the working folder.",
        ]
        text = runfolder.tail(paths.check, TAIL_BYTES).strip("\n")
        if text:
            fence = _fence(text)
            lines += ["", "The end of the check's output:", "", fence, text, fence]
    for title, path in (("output", paths.output), ("stderr", paths.stderr)):
        text = runfolder.tail(path, TAIL_BYTES).strip("\n")
        if text:
            fence = _fence(text)
            lines += ["", f"The end of its {title}:", "", fence, text, fence]
    return lines


def _rebase_section(request: LoopRequest, redactor: Redactor) -> list[str]:
    """What the attempt is told of a `run-agent rebase` of its worktree it has to finish: the
    files git stopped on, or the check that fails on the merge (and the end of its output)."""
    from runagent.issues import rebasing
    from runagent.issues.repository import short

    found = rebasing.pending(request.task)
    if found is None:
        return []
    merged = f"The branch `{found.onto}` ({short(found.commit)}) was merged into this branch"
    if found.state == rebasing.CONFLICT:
        return [
            "",
            "## Conflicts to resolve",
            "",
            f"{merged}, and git stopped on conflicts in these files:",
            "",
            *(f"- `{name}`" for name in found.files),
            "",
            "Resolve each conflict (remove every `<<<<<<<`, `=======` and `>>>>>>>` marker, "
            "keeping what both sides meant), then `git add` the files and `git commit` to "
            "conclude the merge. The task is done only when no conflict marker is left and the "
            "merge is committed, as well as by the completion rule above.",
        ]
    lines = [
        "",
        "## The check fails after a merge",
        "",
        f"{merged} without conflicts, but the task's check `{found.check}` fails on the "
        "result: make it pass.",
    ]
    text = redactor(runfolder.tail(request.task.check, TAIL_BYTES).strip("\n"))
    if text:
        fence = _fence(text)
        lines += ["", "The end of the check's output:", "", fence, text, fence]
    return lines


def steering_section(messages: Sequence[Message]) -> list[str]:
    """A person's words to this attempt, as they wrote them (a person, not the agent: shown
    whole and not redacted)."""
    many = len(messages) > 1
    lines = [
        "## From a person",
        "",
        f"A person overseeing this task sent {'these messages' if many else 'this message'} "
        "for this attempt; follow them where they change what to do:",
    ]
    for message in messages:
        text = message.text.strip("\n")
        fence = _fence(text)
        lines += ["", f"Sent {message.at}:" if many else f"(sent {message.at})", "", fence, text,
                  fence]  # fmt: skip
    return lines


def _fence(text: str) -> str:
    """A Markdown fence longer than any run of backticks inside `text`."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)
