"""An agent-mode conversation: a model told the operations protocol, each reply run by the ops
runtime and answered with its events, turn after turn, until the model says only messages.

The transport is a seam (`ask`: the messages so far in, the reply's text out), so the loop knows
nothing of HTTP. Nothing the model sends raises: a reply that is not an operations message is
handed to the runtime as text, which answers it with an error event the model can correct.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TextIO

from runagent.ops import Approvals
from runagent.ops.event import EventsMessage
from runagent.ops.policy import Decision, Policy, Verdict
from runagent.ops.protocol import EventType, OperationType, Status
from runagent.ops.runtime import Runtime
from runagent.ops.waiting import HEARTBEAT_MAX, HEARTBEAT_MIN, Waiter
from runagent.record import record

Chat = list[dict[str, str]]
Ask = Callable[[Chat], str]


SYSTEM_PROMPT = """\
You are an agent that acts in a workspace folder through the operations protocol, version 1.0.
You cannot run anything yourself: each of your replies is ONE JSON operations message, and
nothing else (no prose around it), of this form:

{"protocolVersion": "1.0", "operations": [OPERATION, ...]}

The six operations (`id` is optional on each; give one to match events to operations):
- {"type": "message", "content": "text for the user"}
- {"type": "createFile", "path": "rel/path", "content": "...", "encoding": "utf-8" or "base64",
   "overwrite": false}   (parent folders are created; overwrite defaults to false)
- {"type": "readFile", "path": "rel/path", "encoding": "utf-8" or "base64"}
- {"type": "editFile", "path": "rel/path", "edits": [{"oldContent": "...", "newContent": "..."}]}
   (each edit replaces the first occurrence; if one fails, the file is unchanged)
- {"type": "deleteFile", "path": "rel/path"}   (files only)
- {"type": "shell", "command": "...", "cwd": "rel/dir", "timeout": 30000, "env": {"K": "V"}}
   (bash, in the workspace; timeout in milliseconds, 1000 to 3600000)

Paths are relative to the workspace, without `..` and without a leading `/`. Operations run in
order, and each gets one event. The reply to your message is an events message:
{"protocolVersion": "1.0", "runId": "...", "status": "completed" | "awaiting_approval" | "error",
 "events": [...]}. Read it: a failed operation has "success": false and an "error"; a
`policyDenied` event says an operation was not allowed, why, and what to do instead; an `error`
event (category "validation") says what was wrong with your message.

Work in steps: act, read the events, act again. When the task is done, reply with a message
made of `message` operations only, saying what you did: that ends the conversation, and its
content is your final answer."""

FENCED = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n(.*?)\n?```", re.DOTALL)


@record
class Outcome:
    """How a conversation ended: `finished` with the model's final message, or not (why)."""

    finished: bool
    turns: int
    answer: str


def system_prompt(workspace: Path, max_turns: int) -> str:
    return (
        f"{SYSTEM_PROMPT}\n\nThe workspace is {workspace}. You have at most {max_turns} "
        "replies; finish before then."
    )


def operations_of(reply: str) -> object | None:
    """The JSON value a reply holds: the whole reply, else a fenced ```json block, else the
    outermost braces; None when there is none."""
    text = reply.strip()
    candidates = [text, *(m.group(1) for m in FENCED.finditer(reply))]
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        candidates.append(text[first : last + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)  # type: ignore[no-any-return]
        except (ValueError, RecursionError):
            continue
    return None


def final_message(value: object) -> str | None:
    """The text of a batch made of `message` operations only; None for any other batch."""
    if not isinstance(value, dict) or value.get("protocolVersion") != "1.0":
        return None
    operations = value.get("operations")
    if not isinstance(operations, list) or not operations:
        return None
    texts = []
    for op in operations:
        if not isinstance(op, dict) or op.get("type") != OperationType.MESSAGE.value:
            return None
        content = op.get("content")
        if not isinstance(content, str):
            return None
        texts.append(content)
    return "\n\n".join(texts)


@record
class DenyingApprovals(Policy):
    """A policy for unattended runs that nobody answers: what needs approval is denied, and the
    denial says which rule asked for a person and that none is there."""

    def check_command(self, command: str, env: Mapping[str, str] | None = None) -> Decision:
        return _unattended(super().check_command(command, env))

    def check_path(self, operation: str, path: str) -> Decision:
        return _unattended(super().check_path(operation, path))


def _acknowledged(events: EventsMessage) -> bool:
    """Whether every operation of a batch of messages was taken as a message."""
    message = EventType.MESSAGE.value
    return events.status is Status.COMPLETED and all(e["type"] == message for e in events.events)


def _unattended(decision: Decision) -> Decision:
    if decision.verdict is not Verdict.APPROVE:
        return decision
    return Decision(
        Verdict.DENY,
        decision.rule,
        f"{decision.reason}; it needs a person's approval (rule {decision.rule}), and this run "
        "is unattended (ops.approvals: deny)",
        decision.suggestion or "Do it another way that needs no approval, or leave it out.",
    )


def unattended_policy(policy: Policy) -> Policy:
    return DenyingApprovals(policy.name, policy.rules)


class Conversation:
    """One agent-mode run: the model, the runtime of the run folder, and the turns between."""

    def __init__(
        self, runtime: Runtime, ask: Ask, *, max_turns: int, approvals: Approvals,
        say: TextIO, heartbeat: float = HEARTBEAT_MAX,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """`say` is where a person watching reads progress and pauses (the run's stderr);
        `heartbeat` how often a wait for approval says it is still waiting."""
        self.runtime = runtime
        self.ask = ask
        self.max_turns = max_turns
        self.approvals = approvals
        self.say = say
        self.heartbeat = min(max(heartbeat, HEARTBEAT_MIN), HEARTBEAT_MAX)
        self._waiter = Waiter(runtime, self._line, self.heartbeat, sleep, monotonic)

    def run(self, task: str) -> Outcome:
        chat: Chat = [
            {
                "role": "system",
                "content": system_prompt(self.runtime.workspace.root, self.max_turns),
            },
            {"role": "user", "content": task},
        ]
        for turn in range(1, self.max_turns + 1):
            reply = self.ask(chat)
            chat.append({"role": "assistant", "content": reply})
            value = operations_of(reply)
            events = (
                self.runtime.receive_text(reply) if value is None else self.runtime.receive(value)
            )
            if events.status is Status.AWAITING_APPROVAL and self.runtime.pending is not None:
                events = self._resolve(events)
            self._report(turn, events)
            answer = final_message(value)
            if answer is not None and _acknowledged(events):
                return Outcome(True, turn, answer)
            chat.append({"role": "user", "content": json.dumps(events.to_dict())})
        return Outcome(
            False,
            self.max_turns,
            f"max_turns {self.max_turns} reached: the model had not finished with a message",
        )

    def _resolve(self, events: EventsMessage) -> EventsMessage:
        return self._waiter.resolve(events, self.approvals)

    def _report(self, turn: int, events: EventsMessage) -> None:
        for e in events.events:
            subject = e.get("path") or e.get("command") or e.get("message") or e.get("reason")
            ok = e.get("success")
            mark = "" if ok is None else (" ok" if ok else f" failed: {e.get('error', '')}")
            self._line(f"turn {turn}: {e.get('type')}" + (f" {subject}" if subject else "") + mark)

    def _line(self, text: str) -> None:
        self.say.write(f"run-agent: {text}\n")
        self.say.flush()
