"""The agent-mode conversation in process: replies read leniently, nothing a model says raises."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runagent.ops import Approvals
from runagent.ops.conversation import Conversation, final_message, operations_of, unattended_policy
from runagent.ops.policy import Policy, Verdict
from runagent.ops.runtime import Runtime

DONE = '{"protocolVersion": "1.0", "operations": [{"type": "message", "content": "done"}]}'


@pytest.mark.parametrize(
    "reply",
    [
        DONE,
        f"  {DONE}\n",
        f"```json\n{DONE}\n```",
        f"Here it is:\n```\n{DONE}\n```\nThat is all.",
        f"Sure. {DONE} Hope it helps.",
    ],
)
def test_an_operations_message_is_found_plain_or_fenced(reply: str) -> None:
    assert final_message(operations_of(reply)) == "done"


@pytest.mark.parametrize(
    "value",
    [None, [], {}, {"protocolVersion": "1.0", "operations": []}, {"operations": [{"type": "message",
     "content": "x"}]}, {"protocolVersion": "1.0", "operations": [{"type": "message"}]},
     {"protocolVersion": "1.0", "operations": [{"type": "shell", "command": "ls"}]}],
)  # fmt: skip
def test_only_a_batch_of_messages_is_final(value: object) -> None:
    assert final_message(value) is None


def runtime(tmp_path: Path, policy: Policy | None = None) -> Runtime:
    (tmp_path / "work").mkdir(exist_ok=True)
    kw = {} if policy is None else {"policy": policy}
    return Runtime.create(tmp_path / "run", tmp_path / "work", "standard", **kw)


def test_junk_replies_are_answered_and_the_conversation_goes_on(tmp_path: Path) -> None:
    junk = [
        "",
        "[]",
        "null",
        "{",
        '{"protocolVersion": "1.0"}',
        "\ud800",
        '"text"',
        "1e999",
        '{"protocolVersion": "1.0", "operations": [{"type": "createFile"}]}',
        "[" * 5000,
    ]
    replies = iter([*junk, DONE])
    seen: list[list[dict[str, str]]] = []

    def ask(chat: list[dict[str, str]]) -> str:
        seen.append(list(chat))
        return next(replies)

    say = io.StringIO()
    outcome = Conversation(
        runtime(tmp_path), ask, max_turns=20, approvals=Approvals.DENY, say=say
    ).run("task")
    assert outcome.finished and outcome.answer == "done" and outcome.turns == len(junk) + 1
    for chat in seen[1:]:
        answer = json.loads(chat[-1]["content"])
        assert answer["events"] and answer["events"][0]["type"] == "error"


def test_an_unattended_policy_denies_what_needs_approval_and_says_which_rule() -> None:
    policy = unattended_policy(Policy.preset("standard"))
    decision = policy.check_command("ls && rm -r build")
    assert decision.verdict is Verdict.DENY
    assert "rm -r" in decision.rule and "ops.approvals: deny" in decision.reason
    assert policy.check_command("ls").verdict is Verdict.ALLOW
    assert policy.check_command("sudo ls").verdict is Verdict.DENY
